"""The outbox on the console and the admin API (OUTBOX-9..11), on real PostgreSQL.

Rows reach ``retrying`` and ``undeliverable`` the way production gets them there: a sent
notification queued on a host channel, and the delivery worker recording what a fake provider
(``ScriptedSender``, the edge) answered.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.application import deliveries
from scheduler.application.commands import Actor
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.types import Delivered, Retry, Undeliverable
from tests.conftest import bearer
from tests.helpers import drain, post_event, rows
from tests.operations.support import csrf_of, sign_in
from tests.requirements.test_outbox import ScriptedSender, worker


@pytest.fixture
def outbox_service(settings: Settings, engine: Engine, clock: ManualClock,
                   publisher: RecordingPublisher) -> SchedulerService:
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False,
                            senders={"sms": ScriptedSender()})


@pytest.fixture
def console(outbox_service: SchedulerService) -> Iterator[TestClient]:
    with TestClient(outbox_service.app, raise_server_exceptions=True) as client:
        yield client


def failed_deliveries(client: TestClient, service: SchedulerService, clock: ManualClock,
                      *answers: Any) -> list[dict[str, Any]]:
    """One sent notification per answer, each delivery's first attempt answered by it: the sms rows."""
    for n in range(len(answers)):
        post_event(client, user_id=f"p-{n}")
    drain(service)
    asyncio.run(worker(service, ScriptedSender(*answers), clock).run_once())
    return sms_rows(service.engine)


