"""Per-event isolation inside one batch transaction (REQ-0067), and the batch's end.

Isolation. The claim's row locks (``FOR UPDATE SKIP LOCKED``) must be held until each
row's new status commits, and that status must commit together with the event's effects
(notifications, deliveries, deduplication keys). So a batch is one transaction, and the
outcome of every event is exactly what it would be if every event ran inside its own
SAVEPOINT: whatever an event raises, a Python error or a database error that aborts the
statement, only its own work is rolled back, its row ends ``failed`` with the error, and
the next event starts on a healthy transaction.

Cost. A savepoint per event is two extra round trips per event, paid for the rare event
that fails. So the batch runs optimistically: one savepoint (the *checkpoint*) is taken
before the first event, and events run under it without savepoints of their own. When an
event fails (or is refused), the transaction rolls back to the checkpoint, which undoes
the work of every event since it (the claim's row and participant locks were taken before
the checkpoint, so they stay held), and those events are replayed, each in its own
savepoint, with the time they first ran; then the failing event runs once more in its own
savepoint, where it fails alone exactly as it would have the first time. The next event
takes a fresh checkpoint. The dispatcher must therefore be safe to call again for an
event whose first call was rolled back: everything it writes goes through the session it
is handed, and nothing leaves the process before the batch commits (``Dispatcher``).
The outcomes are kept in memory and written with one statement when the batch finishes,
just before its commit (DEC-1 in ``specs/decisions.md``).

Set-based. A dispatcher that can decide a whole batch at once does so at the batch's first
dispatch, under the checkpoint, and the batch's end writes every decision and outcome in
one statement sent with the COMMIT (``core.set_based``); if either fails as a whole, the
checkpoint is rolled back and the batch runs per event as above (at its end, for a write).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from scheduler.core.batch import (
    Batch,
    ClaimedEvent,
    EventOutcome,
    dispatched,
    error_text,
    failed,
    outcome_parameters,
)
from scheduler.core.dispatch_contract import checked_result, repeatable
from scheduler.core.set_based import (
    CHECKPOINT,
    commit_set_based,
    dispatch_set_based,
    next_planned,
    rollback_to_checkpoint,
    settle_planned,
)
from scheduler.database import pipeline
from scheduler.database.queries import statement
from scheduler.types import Clock, Dispatcher

logger = logging.getLogger(__name__)

# The savepoint of one event of a dispatcher called once per event (DEC-1.4); the optimistic
# run's checkpoint is ``CHECKPOINT``.
EVENT_SAVEPOINT = "scheduler_event"


def dispatch_next(batch: Batch, dispatcher: Dispatcher, clock: Clock, name: str) -> EventOutcome | None:
    """Dispatch the batch's next event under its checkpoint; ``None`` when none is left.

    If the event fails, the events since the checkpoint are replayed one savepoint each and
    it runs again in its own, so its outcome is the one a savepoint of its own would give.
    ``name`` (the replica's) labels the log lines.
    """
    if batch.closed:
        raise RuntimeError("batch already finished")
    return _dispatch_next(batch, dispatcher, clock, name)


def _stopping(batch: Batch) -> bool:
    """Whether the poll's stop has arrived: asked between every two events of the replay and
    of the set-based fallback (``Scheduler.poll_once`` asks between those of the first pass), DEC-7."""
    return batch.should_stop is not None and batch.should_stop()


def _dispatch_next(batch: Batch, dispatcher: Dispatcher, clock: Clock, name: str) -> EventOutcome | None:
    if batch.remaining == 0:
        return None
    if dispatch_set_based(batch, dispatcher, clock, name):
        return next_planned(batch)
    event = batch.events[batch.position]
    batch.position += 1
    now = clock.now()
    if not repeatable(dispatcher):
        # called once per event: each in a savepoint of its own, nothing replayed (DEC-1.4)
        once = _dispatch_once(batch, dispatcher, event, now, name)
        batch.outcomes.append(once)
        return once
    if batch.checkpoint is None:
        # the checkpoint's SAVEPOINT goes ahead of the dispatcher's first statement, in its
        # round trip; a dispatcher that writes nothing never sends it (``database.pipeline``)
        pipeline.defer(batch.session, pipeline.command(f"SAVEPOINT {CHECKPOINT}"))
        batch.checkpoint = batch.session.get_transaction()
        batch.checkpoint_position = batch.position - 1
        batch.checkpoint_outbound = len(batch.outbound)
    checkpoint = batch.checkpoint
    try:
        # whatever the dispatcher hands back is checked inside the isolation: a value that is
        # not a DispatchResult fails this event alone, with the reason (REQ-0067)
        result = checked_result(dispatcher(batch.session, event.as_event(), now))
        if checkpoint is None or not checkpoint.is_active:
            raise RuntimeError("the dispatcher ended the transaction it was handed")
    except Exception as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            # The connection is gone (a database restart, a terminated backend): this is
            # no fault of the event, and nothing can be recorded on this transaction. Let
            # the poll fail whole with the real cause; the rows are pending again.
            raise
        first_error = error_text(exc)
    else:
        if result.refusal is None:
            batch.outbound.extend(result.outbound)
            outcome = dispatched(event, now)
            batch.outcomes.append(outcome)
            return outcome
        first_error = result.refusal
    replayed = _replay(batch, dispatcher, event, now, first_error, name)
    if replayed is not None:
        batch.outcomes.append(replayed)
    return replayed


def _dispatch_once(batch: Batch, dispatcher: Dispatcher, event: ClaimedEvent, now: datetime,
                   name: str) -> EventOutcome:
    """Run one event in a savepoint of its own: whatever it raises (or refuses), only its work
    is undone. Every event of a dispatcher that is not safe to repeat runs so, once per poll
    (DEC-1.4); so do the optimistic batch's replayed events after a failure (DEC-1).

    The savepoint travels ahead of the dispatcher's first statement (``pipeline.defer``), so a
    dispatcher that writes nothing costs no round trip; once it went out, it is released ahead
    of the next statement (the COMMIT ends any still pending), so savepoints never pile up."""
    session = batch.session
    savepoint = pipeline.command(f"SAVEPOINT {EVENT_SAVEPOINT}")
    pipeline.defer(session, savepoint)
    transaction = session.get_transaction()
    try:
        result = checked_result(dispatcher(session, event.as_event(), now))
        if transaction is None or not transaction.is_active:
            raise RuntimeError("the dispatcher ended the transaction it was handed")
    except Exception as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise  # nothing can be recorded on this transaction: the poll fails whole
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


def _replay(batch: Batch, dispatcher: Dispatcher, event: ClaimedEvent, now: datetime, first_error: str,
            name: str) -> EventOutcome | None:
    """``event`` failed under the checkpoint: roll back to it, replay the events since it
    one savepoint each, then run ``event`` again in a savepoint of its own.

    A stop is honoured between every two of these events (DEC-7): the events replayed so far
    keep their outcome, and the batch ends there (``None``): the rest, ``event`` included,
    were rolled back with the checkpoint, so the commit releases them ``pending``."""
    checkpoint, batch.checkpoint = batch.checkpoint, None
    if checkpoint is None or not checkpoint.is_active:
        # The dispatcher committed or rolled back the batch's transaction itself: there is
        # nothing left to roll back to, so the event is recorded failed as it stands.
        logger.error("%s: dispatch of scheduled event %s failed: %s", name, event.id, first_error)
        return failed(event, first_error, now)
    # ROLLBACK TO SAVEPOINT (nothing to undo if it was never sent): the claim's locks predate it
    # and stay held
    rollback_to_checkpoint(batch.session)
    start = batch.checkpoint_position
    earlier = batch.outcomes[start:]
    logger.info("%s: scheduled event %s failed (%s); replaying the %d event(s) before it in the batch, "
                "one savepoint each", name, event.id, first_error, len(earlier))
    del batch.outcomes[start:]
    del batch.outbound[batch.checkpoint_outbound:]
    for done, (previous, outcome) in enumerate(zip(batch.events[start:batch.position - 1], earlier, strict=True)):
        if _stopping(batch):
            _stopped_in_replay(batch, start + done, name)
            return None
        batch.outcomes.append(_dispatch_once(batch, dispatcher, previous, outcome.finished_at or now, name))
        batch.replayed += 1
    if _stopping(batch):
        _stopped_in_replay(batch, batch.position - 1, name)
        return None
    batch.replayed += 1
    return _dispatch_once(batch, dispatcher, event, now, name)


def _stopped_in_replay(batch: Batch, position: int, name: str) -> None:
    """A stop arrived mid-replay: the batch ends after the events before ``position``."""
    logger.info("%s: stop requested during a replay; %d event(s) left pending for the next poll",
                name, len(batch.events) - position)
    batch.position = position
    batch.stopped = True


def commit_batch(batch: Batch) -> None:
    """Record the batch's outcomes in one statement and commit, releasing its locks.

    Events not yet dispatched (a stop arrived mid-batch) were never touched, so committing
    releases them still ``pending`` for the next poll.
    """
    if batch.closed:
        raise RuntimeError("batch already finished")
    batch.closed = True
    try:
        settle_planned(batch)
        if batch.set_write is not None:
            decided = commit_set_based(batch)
            if decided is None:
                batch.session.commit()  # the set-based write went with the COMMIT: nothing is sent
                return
            if batch.per_event is not None:
                # the set-based write failed and was rolled back: the events it decided run per event
                dispatcher, clock, name = batch.per_event
                # a stop is honoured between every two events here too (DEC-7): the events not
                # reached were rolled back with the set-based write, and stay pending
                while batch.position < decided and not batch.stopped:
                    if _stopping(batch):
                        batch.stopped = True
                        break
                    _dispatch_next(batch, dispatcher, clock, name)
        unrecorded = batch.outcomes[batch.recorded:]  # the set-based statement wrote its own
        if batch.session.in_nested_transaction():
            # a savepoint the dispatcher left open: SQLAlchemy releases it before its COMMIT
            if unrecorded:
                batch.session.execute(statement("record_outcomes"), outcome_parameters(unrecorded))
            batch.session.commit()
            return
        # the outcomes and the COMMIT in one round trip; the checkpoint is not released first
        # (the COMMIT ends it); the session's commit then sends nothing
        pipeline.discard(batch.session)  # a checkpoint never sent stays unsent
        steps = [pipeline.named("record_outcomes", outcome_parameters(unrecorded), fetch=False)] if unrecorded else []
        pipeline.send(batch.session, [*steps, pipeline.command("COMMIT")])
        batch.session.commit()
    except BaseException:
        batch.session.rollback()
        raise
    finally:
        batch.session.close()


def abort_batch(batch: Batch) -> None:
    """Roll the batch back: every claimed row is pending again and its effects vanish."""
    if batch.closed:
        return
    batch.closed = True
    try:
        batch.session.rollback()
    finally:
        batch.session.close()
