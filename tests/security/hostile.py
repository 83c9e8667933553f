"""Raw requests for the hostile-input tests: bytes as a stranger sends them, straight to ASGI.

An HTTP client normalises what it sends (it re-encodes a stray ``%``, refuses control
characters in a header); the app must not rely on that, so these requests skip it: the
query string and the headers reach the app byte for byte. A request whose answer has not
finished within ``DEADLINE`` seconds fails (an accepted stream never ends), so a bug fails
fast rather than hanging the suite.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from starlette.routing import Route
from starlette.types import ASGIApp, Message

from scheduler.web.http.params import Param, declared
from tests.conftest import ADMIN, INGEST, PARTICIPANT

DEADLINE = 10.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    error: BaseException | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass(frozen=True)
class Target:
    """One route and method as the fuzz calls it: a concrete path and the caller's headers."""

    method: str
    path: str
    permission: str
    template: str
    params: dict[str, Param] = field(hash=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def is_console(self) -> bool:
        return self.path.startswith("/console")

    @property
    def finite(self) -> bytes:
        """A query that keeps a stream route from streaming for ever: another participant's
        inbox (403 for a participant), one console overview (``once``); empty elsewhere."""
        return {"/me/notifications/stream": b"user_id=someone-else", "/console/stream": b"once=1"}.get(self.path, b"")

    def credentials(self, console_session: str) -> list[tuple[bytes, bytes]]:
        """Headers of a caller the route lets through, so that the parameters are reached.

        The console's pages get the cookie of ``console_session`` (an open admin session's
        secret); the participant routes get a participant token: a valid ``user_id`` other
        than its own is then a 403 rather than a stream that never ends."""
        if self.permission == "console":
            return [(b"cookie", f"scheduler_console={console_session}".encode())]
        bearer = {"admin": ADMIN, "ingest": INGEST, "participant": PARTICIPANT}.get(self.permission)
        return [] if bearer is None else [(b"authorization", bearer["Authorization"].encode())]


def targets(routes: list[Any]) -> Iterator[Target]:
    """Every method of every route, with its declared query parameters."""
    for route in routes:
        assert isinstance(route, Route)
        params = declared(route.endpoint)
        assert params is not None, f"{route.path} declares no query parameters (use @declares())"
        for method in sorted((route.methods or set()) - {"HEAD"}):
            yield Target(method, re.sub(r"\{[^}]+\}", "some-id", route.path),
                         getattr(route.endpoint, "permission", "open"), route.path_format, dict(params))


async def _call(app: ASGIApp, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                body: bytes = b"") -> Answer:
    raw_path = path.encode("latin-1")
    # The path as uvicorn decodes the raw one: percent-decoded, bytes not UTF-8 as U+FFFD.
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": unquote(path), "raw_path": raw_path, "root_path": "", "query_string": query,
        "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 1), "server": ("testserver", 80),
    }
    sent = False
    done = asyncio.Event()
    answer = Answer(0, {}, b"")

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # bounded: the wait_for(DEADLINE) around the app's call
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            answer.body += message.get("body", b"")
            if not message.get("more_body", False):
                done.set()

    try:
        await asyncio.wait_for(app(scope, receive, send), timeout=DEADLINE)
    except TimeoutError:
        answer.error = TimeoutError(f"{method} {path}?{query!r}: no complete answer within {DEADLINE} s")
    except Exception as exc:  # noqa: BLE001 - the server error the app raised after (or instead of) its 500
        answer.error = exc
        answer.status = answer.status or 500
    return answer


def call(app: ASGIApp, method: str, path: str, query: bytes = b"",
         headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"") -> Answer:
    """One raw request to ``app``, answered within ``DEADLINE`` seconds. ``path`` is the raw
    path, percent-encoding and all (ASCII, or bytes as latin-1)."""
    return asyncio.run(_call(app, method, path, query, headers or [], body))


def batch_bodies(valid: dict[str, Any]) -> Iterator[tuple[str, bytes, int]]:
    """Hostile bodies for ``POST /admin/scheduled-events/bulk`` (label, bytes, the status
    expected): an empty array, non-arrays, items of every wrong shape, more items than the
    bound, and one item past the single POST's body bound."""
    def dumped(value: Any) -> bytes:
        return json.dumps(value).encode()

    yield "empty array", b"[]", 200
    for label, raw in [("object", dumped(valid)), ("string", b'"x"'), ("number", b"1"), ("null", b"null"),
                       ("true", b"true"), ("not JSON", b"[{"), ("NaN", b"[NaN]"), ("empty body", b""),
                       ("not UTF-8", b'["' + bytes([0xFF, 0xFE]) + b'"]'),
                       ("deeply nested", b"[" * 100_000 + b"]" * 100_000)]:
        yield label, raw, 422
    wrong_items: list[Any] = [
        None, 0, -1, 1e308, True, "event", "", [], [valid], {}, {"event_type": None},
        {**valid, "event_type": 7}, {**valid, "user_id": ""}, {**valid, "user_id": "x" * 201},
        {**valid, "trigger_at": None}, {**valid, "trigger_at": "2026-13-40T99:99:99Z"},
        {**valid, "trigger_at": "0001-01-01T00:00:00Z"}, {**valid, "trigger_at": "2026-11-30T09:00:00"},
        {**valid, "facts": []}, {**valid, "facts": "x"}, {**valid, "facts": {}},
        {**valid, "facts": {**valid["facts"], "scenario": "\u0000"}},
        {**valid, "facts": {**valid["facts"], "nested": _nested(40)}},
        {**valid, "external_key": ""}, {**valid, "external_key": "\ud800"}, {**valid, "extra": 1},
    ]
    yield "items of every wrong shape", dumped([*wrong_items, valid]), 200
    yield "10,001 items", dumped([valid] * 10_001), 413
    huge = {**valid, "facts": {**valid["facts"], "padding": "x" * 200_000}}
    yield "one huge item", dumped([valid, huge]), 200


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value
