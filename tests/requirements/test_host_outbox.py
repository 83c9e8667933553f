"""A host dispatcher's outbox messages (OUTBOX-7, OUTBOX-8), on real PostgreSQL.

A host's own dispatcher returns ``DispatchResult.outbox``: messages that each name their
channel. ``SchedulerService`` queues them in the dispatch transaction and its delivery worker
sends them through the channel's ``Sender``; a channel without one is recorded on its row.
The provider is a fake at the edge (``ScriptedSender``); the dispatcher is the host's code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher, idempotency_key
from scheduler.service import SchedulerService
from scheduler.types import (
    DeclaredDispatcher,
    DigitalTwinEvent,
    DispatchOutcome,
    DispatchResult,
    OutboundMessage,
    capabilities_of,
)
from tests.conftest import INGEST
from tests.helpers import drain, event_body, post_event, rows, running
from tests.requirements.test_outbox import ScriptedSender, worker

HostDispatch = Callable[[Session, DigitalTwinEvent, datetime], DispatchResult]


def message(event: DigitalTwinEvent, channel: str = "sms", message_id: str | None = None) -> OutboundMessage:
    """The host's own message for ``event`` (its id is the host's, not a notification's)."""
    return OutboundMessage(notification_id=message_id or f"host-{event.user_id}", user_id=event.user_id,
                           community_id=event.community_id, channel=channel, kind="reminder",
                           title=f"Hello {event.user_id}", body="Your reminder", rule_id="host-rule")


def host_service(settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher,
                 dispatcher: Any, sender: ScriptedSender) -> SchedulerService:
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False,
                            dispatcher=dispatcher, senders={"sms": sender})


@pytest.fixture
def sender() -> ScriptedSender:
    return ScriptedSender()


