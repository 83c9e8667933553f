"""How a batch's events run and how it commits (REQ-0067, DEC-1, DEC-1.4, DEC-1.6): one
strategy per batch, chosen at its first dispatch by what the dispatcher declares
(``scheduler.types.capabilities_of``; a plain callable declares nothing).

- it decides batches whole (a ``BatchDispatcher``): ``SetBasedBatch``, decided at the first
  dispatch and written with the COMMIT, with a per-event strategy as its fallback (DEC-1.2,
  DEC-1.5);
- it is safe to call again after a rollback (a ``DeclaredDispatcher`` with ``safe_to_repeat``):
  ``OptimisticBatch``, one checkpoint and a replay after a failure (DEC-1);
- otherwise: ``SavepointPerEvent``, a savepoint per event, called once per event (DEC-1.4).

Every event ends exactly as if it ran inside a SAVEPOINT of its own: whatever it raises or
refuses, only its work is undone and its row ends ``failed`` with the reason. A strategy
writes into nothing shared: ``run`` and ``commit`` *return* what the batch's events became
(``Ran``), and the batch (``core.poll``) keeps the record. The poll's stop is asked by the
batch alone (``Batch.stop_requested``): a strategy that runs several events in one step (a
replay, a fallback) is handed that question and asks it between every two (DEC-7.1).

The transaction's mechanics: the checkpoint and an event's savepoint have names of their own,
unknown to SQLAlchemy's session, and are deferred (``database.pipeline.defer``): each travels
ahead of the next statement, so a dispatcher that writes nothing never sends one. The
checkpoint is never released (the COMMIT ends it); the outcomes travel with the COMMIT.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, SessionTransaction

from scheduler.database import pipeline
from scheduler.database.events import EventRepository
from scheduler.types import (
    BatchDispatcher,
    ClaimedEvent,
    Clock,
    Dispatcher,
    DispatchResult,
    EventOutcome,
    NotADispatchResult,
    OutboundMessage,
    capabilities_of,
    checked_result,
    error_text,
)

logger = logging.getLogger(__name__)

# The optimistic or set-based run's one savepoint, taken before the batch's first event.
CHECKPOINT = "scheduler_checkpoint"
# The savepoint of one event run alone (DEC-1.4, and the replay after a failure).
EVENT_SAVEPOINT = "scheduler_event"

Stop = Callable[[], bool]
# One event's outcome and the messages it sends after the commit.
Done = tuple[EventOutcome, tuple[OutboundMessage, ...]]


@dataclass(frozen=True)
class Ran:
    """What a step of a strategy did: the batch's record from ``start`` on is now ``done`` (a
    replay rewrites the events since the checkpoint); ``stopped``: the batch ends after them,
    the events not reached stay pending; ``replayed``: dispatcher calls made again after a
    rollback; ``owner``: the strategy that runs the batch from now on, when it changed."""

    start: int
    done: tuple[Done, ...]
    stopped: bool = False
    replayed: int = 0
    owner: Strategy | None = None


class Strategy(Protocol):
    """The batch's one owner, from its first dispatch to its commit."""

    # whether the batch was decided whole at its first dispatch (``SetBasedBatch``)
    decided_whole: bool

    def run(self, session: Session, events: Sequence[ClaimedEvent], position: int, stop: Stop) -> Ran:
        """Run the event at ``position`` (there is one)."""

    def commit(self, session: Session, events: Sequence[ClaimedEvent], record: Sequence[Done], stop: Stop) -> Ran:
        """Write the outcomes of ``record`` (and what else is unwritten) and COMMIT; return what
        committed (the caller closes the session)."""


def choose_strategy(session: Session, events: Sequence[ClaimedEvent], dispatcher: Dispatcher, clock: Clock,
                    name: str, stop: Stop, repository: EventRepository) -> Strategy:
    """The strategy that runs a batch with ``dispatcher``, at its first dispatch: decided whole
    when it can be, else one event at a time. ``name`` (the replica's) labels the log lines."""
    declared = capabilities_of(dispatcher)
    per_event = (OptimisticBatch if declared.safe_to_repeat else SavepointPerEvent)(dispatcher, clock, name, repository)
    if declared.batch is not None:
        whole = SetBasedBatch.decide(session, events, declared.batch, clock, name, per_event, stop, repository)
        if whole is not None:
            return whole
    return per_event


