"""The two ways a batch runs one event at a time (DEC-1, DEC-1.4), each a ``BatchStrategy``.

- ``SavepointPerEvent``: a dispatcher called once per event per poll (the default for a
  host's dispatcher): every event in a savepoint of its own, nothing ever called twice.
- ``OptimisticBatch``: a dispatcher safe to repeat (the built-in platform): the events run
  under one checkpoint without savepoints of their own; a failure rolls back to it and the
  events since it run again, one savepoint each (``dispatch_once``), the failing one last.

Either way every event ends as if it ran in a savepoint of its own (REQ-0067): whatever it
raises or refuses, only its own work is undone and its row ends ``failed`` with the reason.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, SessionTransaction

from scheduler.core.batch import (
    FORMER_FIELDS,
    Batch,
    ClaimedEvent,
    EventOutcome,
    dispatched,
    error_text,
    failed,
)
from scheduler.core.batch_transaction import (
    EVENT_SAVEPOINT,
    commit_with_outcomes,
    connection_lost,
    rollback_to_checkpoint,
    stopping,
    take_checkpoint,
)
from scheduler.core.dispatch_contract import checked_result
from scheduler.database import pipeline
from scheduler.types import Clock, Dispatcher, DispatchResult

logger = logging.getLogger(__name__)


def _call(dispatcher: Dispatcher, session: Session, event: ClaimedEvent, now: datetime,
          transaction: SessionTransaction | None) -> DispatchResult:
    """Call the dispatcher for one event. Whatever it hands back is checked inside the isolation:
    a value that is not a DispatchResult, or a transaction it ended, fails this event alone,
    with the reason (REQ-0067)."""
    result = checked_result(dispatcher(session, event.as_event(), now))
    if transaction is None or not transaction.is_active:
        raise RuntimeError("the dispatcher ended the transaction it was handed")
    return result


def dispatch_once(batch: Batch, dispatcher: Dispatcher, event: ClaimedEvent, now: datetime,
                  name: str) -> EventOutcome:
    """Run one event in a savepoint of its own: whatever it raises (or refuses), only its work
    is undone. The savepoint travels ahead of the dispatcher's first statement, so a dispatcher
    that writes nothing costs no round trip; once it went out, it is released ahead of the next
    statement (the COMMIT ends any still pending), so savepoints never pile up."""
    session = batch.session
    savepoint = pipeline.command(f"SAVEPOINT {EVENT_SAVEPOINT}")
    pipeline.defer(session, savepoint)
    transaction = session.get_transaction()
    try:
        result = _call(dispatcher, session, event, now, transaction)
    except Exception as exc:
        if connection_lost(exc):
            raise
        logger.exception("%s: dispatch of scheduled event %s failed", name, event.id)
        if transaction is not None and transaction.is_active:
            _undo_event(session, savepoint)
        return failed(event, error_text(exc), now)
    if result.refusal is not None:
        # the sender's error: nothing it wrote stays (DEC-8)
        _undo_event(session, savepoint)
        return failed(event, result.refusal, now)
    if not pipeline.withdraw(session, savepoint):
        pipeline.defer(session, pipeline.command(f"RELEASE SAVEPOINT {EVENT_SAVEPOINT}"))
    batch.outbound.extend(result.outbound)
    return dispatched(event, now)


def _undo_event(session: Session, savepoint: pipeline.Step) -> None:
    """Undo what one event wrote: nothing when its savepoint never went out (it wrote
    nothing); else roll back to it now (the transaction may be aborted: the next statement
    must find it healthy) and release it ahead of the next statement."""
    if pipeline.withdraw(session, savepoint):
        return
    session.connection().exec_driver_sql(f"ROLLBACK TO SAVEPOINT {EVENT_SAVEPOINT}")
    session.expunge_all()  # SQLAlchemy does not know this savepoint: its objects may be stale
    pipeline.defer(session, pipeline.command(f"RELEASE SAVEPOINT {EVENT_SAVEPOINT}"))


class SavepointPerEvent:
    """Every event in a savepoint of its own, the dispatcher called once per event (DEC-1.4)."""

    decided_whole = False

    def __init__(self, dispatcher: Dispatcher, clock: Clock, name: str) -> None:
        self.dispatcher, self.clock, self.name = dispatcher, clock, name

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        event = batch.events[batch.position]
        batch.position += 1
        outcome = dispatch_once(batch, self.dispatcher, event, self.clock.now(), self.name)
        batch.outcomes.append(outcome)
        return outcome

    def commit(self, batch: Batch) -> None:
        commit_with_outcomes(batch.session, batch.outcomes, batch.events_repository)

    def former_fields(self) -> dict[str, Any]:
        return {**FORMER_FIELDS, "planned": []}


class OptimisticBatch(SavepointPerEvent):
    """The events under one checkpoint, replayed one savepoint each after a failure (DEC-1).

    Safe only for a dispatcher whose every effect is a write on the session it is handed and
    whose outbound messages leave after the commit (``safe_to_repeat``): its rolled-back
    calls leave nothing behind, so calling it again is calling it once."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, name: str) -> None:
        super().__init__(dispatcher, clock, name)
        # Since the checkpoint: the transaction it was taken in (``None``: no checkpoint yet),
        # the first event it covers and how much outbound the batch had before it.
        self._transaction: SessionTransaction | None = None
        self._first = 0
        self._outbound = 0

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        event = batch.events[batch.position]
        batch.position += 1
        now = self.clock.now()
        if self._transaction is None:
            take_checkpoint(batch.session)
            self._transaction = batch.session.get_transaction()
            self._first, self._outbound = batch.position - 1, len(batch.outbound)
        transaction = self._transaction
        try:
            result = _call(self.dispatcher, batch.session, event, now, transaction)
        except Exception as exc:
            if connection_lost(exc):
                raise
            first_error = error_text(exc)
        else:
            if result.refusal is None:
                batch.outbound.extend(result.outbound)
                outcome = dispatched(event, now)
                batch.outcomes.append(outcome)
                return outcome
            first_error = result.refusal
        replayed = self._replay(batch, event, now, first_error)
        if replayed is not None:
            batch.outcomes.append(replayed)
        return replayed

    def former_fields(self) -> dict[str, Any]:
        return {**super().former_fields(), "checkpoint": self._transaction, "checkpoint_position": self._first,
                "checkpoint_outbound": self._outbound}

    def _replay(self, batch: Batch, event: ClaimedEvent, now: datetime, first_error: str) -> EventOutcome | None:
        """``event`` failed under the checkpoint: roll back to it, run the events since it again
        one savepoint each (with the time they first ran), then ``event`` in a savepoint of its
        own, where it fails alone as it would have the first time. The next event takes a
        fresh checkpoint.

        A stop is honoured between every two of these events (DEC-7.1): the events run again so
        far keep their outcome, and the batch ends there (``None``): the rest, ``event``
        included, were rolled back with the checkpoint, so the commit releases them pending."""
        transaction, self._transaction = self._transaction, None
        if transaction is None or not transaction.is_active:
            # The dispatcher committed or rolled back the batch's transaction itself: there is
            # nothing left to roll back to, so the event is recorded failed as it stands.
            logger.error("%s: dispatch of scheduled event %s failed: %s", self.name, event.id, first_error)
            return failed(event, first_error, now)
        rollback_to_checkpoint(batch.session)
        start = self._first
        earlier = batch.outcomes[start:]
        logger.info("%s: scheduled event %s failed (%s); replaying the %d event(s) before it in the batch, "
                    "one savepoint each", self.name, event.id, first_error, len(earlier))
        del batch.outcomes[start:]
        del batch.outbound[self._outbound:]
        for done, (previous, outcome) in enumerate(zip(batch.events[start:batch.position - 1], earlier, strict=True)):
            if stopping(batch):
                self._stopped(batch, start + done)
                return None
            batch.outcomes.append(dispatch_once(batch, self.dispatcher, previous, outcome.finished_at or now,
                                                self.name))
            batch.replayed += 1
        if stopping(batch):
            self._stopped(batch, batch.position - 1)
            return None
        batch.replayed += 1
        return dispatch_once(batch, self.dispatcher, event, now, self.name)

    def _stopped(self, batch: Batch, position: int) -> None:
        """A stop arrived mid-replay: the batch ends after the events before ``position``."""
        logger.info("%s: stop requested during a replay; %d event(s) left pending for the next poll",
                    self.name, len(batch.events) - position)
        batch.position = position
        batch.stopped = True
