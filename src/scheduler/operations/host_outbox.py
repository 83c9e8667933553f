"""A host dispatcher's outbox (OUTBOX-7, OUTBOX-8): its messages queued in the dispatch transaction.

The built-in platform writes its deliveries with the rest of a batch's decisions. A host's own
dispatcher returns ``DispatchResult.outbox``: ``OutboundMessage`` values, each naming its channel.
``SchedulerService`` hands the loop and the live route the host's dispatcher wrapped by
``with_outbox``, which calls it and then writes one ``deliveries`` row per message in the same
session, so the rows commit with the event's outcome or not at all (a refusal, an error, a
rolled-back batch queue nothing; nor does a ``deferred`` result, which decides nothing yet). The
delivery worker sends them at least once, like the built-in channels' rows.

- a message on a channel with a sender (the service's outbox channels: the host's
  ``senders`` and the built-in ``webhook``) is ``queued``, due at once, with the idempotency
  key of its message id and channel (``nudging.orchestrator.idempotency_key``); the same
  message queued again (a repeated call) is the row already there;
- a message on any other channel is written ``undeliverable`` at once with the reason in
  ``last_error`` (naming the channel and the registered ones): visible on the console, in
  ``GET /admin/deliveries`` and the metrics, and never a failure of the event or its batch;
- anything in ``outbox`` that is not an ``OutboundMessage`` fails that event alone (a
  ``TypeError`` naming it), as a dispatcher's own error does (REQ-0067).

The wrapper declares what the host's dispatcher declares (``capabilities_of``), so the loop
runs it exactly as it would run the host's dispatcher itself; a ``BatchDispatcher``'s
results are queued when its batch is decided, in the batch's transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database.database import Database
from scheduler.nudging.orchestrator import idempotency_key
from scheduler.types import (
    BatchDecisions,
    BatchDispatcher,
    DeclaredDispatcher,
    DeliveryRowStatus,
    DigitalTwinEvent,
    Dispatcher,
    DispatchOutcome,
    DispatchResult,
    OutboundMessage,
    capabilities_of,
)

CHANNEL_CHARS = 32  # deliveries.channel


def outbox_rows(messages: Sequence[object], channels: Iterable[str], now: datetime) -> list[dict[str, Any]]:
    """The rows ``queue_deliveries`` writes for ``messages``: queued on a known channel,
    undeliverable naming the channel otherwise. A value that is no ``OutboundMessage`` is a
    ``TypeError``."""
    known = tuple(channels)
    rows: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, OutboundMessage):
            raise TypeError(f"DispatchResult.outbox[{index}] is a {type(message).__name__}; "
                            "expected an OutboundMessage naming its channel")
        channel = message.channel[:CHANNEL_CHARS]
        row: dict[str, Any] = {
            "notification_id": message.notification_id, "user_id": message.user_id, "channel": channel,
            "idempotency_key": idempotency_key(message.notification_id, channel),
            "message": {"community_id": message.community_id, "kind": message.kind, "title": message.title,
                        "body": message.body, "created_at": now.isoformat(), "rule_id": message.rule_id},
            "status": str(DeliveryRowStatus.QUEUED), "last_error": None,
        }
        if message.channel not in known:
            registered = ", ".join(repr(c) for c in known) or "none"
            row["status"] = str(DeliveryRowStatus.UNDELIVERABLE)
            row["last_error"] = (f"no sender for the channel {message.channel[:100]!r} "
                                 f"(the channels with a sender: {registered})")
        rows.append(row)
    return rows


class _Outbox:
    """The host's dispatcher, then its ``outbox`` queued in the same session."""

    def __init__(self, dispatcher: Dispatcher, database: Database, channels: Iterable[str]) -> None:
        self.dispatcher = dispatcher
        self.database = database
        self.channels = tuple(channels)

    def __repr__(self) -> str:
        return f"with_outbox({self.dispatcher!r})"

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        result = self.dispatcher(session, event, now)
        self._queue(session, result, now)
        return result

    def _queue(self, session: Session, result: object, now: datetime) -> None:
        # whatever is not a DispatchResult is left for the caller's check (NotADispatchResult);
        # a refused event's work is rolled back and a deferred one decides nothing yet, so
        # neither queues anything
        if (isinstance(result, DispatchResult) and result.outbox and not result.outcome.refused
                and result.outcome is not DispatchOutcome.DEFERRED):
            self.database.deliveries.queue(session, outbox_rows(result.outbox, self.channels, now), now=now)


class _RepeatableOutbox(_Outbox, DeclaredDispatcher):
    """``_Outbox`` of a dispatcher declared safe to repeat: every effect is still a row of the
    session (the queued messages too), so it stays safe to repeat."""

    safe_to_repeat = True


class _BatchOutbox(_Outbox, BatchDispatcher):
    """``_Outbox`` of a ``BatchDispatcher``: a decided batch's results queue theirs as well."""

    def __init__(self, dispatcher: BatchDispatcher, database: Database, channels: Iterable[str]) -> None:
        super().__init__(dispatcher, database, channels)
        self.batch = dispatcher
        self.safe_to_repeat = dispatcher.safe_to_repeat is True

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None) -> BatchDecisions | None:
        decided = self.batch.decide_batch(session, events, now, stop)
        if decided is not None:
            for result in decided.results:
                self._queue(session, result, now)
        return decided


def with_outbox(dispatcher: Dispatcher, database: Database, channels: Iterable[str]) -> Dispatcher:
    """``dispatcher`` whose results' ``outbox`` messages are queued in ``database``'s outbox,
    on ``channels`` (those with a sender), declaring what ``dispatcher`` declares."""
    declared = capabilities_of(dispatcher)
    if declared.batch is not None:
        return _BatchOutbox(declared.batch, database, channels)
    if declared.safe_to_repeat:
        return _RepeatableOutbox(dispatcher, database, channels)
    return _Outbox(dispatcher, database, channels)
