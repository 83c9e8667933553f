"""SEC-20, SEC-21: every body the service reads is bounded before it is parsed, and a client
that goes away mid-body is not an error.

Requests go straight to ASGI with a body that never ends (chunk after chunk of ``&``, the
separator a form parser walks): a route may read at most SCHEDULER_MAX_BODY_BYTES (the bulk
route: SCHEDULER_BULK_MAX_BODY_BYTES) and one chunk of it before answering 413, and with a
Content-Length over the limit it reads none.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.types import Message

from scheduler.service import SchedulerService
from tests.security.hostile import DEADLINE, Target, call, targets
from tests.security.test_hostile_input import console_session

CHUNK = 16 * 1024
ENDLESS = 32 * 1024 * 1024  # past every route's limit, the bulk route's 8 MiB too
BATCH = "/admin/scheduled-events/bulk"
FORM = (b"content-type", b"application/x-www-form-urlencoded")
JSON = (b"content-type", b"application/json")


@dataclass
class Upload:
    """What one raw request with an endless (or abandoned) body came to."""

    status: int = 0
    read: int = 0  # body bytes the app asked for
    error: BaseException | None = None
    headers: dict[str, str] = field(default_factory=dict)


async def _upload(service: SchedulerService, target: Target, headers: list[tuple[bytes, bytes]], *,
                  declared: int | None = None, abandon_after: int | None = None) -> Upload:
    """Send ``target`` a body of ``&`` without end (``declared``: with that Content-Length);
    ``abandon_after`` chunks: then the client disconnects."""
    if declared is not None:
        headers = [*headers, (b"content-length", str(declared).encode())]
    else:
        headers = [*headers, (b"transfer-encoding", b"chunked")]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": target.method,
        "scheme": "http", "path": target.path, "raw_path": target.path.encode(), "root_path": "",
        "query_string": target.finite, "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 1), "server": ("testserver", 80),
    }
    upload = Upload()
    answered = asyncio.Event()
    chunks = 0

    async def receive() -> Message:
        nonlocal chunks
        if answered.is_set() or (abandon_after is not None and chunks >= abandon_after):
            return {"type": "http.disconnect"}
        await asyncio.sleep(0)  # a network read yields to the loop: the deadline can fire
        chunks += 1
        upload.read += CHUNK
        # "without end", up to a bound: an app that reads it all fails at once, not at the deadline
        return {"type": "http.request", "body": b"&" * CHUNK, "more_body": upload.read < ENDLESS}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            upload.status = message["status"]
            upload.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.set()

    try:
        await asyncio.wait_for(service.app(scope, receive, send), timeout=DEADLINE)
    except Exception as exc:  # noqa: BLE001 - what escaped the app is the finding
        upload.error = exc
    return upload


def _with_credentials(service: SchedulerService, target: Target) -> list[tuple[bytes, bytes]]:
    media = FORM if target.is_console else JSON
    return [*target.credentials(console_session(service)), media]


def _body_routes(service: SchedulerService) -> list[Target]:
    found = [t for t in targets(service.app.routes) if t.method in ("POST", "PUT", "PATCH")]
    assert len(found) >= 12, [t.label for t in found]
    return found


@pytest.mark.clause("SEC-20")
def test_no_route_reads_more_than_the_body_limit_whether_declared_or_chunked(service: SchedulerService) -> None:
    """SEC-20: on every route that takes a body (the API's JSON, the console's and the
    inbox's forms), a body over SCHEDULER_MAX_BODY_BYTES is a 413: a Content-Length over
    the limit before a byte is read, a chunked body as soon as the bytes read pass it."""
    refused = []
    for target in _body_routes(service):
        # the bulk route has a bound of its own, sized for many events (BATCH-1)
        limit = service.settings.bulk_max_body_bytes if target.template == BATCH else service.settings.max_body_bytes
        headers = _with_credentials(service, target)
        chunked = asyncio.run(_upload(service, target, headers))
        assert chunked.error is None, f"{target.label}: {chunked.error!r}"
        assert chunked.read <= limit + CHUNK, f"{target.label} read {chunked.read} bytes of a chunked body"
        declared = asyncio.run(_upload(service, target, headers, declared=50 * 1024 * 1024))
        assert declared.error is None, f"{target.label}: {declared.error!r}"
        assert declared.read == 0 or declared.status != 413, target.label
        if chunked.status == 413:
            assert declared.status == 413, f"{target.label}: {declared.status}"
            refused.append(target.label)
    # every route that reads a body refused it: the forms as much as the JSON
    expected = {"POST /console/sign-in", "POST /console/sign-out", "POST /console/bulk-reset",
                "POST /console/bulk-cancel", "POST /console/events/some-id/reset",
                "POST /console/events/some-id/cancel", "POST /console/sessions/some-id/end",
                "POST /admin/scheduled-events", "POST /admin/ingest-event", "POST /inbox/session",
                "POST /admin/scheduled-events/bulk",
                "PUT /admin/participants/some-id/preferences"}
    assert expected <= set(refused), sorted(expected - set(refused))


@pytest.mark.clause("SEC-20")
def test_a_form_with_more_fields_than_any_console_form_is_a_422_without_walking_them(
    service: SchedulerService,
) -> None:
    """SEC-20: under the byte limit, a form of thousands of empty fields is refused by count."""
    target = next(t for t in targets(service.app.routes) if t.label == "POST /console/sign-in")
    answer = call(service.app, "POST", target.path, b"", [FORM], b"&" * (service.settings.max_body_bytes - 1))
    assert answer.error is None, repr(answer.error)
    assert answer.status == 422, (answer.status, answer.text[:300])
    assert "fields" in answer.text


@pytest.mark.clause("SEC-21")
def test_a_client_that_disconnects_mid_body_is_not_logged_as_an_error(
    service: SchedulerService, caplog: pytest.LogCaptureFixture
) -> None:
    """SEC-21: on every route that reads a body, a client gone before its body ended leaves
    no ERROR record and no exception out of the app: nobody is left to answer."""
    caplog.set_level(logging.INFO)
    for target in _body_routes(service):
        upload = asyncio.run(_upload(service, target, _with_credentials(service, target), abandon_after=1))
        assert upload.error is None, f"{target.label}: {upload.error!r}"
        assert upload.status != 500, target.label
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [(r.name, r.getMessage()[:200]) for r in errors]
    assert any("disconnected" in r.getMessage() for r in caplog.records)