# -- the transaction's mechanics ------------------------------------------------------------


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone (a database restart, a terminated backend):
    no fault of an event, and nothing can be recorded on this transaction, so the poll fails
    whole with the real cause and its rows are pending again."""
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def take_checkpoint(session: Session) -> None:
    """Defer the checkpoint's SAVEPOINT to travel ahead of the next statement."""
    pipeline.defer(session, pipeline.command(f"SAVEPOINT {CHECKPOINT}"))


def rollback_to_checkpoint(session: Session) -> None:
    """Undo whatever ran since the checkpoint: roll back to it if it was sent (the claim's row
    and participant locks predate it and stay held), else drop it unsent (nothing ran since).
    SQLAlchemy does not know this savepoint, so the session's objects are expunged, as its own
    rollback to a savepoint would expire them."""
    if not pipeline.discard(session):
        session.connection().exec_driver_sql(f"ROLLBACK TO SAVEPOINT {CHECKPOINT}")
        session.expunge_all()


def commit_outcomes(session: Session, outcomes: Sequence[EventOutcome], repository: EventRepository) -> None:
    """Write ``outcomes`` (``record_outcomes``, the statement that writes a row's status) and
    COMMIT, in one round trip; the checkpoint is not released first (the COMMIT ends it) and
    one never sent stays unsent."""
    if session.in_nested_transaction():
        # a savepoint the dispatcher left open: SQLAlchemy releases it before its COMMIT
        if outcomes:
            repository.record_outcomes(session, outcome_parameters(outcomes))
        session.commit()
        return
    pipeline.discard(session)
    if outcomes:
        repository.commit_with(session, statement="record_outcomes", params=outcome_parameters(outcomes))
    else:
        repository.commit_with(session)
    session.commit()  # the COMMIT went out with the outcomes: the session's sends nothing