def sms_rows(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM deliveries WHERE channel = 'sms' ORDER BY id")


def audit(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM operator_actions ORDER BY id")


@pytest.mark.clause("OUTBOX-9")
def test_the_console_lists_the_retrying_and_undeliverable_deliveries_by_filter(
    console: TestClient, outbox_service: SchedulerService, clock: ManualClock
) -> None:
    """OUTBOX-9: the deliveries page shows each retrying and undeliverable row with its last
    error and a retry-now form, never a queued or delivered one; the filters narrow it, and a
    status it cannot retry is the 422 page."""
    found = failed_deliveries(console, outbox_service, clock, Retry(reason="http 503"),
                              Undeliverable(reason="http 400: <bad>"), Delivered(status=200))
    assert [r["status"] for r in found] == ["retrying", "undeliverable", "delivered"]
    sign_in(console)
    page = console.get("/console/deliveries")
    assert page.status_code == 200
    listed = re.findall(r'<tr class="status-(\w+)" data-id="(\d+)">', page.text)
    assert sorted(listed) == sorted([("retrying", str(found[0]["id"])), ("undeliverable", str(found[1]["id"]))])
    assert "http 503" in page.text and "http 400: &lt;bad&gt;" in page.text  # escaped
    assert f'action="/console/deliveries/{found[0]["id"]}/retry"' in page.text
    only = console.get(f"/console/deliveries?status=undeliverable&channel=sms&user_id={found[1]['user_id']}")
    assert re.findall(r'data-id="(\d+)"', only.text) == [str(found[1]["id"])]
    assert re.findall(r'data-id="(\d+)"', console.get("/console/deliveries?user_id=nobody").text) == []
    assert console.get("/console/deliveries?status=delivered").status_code == 422


@pytest.mark.clause("OUTBOX-10")
def test_retry_now_queues_one_delivery_again_and_is_audited_from_the_console_and_the_api(
    console: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-10: retry-now (a CSRF-protected form) queues the undeliverable row again, due now,
    its attempts counted afresh and its key the same; the worker then delivers it. The API's
    ``POST /admin/deliveries/{id}/retry`` does the same for the retrying one; both are audited
    with who, from where and the delivery's id. A delivered row is a 409 (audited with count 0),
    an unknown id a 404, a form without the CSRF token a 403 that changes nothing."""
    retrying, undeliverable, delivered = failed_deliveries(
        console, outbox_service, clock, Retry(reason="http 503"), Undeliverable(reason="http 400"),
        Delivered(status=200))
    csrf = sign_in(console)
    refused = console.post(f"/console/deliveries/{undeliverable['id']}/retry", data={})
    assert refused.status_code == 403 and sms_rows(engine)[1]["status"] == "undeliverable"
    done = console.post(f"/console/deliveries/{undeliverable['id']}/retry", data={"csrf": csrf},
                        follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"].endswith(f"retried={undeliverable['id']}")
    again = sms_rows(engine)[1]
    assert (again["status"], again["attempts"], again["next_attempt_at"], again["idempotency_key"]) == (
        "queued", 0, clock.now(), undeliverable["idempotency_key"])
    answer = console.post(f"/admin/deliveries/{retrying['id']}/retry",
                          headers=bearer("nudging.admin", subject="ops-bob"))
    assert answer.status_code == 200 and answer.json()["status"] == "queued" and answer.json()["attempts"] == 0
    done = console.post(f"/admin/deliveries/{delivered['id']}/retry", headers=bearer("nudging.admin"))
    assert done.status_code == 409
    assert console.post("/admin/deliveries/999999/retry", headers=bearer("nudging.admin")).status_code == 404
    assert console.post("/admin/deliveries/abc/retry", headers=bearer("nudging.admin")).status_code == 404
    ingest_only = console.post(f"/admin/deliveries/{retrying['id']}/retry", headers=bearer("nudging.ingest"))
    assert ingest_only.status_code == 403
    trail = [(a["actor"], a["source"], a["action"], a["filter"], a["count"]) for a in audit(engine)]
    assert trail == [("operator-ann", "console", "retry_delivery", {"delivery_id": undeliverable["id"]}, 1),
                     ("ops-bob", "api", "retry_delivery", {"delivery_id": retrying["id"]}, 1),
                     ("local-operator", "api", "retry_delivery", {"delivery_id": delivered["id"]}, 0)]
    sender = ScriptedSender()
    asyncio.run(worker(outbox_service, sender, clock).run_once())
    assert sorted(d.idempotency_key for d in sender.sent) == sorted(
        [retrying["idempotency_key"], undeliverable["idempotency_key"]])
    assert [r["status"] for r in sms_rows(engine)] == ["delivered", "delivered", "delivered"]


@pytest.mark.clause("OUTBOX-10")
def test_a_delivery_a_worker_is_sending_right_now_is_not_retried(
    console: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-10: a retrying row claimed by a worker (its lease live) is left to that attempt:
    the retry is ``not_retryable`` and the row keeps its lease."""
    [retrying] = failed_deliveries(console, outbox_service, clock, Retry(reason="http 503"))
    clock.set(retrying["next_attempt_at"])
    [claimed] = worker(outbox_service, ScriptedSender(), clock).claim(1)
    done = deliveries.retry_delivery(outbox_service.database, int(claimed.delivery.delivery_id), now=clock.now(),
                                     actor=Actor("ops", "cli"))
    assert done.outcome == "not_retryable"
    [row] = sms_rows(engine)
    assert row["leased_by"] == "worker-a" and row["attempts"] == 2


@pytest.mark.clause("OUTBOX-11")
def test_bulk_retry_counts_first_needs_a_reason_and_retries_what_was_counted_audited(
    console: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-11: the bulk page's dry run counts the matching retrying and undeliverable rows;
    the POST needs the CSRF token and a reason, queues again at most what was counted (a row
    that changed since the dry run is left alone) and is one audit row with the filter, the
    reason and the count."""
    failed_deliveries(console, outbox_service, clock, Undeliverable(reason="http 400"),
                      Undeliverable(reason="http 401"), Retry(reason="http 503", retry_after=60.0))
    csrf = sign_in(console)
    dry = console.get("/console/bulk-retry?status=undeliverable")
    assert re.search(r'id="dry-run-count">2<', dry.text), dry.text
    as_of = re.search(r'name="as_of" value="([^"]+)"', dry.text)
    assert as_of
    form = {"status": "undeliverable", "as_of": as_of[1], "expected": "2"}
    assert console.post("/console/bulk-retry", data={**form, "reason": "provider fixed"}).status_code == 403
    no_reason = console.post("/console/bulk-retry", data={**form, "csrf": csrf, "reason": " "})
    assert no_reason.status_code == 422 and "needs a reason" in no_reason.text
    assert audit(engine) == []
    # one counted row changes after the dry run (retried alone, undeliverable again): left alone
    first = sms_rows(engine)[0]
    clock.advance(timedelta(seconds=1))
    deliveries.retry_delivery(outbox_service.database, first["id"], now=clock.now(), actor=Actor("ops", "cli"))
    asyncio.run(worker(outbox_service, ScriptedSender(Undeliverable(reason="http 400")), clock).run_once())
    assert sms_rows(engine)[0]["status"] == "undeliverable"
    done = console.post("/console/bulk-retry", data={**form, "csrf": csrf, "reason": "provider fixed"})
    assert done.status_code == 200 and re.search(r'id="bulk-retry-count">1<', done.text), done.text
    assert [r["status"] for r in sms_rows(engine)] == ["undeliverable", "queued", "retrying"]
    bulk = audit(engine)[-1]
    assert (bulk["action"], bulk["source"], bulk["filter"], bulk["count"], bulk["reason"]) == (
        "bulk_retry_deliveries", "console", {"status": "undeliverable"}, 1, "provider fixed")
    assert csrf_of(done.text)