def outbox(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM deliveries ORDER BY id")


@pytest.mark.clause("OUTBOX-7")
def test_a_host_dispatchers_outbox_messages_are_queued_on_their_channel_and_sent_by_the_worker(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher, sender: ScriptedSender
) -> None:
    """OUTBOX-7: a scheduled event and a live one, each decided by the host's dispatcher, queue
    the host's message on its channel in the dispatch transaction (the host's id, the idempotency
    key of that id and channel, due at once), the publisher never sees it, and the worker sends
    it through the channel's sender and records it delivered."""

    def host(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.DELIVERED, outbox=[message(event)])

    service = host_service(settings, engine, clock, publisher, host, sender)
    with running(service.app) as client:
        post_event(client, user_id="p-1")
        body = {k: v for k, v in event_body(user_id="p-2").items() if k != "trigger_at"}
        live = client.post("/admin/ingest-event", headers=INGEST, json=body)
        assert live.status_code == 200, live.text
        drain(service)
    queued = outbox(engine)
    assert [(r["notification_id"], r["channel"], r["status"], r["attempts"]) for r in queued] == [
        ("host-p-2", "sms", "queued", 0), ("host-p-1", "sms", "queued", 0)]
    assert all(r["idempotency_key"] == idempotency_key(r["notification_id"], "sms") for r in queued)
    assert all(r["next_attempt_at"] == clock.now() and r["message"]["title"].startswith("Hello") for r in queued)
    assert publisher.messages == []
    recorded = asyncio.run(worker(service, sender, clock).run_once())
    assert len(recorded) == 2 and all(r.kept for r in recorded)
    assert sorted(d.notification_id for d in sender.sent) == ["host-p-1", "host-p-2"]
    assert {d.title for d in sender.sent} == {"Hello p-1", "Hello p-2"}
    assert [r["status"] for r in outbox(engine)] == ["delivered", "delivered"]


@pytest.mark.clause("OUTBOX-7")
def test_a_declared_host_dispatcher_keeps_its_declaration_and_a_repeated_message_is_queued_once(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher, sender: ScriptedSender
) -> None:
    """OUTBOX-7: the service's wrapper declares what the host's dispatcher declares (safe to
    repeat here, nothing for a plain function), and the same message id on the same channel,
    returned for two events, is one row (its idempotency key)."""

    class Repeatable(DeclaredDispatcher):
        safe_to_repeat = True

        def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
            return DispatchResult(outcome=DispatchOutcome.DELIVERED, outbox=[message(event, message_id="one")])

    def plain(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)

    service = host_service(settings, engine, clock, publisher, Repeatable(), sender)
    assert capabilities_of(service.dispatcher).safe_to_repeat
    plain_service = host_service(settings, engine, clock, publisher, plain, sender)
    assert not capabilities_of(plain_service.dispatcher).safe_to_repeat
    with running(service.app) as client:
        post_event(client, user_id="p-1")
        post_event(client, user_id="p-2")
        drain(service)
    assert statuses_of(engine) == ["dispatched", "dispatched"]
    assert [r["notification_id"] for r in outbox(engine)] == ["one"]


def statuses_of(engine: Engine) -> list[str]:
    return [r["status"] for r in rows(engine, "SELECT status FROM scheduled_events ORDER BY created_at, id")]


@pytest.mark.clause("OUTBOX-8")
def test_a_message_on_a_channel_without_a_sender_is_recorded_undeliverable_and_the_batch_goes_on(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher, sender: ScriptedSender
) -> None:
    """OUTBOX-8: a message naming a channel nobody registered is written ``undeliverable`` at
    once, its ``last_error`` naming the channel and the channels with a sender; its event and the
    rest of the batch are dispatched, the known channel's message queued and sent."""

    def host(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        channel = "pager" if event.user_id == "p-1" else "sms"
        return DispatchResult(outcome=DispatchOutcome.DELIVERED, outbox=[message(event, channel)])

    service = host_service(settings, engine, clock, publisher, host, sender)
    with running(service.app) as client:
        post_event(client, user_id="p-1")
        post_event(client, user_id="p-2")
        drain(service)
    assert statuses_of(engine) == ["dispatched", "dispatched"]
    by_channel = {r["channel"]: r for r in outbox(engine)}
    assert by_channel["pager"]["status"] == "undeliverable" and by_channel["pager"]["next_attempt_at"] is None
    assert by_channel["pager"]["last_error"] == "no sender for the channel 'pager' (the channels with a sender: 'sms')"
    assert by_channel["sms"]["status"] == "queued"
    asyncio.run(worker(service, sender, clock).run_once())
    assert [d.channel for d in sender.sent] == ["sms"]


@pytest.mark.clause("OUTBOX-8")
def test_a_refused_failed_or_rolled_back_event_queues_nothing_and_fails_alone(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher, sender: ScriptedSender
) -> None:
    """OUTBOX-8: a refusal's outbox is not queued (its event ends failed with the refusal), an
    outbox holding something that is no ``OutboundMessage`` fails that event alone naming it, a
    deferred result queues nothing, and a batch that rolls back leaves no row."""

    def host(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        session.execute(text("SELECT 1"))  # the host's own statement in the event's savepoint
        if event.user_id == "p-1":
            return DispatchResult(outcome=DispatchOutcome.INVALID_EVENT, refusal="opted out",
                                  outbox=[message(event)])
        if event.user_id == "p-2":
            return DispatchResult(outcome=DispatchOutcome.DELIVERED, outbox=["not a message"])  # type: ignore[list-item]
        if event.user_id == "p-4":
            return DispatchResult(outcome=DispatchOutcome.DEFERRED, not_before=now + timedelta(hours=1),
                                  outbox=[message(event)])
        return DispatchResult(outcome=DispatchOutcome.DELIVERED, outbox=[message(event)])

    service = host_service(settings, engine, clock, publisher, host, sender)
    with running(service.app) as client:
        for user in ("p-1", "p-2", "p-3", "p-4"):
            post_event(client, user_id=user)
        batch = service.scheduler.claim()
        while service.scheduler.dispatch_next(batch) is not None:
            pass
        service.scheduler.abort(batch)
        assert outbox(engine) == []  # rolled back: nothing queued
        drain(service)
    found = {r["user_id"]: r for r in rows(engine, "SELECT user_id, status, last_error FROM scheduled_events")}
    assert (found["p-1"]["status"], found["p-1"]["last_error"]) == ("failed", "opted out")
    assert found["p-2"]["status"] == "failed"
    assert "DispatchResult.outbox[0] is a str; expected an OutboundMessage" in found["p-2"]["last_error"]
    assert (found["p-3"]["status"], found["p-4"]["status"]) == ("dispatched", "pending")
    assert [r["notification_id"] for r in outbox(engine)] == ["host-p-3"]
