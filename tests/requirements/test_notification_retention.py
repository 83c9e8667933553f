"""RET-8, RET-9: old notifications go with their delivered rows; what did not get through stays.

With ``SCHEDULER_NOTIFICATION_RETENTION_DAYS`` set, retention's run deletes notifications older
than that with their deliveries (the in-app row and the delivered outbox rows) and a host
dispatcher's delivered outbox rows; a notification with a queued, retrying or undeliverable
delivery is kept with every row of it. By default every notification is kept. On real
PostgreSQL; the rows get their statuses from the delivery worker and a fake provider (the edge).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.operations.retention import Retention
from scheduler.service import SchedulerService
from scheduler.types import (
    Delivered,
    DigitalTwinEvent,
    DispatchOutcome,
    DispatchResult,
    OutboundMessage,
    Retry,
    Undeliverable,
)
from tests.helpers import drain, post_event, rows
from tests.requirements.test_outbox import ScriptedSender, worker


def outbox_service(settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher,
                   days: int, dispatcher: Any = None) -> SchedulerService:
    return SchedulerService(settings.model_copy(update={"notification_retention_days": days}), engine=engine,
                            clock=clock, publisher=publisher, run_scheduler=False, senders={"sms": ScriptedSender()},
                            dispatcher=dispatcher)


def sent(service: SchedulerService, clock: ManualClock, *answers: Any) -> dict[str, str]:
    """One notification per answer, its sms delivery's first attempt answered by it: the sms
    row's status after it -> the notification's id (a host's message id)."""
    with TestClient(service.app) as client:
        for n in range(len(answers)):
            post_event(client, user_id=f"u-{n}")
        drain(service)
    asyncio.run(worker(service, ScriptedSender(*answers), clock).run_once())
    return {r["status"]: r["notification_id"]
            for r in rows(service.engine, "SELECT status, notification_id FROM deliveries WHERE channel = 'sms'")}


def kept(engine: Engine) -> tuple[set[str], set[tuple[str, str, str]]]:
    notes = {r["id"] for r in rows(engine, "SELECT id FROM notifications")}
    deliveries = {(r["notification_id"], r["channel"], r["status"])
                  for r in rows(engine, "SELECT notification_id, channel, status FROM deliveries")}
    return notes, deliveries


@pytest.mark.clause("RET-8")
def test_old_notifications_go_with_their_delivered_rows_and_those_that_did_not_get_through_stay(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """RET-8: eleven days on, with 10 days: the delivered notification goes with its in-app and sms
    rows; the undeliverable and the retrying ones stay with every row; a younger delivered one
    stays; the deduplication keys stay."""
    service = outbox_service(settings, engine, clock, publisher, days=10)
    ids = sent(service, clock, Delivered(status=200), Undeliverable(reason="http 400"),
               Retry(reason="http 503", retry_after=3600.0))
    clock.advance(timedelta(days=5))
    young = post_later(service, clock)
    keys = rows(engine, "SELECT key FROM dedup_keys ORDER BY key")
    clock.advance(timedelta(days=6))
    report = service.retention.run_if_due()
    assert report is not None and report.done
    assert (report.notifications_deleted, report.deliveries_deleted) == (1, 2)
    notes, deliveries = kept(engine)
    assert notes == {ids["undeliverable"], ids["retrying"], young}
    assert {(n, c, s) for n, c, s in deliveries if n == ids["delivered"]} == set()
    for status in ("undeliverable", "retrying"):
        assert {(ids[status], "sms", status), (ids[status], "web", "sent")} <= deliveries
    assert (young, "sms", "delivered") in deliveries
    assert rows(engine, "SELECT key FROM dedup_keys ORDER BY key") == keys


def post_later(service: SchedulerService, clock: ManualClock) -> str:
    """A notification sent now and delivered (the retrying row, due first, fails again): its id."""
    with TestClient(service.app) as client:
        post_event(client, user_id="u-young")
        drain(service)
    asyncio.run(worker(service, ScriptedSender(Retry(reason="http 503"), Delivered(status=200)), clock).run_once())
    [row] = rows(service.engine, "SELECT id FROM notifications WHERE user_id = 'u-young'")
    return str(row["id"])


@pytest.mark.clause("RET-8")
def test_a_hosts_delivered_outbox_rows_go_after_the_window_and_a_backlog_carries_on_in_batches(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """RET-8: a host dispatcher's outbox rows (no notification) go once delivered and older than the
    window, its undeliverable one stays; a run of one-row batches, two a poll, carries the backlog on
    over the next polls until it is done."""

    def host(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.DELIVERED, outbox=[OutboundMessage(
            notification_id=f"host-{event.user_id}", user_id=event.user_id, community_id=None, channel="sms",
            kind="k", title="t", body="b", rule_id="r")])

    service = outbox_service(settings, engine, clock, publisher, days=10, dispatcher=host)
    ids = sent(service, clock, Undeliverable(reason="http 410"), Delivered(status=200), Delivered(status=200))
    assert rows(engine, "SELECT count(*) AS n FROM notifications") == [{"n": 0}]
    clock.advance(timedelta(days=11))
    retention = Retention(service.loop_database, clock, days=30, notification_days=10, batch_size=1, max_batches=2)
    first = retention.run_if_due()  # the expired events' batch (none), then one host row
    assert first is not None and (first.done, first.batches, first.deliveries_deleted) == (False, 2, 1)
    second = retention.run_if_due()  # the backlog carries on at once, within the hour
    assert second is not None and (second.done, second.deliveries_deleted) == (True, 1)
    assert retention.run_if_due() is None  # and the next run is an hour away
    assert [(r["notification_id"], r["status"]) for r in rows(engine, "SELECT * FROM deliveries")] == [
        (ids["undeliverable"], "undeliverable")]


@pytest.mark.clause("RET-9")
def test_by_default_every_notification_and_delivery_is_kept_and_the_window_is_0_or_at_least_2_days(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """RET-9: SCHEDULER_NOTIFICATION_RETENTION_DAYS is 0 by default, and then four hundred days on
    every notification and delivery is still there (old dispatched events go as before); 1 day
    (inside the daily cap's 48 hours) or a negative number is refused naming the variable."""
    assert Settings().notification_retention_days == 0
    service = outbox_service(settings, engine, clock, publisher, days=0)
    sent(service, clock, Delivered(status=200))
    before = kept(engine)
    clock.advance(timedelta(days=400))
    report = service.retention.run_if_due()
    assert report is not None and report.deleted == 1 and report.notifications_deleted == 0
    assert kept(engine) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scheduled_events")).scalar_one() == 0
    for bad in ("1", "-3", "a week"):
        with pytest.raises(ConfigError, match="SCHEDULER_NOTIFICATION_RETENTION_DAYS"):
            Settings.from_env({"SCHEDULER_NOTIFICATION_RETENTION_DAYS": bad})
    assert Settings.from_env({"SCHEDULER_NOTIFICATION_RETENTION_DAYS": "2"}).notification_retention_days == 2