def outcome_parameters(outcomes: Sequence[EventOutcome]) -> dict[str, list[Any]]:
    """The ``record_outcomes`` arrays: one element per event, in the batch's order."""
    return {
        "ids": [o.id for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "errors": [o.error for o in outcomes],
        "times": [o.finished_at for o in outcomes],
        # a held row's end of quiet hours (QUIET-2); None keeps the row's own
        "not_befores": [o.not_before for o in outcomes],
    }


def _call(dispatcher: Dispatcher, session: Session, event: ClaimedEvent, now: datetime,
          transaction: SessionTransaction | None) -> DispatchResult:
    """Call the dispatcher for one event. Whatever it hands back is checked inside the isolation:
    a value that is not a DispatchResult, or a transaction it ended, fails this event alone,
    with the reason (REQ-0067)."""
    result = checked_result(dispatcher(session, event.as_event(), now))
    if transaction is None or not transaction.is_active:
        raise RuntimeError("the dispatcher ended the transaction it was handed")
    return result


def dispatch_once(session: Session, dispatcher: Dispatcher, event: ClaimedEvent, now: datetime,
                  name: str) -> Done:
    """Run one event in a savepoint of its own: whatever it raises (or refuses), only its work
    is undone. The savepoint travels ahead of the dispatcher's first statement, so a dispatcher
    that writes nothing costs no round trip; once it went out, it is released ahead of the next
    statement (the COMMIT ends any still pending), so savepoints never pile up."""
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
        return EventOutcome.failed(event, error_text(exc), now), ()
    if result.refusal is not None:
        # the sender's error: nothing it wrote stays (DEC-8)
        _undo_event(session, savepoint)
        return EventOutcome.failed(event, result.refusal, now), ()
    if not pipeline.withdraw(session, savepoint):
        pipeline.defer(session, pipeline.command(f"RELEASE SAVEPOINT {EVENT_SAVEPOINT}"))
    return EventOutcome.decided(event, result, now), tuple(result.outbound)


def _undo_event(session: Session, savepoint: pipeline.Step) -> None:
    """Undo what one event wrote: nothing when its savepoint never went out (it wrote
    nothing); else roll back to it now (the transaction may be aborted: the next statement
    must find it healthy) and release it ahead of the next statement."""
    if pipeline.withdraw(session, savepoint):
        return
    session.connection().exec_driver_sql(f"ROLLBACK TO SAVEPOINT {EVENT_SAVEPOINT}")
    session.expunge_all()  # SQLAlchemy does not know this savepoint: its objects may be stale
    pipeline.defer(session, pipeline.command(f"RELEASE SAVEPOINT {EVENT_SAVEPOINT}"))


# -- one event at a time --------------------------------------------------------------------


class SavepointPerEvent:
    """Every event in a savepoint of its own, the dispatcher called once per event (DEC-1.4)."""

    decided_whole = False

    def __init__(self, dispatcher: Dispatcher, clock: Clock, name: str, repository: EventRepository) -> None:
        self.dispatcher, self.clock, self.name, self.repository = dispatcher, clock, name, repository

    def run(self, session: Session, events: Sequence[ClaimedEvent], position: int, stop: Stop) -> Ran:
        return Ran(position, (dispatch_once(session, self.dispatcher, events[position], self.clock.now(), self.name),))

    def commit(self, session: Session, events: Sequence[ClaimedEvent], record: Sequence[Done], stop: Stop) -> Ran:
        commit_outcomes(session, [outcome for outcome, _ in record], self.repository)
        return Ran(0, tuple(record))


class OptimisticBatch(SavepointPerEvent):
    """The events under one checkpoint, replayed one savepoint each after a failure (DEC-1).

    Safe only for a dispatcher whose every effect is a write on the session it is handed and
    whose outbound messages leave after the commit (``safe_to_repeat``): its rolled-back
    calls leave nothing behind, so calling it again is calling it once."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, name: str, repository: EventRepository) -> None:
        super().__init__(dispatcher, clock, name, repository)
        # Since the checkpoint: the transaction it was taken in (``None``: no checkpoint yet),
        # the first event it covers and what the events since it became (with their times).
        self._transaction: SessionTransaction | None = None
        self._first = 0
        self._since: list[Done] = []

    def run(self, session: Session, events: Sequence[ClaimedEvent], position: int, stop: Stop) -> Ran:
        event, now = events[position], self.clock.now()
        if self._transaction is None:
            take_checkpoint(session)
            self._transaction, self._first, self._since = session.get_transaction(), position, []
        try:
            result = _call(self.dispatcher, session, event, now, self._transaction)
        except Exception as exc:
            if connection_lost(exc):
                raise
            first_error = error_text(exc)
        else:
            if result.refusal is None:
                done = EventOutcome.decided(event, result, now), tuple(result.outbound)
                self._since.append(done)
                return Ran(position, (done,))
            first_error = result.refusal
        return self._replay(session, events, position, now, first_error, stop)

    def _replay(self, session: Session, events: Sequence[ClaimedEvent], position: int, now: datetime,
                first_error: str, stop: Stop) -> Ran:
        """The event at ``position`` failed under the checkpoint: roll back to it, run the events
        since it again one savepoint each (with the time they first ran), then the failing event
        in a savepoint of its own, where it fails alone as it would have the first time. The next
        event takes a fresh checkpoint.

        A stop is honoured between every two of these events (DEC-7.1): the events run again so
        far keep their outcome, and the batch ends there: the rest, the failing one included,
        were rolled back with the checkpoint, so the commit releases them pending."""
        event = events[position]
        transaction, self._transaction = self._transaction, None
        if transaction is None or not transaction.is_active:
            # The dispatcher committed or rolled back the batch's transaction itself: there is
            # nothing left to roll back to, so the event is recorded failed as it stands.
            logger.error("%s: dispatch of scheduled event %s failed: %s", self.name, event.id, first_error)
            return Ran(position, ((EventOutcome.failed(event, first_error, now), ()),))
        rollback_to_checkpoint(session)
        start, earlier = self._first, self._since
        logger.info("%s: scheduled event %s failed (%s); replaying the %d event(s) before it in the batch, "
                    "one savepoint each", self.name, event.id, first_error, len(earlier))
        again = [(previous, outcome.finished_at or now) for previous, (outcome, _) in
                 zip(events[start:position], earlier, strict=True)]
        done: list[Done] = []
        for previous, at in [*again, (event, now)]:
            if stop():
                logger.info("%s: stop requested during a replay; %d event(s) left pending for the next poll",
                            self.name, len(events) - start - len(done))
                return Ran(start, tuple(done), stopped=True, replayed=len(done))
            done.append(dispatch_once(session, self.dispatcher, previous, at, self.name))
        return Ran(start, tuple(done), replayed=len(done))


# -- the whole batch at once ------------------------------------------------------------------


class SetBasedBatch:
    """A batch decided whole at its first dispatch (DEC-1, DEC-1.5): the dispatcher
    (``BatchDispatcher``: the built-in platform, the simulation's) reads what the decisions
    need and decides every event in order, under the checkpoint; the commit sends the one
    statement that writes every decision and outcome with the COMMIT. The later dispatches
    hand out what was decided, so the step API is the same.

    An event whose rules raise (or refuse it) fails alone and writes nothing, as per event.
    Anything that fails as a whole (the read, the decisions, a write that differs from them:
    DEC-1.2) rolls back to the checkpoint, and the batch is handed to its per-event fallback
    from its first event: at the first dispatch, or at the commit when the write failed."""

    decided_whole = True

    def __init__(self, planned: list[Done], write: tuple[str, dict[str, Any]], fallback: Strategy,
                 name: str, repository: EventRepository) -> None:
        self.planned = planned  # each event's outcome and outbound, in batch order
        self.write = write  # the statement (name, parameters) that writes it all, outcomes too
        self.fallback = fallback
        self.name = name
        self.repository = repository  # the schema's statements the write is sent as

    @classmethod
    def decide(cls, session: Session, events: Sequence[ClaimedEvent], dispatcher: BatchDispatcher, clock: Clock,
               name: str, fallback: Strategy, stop: Stop, repository: EventRepository) -> SetBasedBatch | None:
        """Decide the whole batch under a fresh checkpoint; ``None`` when it could not be (the
        dispatcher has no set-based path for it, or it failed as a whole: rolled back, the batch
        runs through ``fallback``)."""
        now = clock.now()  # one time for the batch's decisions and outcomes
        take_checkpoint(session)
        try:
            decisions = dispatcher.decide_batch(session, [e.as_event() for e in events], now, stop)
            if decisions is None:
                rollback_to_checkpoint(session)
                return None
            planned: list[Done] = []
            # fewer results than events: a stop arrived, the rest stay untouched (DEC-7)
            for event, decided in zip(events[:len(decisions.results)], decisions.results, strict=True):
                result: DispatchResult | Exception = decided
                if not isinstance(decided, Exception):
                    try:  # a value that is not a DispatchResult fails its own event, as per event
                        result = checked_result(decided)
                    except NotADispatchResult as exc:
                        result = exc
                if isinstance(result, Exception):
                    logger.error("%s: dispatch of scheduled event %s failed: %s", name, event.id, error_text(result),
                                 exc_info=result)
                    planned.append((EventOutcome.failed(event, error_text(result), now), ()))
                elif result.refusal is not None:
                    planned.append((EventOutcome.failed(event, result.refusal, now), ()))
                else:
                    planned.append((EventOutcome.decided(event, result, now), tuple(result.outbound)))
            write = decisions.write_statement(outcome_parameters([o for o, _ in planned]))
        except Exception as exc:
            if connection_lost(exc):
                raise
            logger.warning("%s: the set-based batch failed (%s); its %d event(s) run one by one",
                           name, error_text(exc), len(events))
            rollback_to_checkpoint(session)
            return None
        return cls(planned, write, fallback, name, repository)

    def run(self, session: Session, events: Sequence[ClaimedEvent], position: int, stop: Stop) -> Ran:
        """The next event's decided outcome; past the events decided (a stop arrived while they
        were taken, or the dispatcher decided a part only) the batch ends: the rest stay pending."""
        if position >= len(self.planned):
            return Ran(position, (), stopped=True)
        return Ran(position, (self.planned[position],))

    def commit(self, session: Session, events: Sequence[ClaimedEvent], record: Sequence[Done], stop: Stop) -> Ran:
        """Send the write with the COMMIT, in one round trip: every decided event's outcome, those
        not handed out yet (a stop arrived mid-batch) too. When the write failed (it fails on rows
        other than decided, so the COMMIT did not run), roll back to the checkpoint and run the
        decided events again through the fallback, honouring a stop between every two (DEC-7.1):
        the events not reached were rolled back too, and stay pending."""
        name, params = self.write
        try:
            self.repository.commit_with(session, statement=name, params=params)
        except Exception as exc:
            if connection_lost(exc) or not pipeline.in_failed_transaction(session):
                raise  # the connection is gone, or the COMMIT itself failed: the poll fails whole
            logger.warning("%s: the set-based write failed (%s); the batch's %d event(s) run one by one",
                           self.name, error_text(exc), len(events))
        else:
            session.commit()  # the write went with the COMMIT: nothing is sent
            return Ran(0, tuple(self.planned))
        rollback_to_checkpoint(session)
        done: list[Done] = []
        replayed, stopped = 0, False
        while len(done) < len(self.planned) and not stopped:
            if stop():
                stopped = True
                break
            ran = self.fallback.run(session, events, len(done), stop)
            del done[ran.start:]
            done.extend(ran.done)
            replayed, stopped = replayed + ran.replayed, ran.stopped
        committed = self.fallback.commit(session, events, done, stop)
        return Ran(0, committed.done, stopped=stopped, replayed=replayed, owner=self.fallback)
