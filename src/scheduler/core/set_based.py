"""The set-based batch (DEC-1): a whole batch decided and written in two statements.

When the dispatcher can decide a batch at once (``BatchDispatcher``, the production
``NudgingPlatform`` whatever its channels, DEC-1.5), the batch's first dispatch reads what
the decisions need in one statement and decides every event in Python in batch order,
under a checkpoint savepoint; the batch's end writes every decision with the batch's
outcomes in one more statement, sent with the COMMIT. The savepoint travels with the read
and the write with the COMMIT, each pair in one round trip (``database.pipeline``); the
savepoint is never released (the COMMIT ends it). The later dispatches hand out the
outcomes already decided, so the harness's step API (``claim``, ``dispatch_next``,
``finish``) is unchanged.

Isolation stays exact. An event whose rules raise (or refuse it) fails alone: its result
is its error and it writes nothing, as the per-event path would leave it. Anything else
that goes wrong (a database error in the read or the write, a write that differs from the
decisions: the statement fails, so the COMMIT after it does not run) rolls back to the
checkpoint, undoing every set-based write, and the batch takes the per-event path from its
first event (``core.isolation``): at its first dispatch, or at its end when the write failed.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from scheduler.core.batch import (
    Batch,
    EventOutcome,
    dispatched,
    error_text,
    failed,
    outcome_parameters,
)
from scheduler.core.dispatch_contract import NotADispatchResult, checked_result
from scheduler.database import pipeline
from scheduler.types import BatchDispatcher, Clock, Dispatcher, DispatchResult, OutboundMessage

logger = logging.getLogger(__name__)

# The batch's checkpoint: a savepoint of its own name, unknown to SQLAlchemy's session (sent
# ahead of the batch's first statement after the claim, rolled back by name on a failure,
# ended by the COMMIT), for the set-based and the per-event run alike (``core.isolation``).
CHECKPOINT = "scheduler_checkpoint"


def dispatch_set_based(batch: Batch, dispatcher: Dispatcher, clock: Clock, name: str) -> bool:
    """Decide the whole batch set-based, once, before its first event; return whether it
    did (``False``: the batch runs per event, its checkpoint not yet taken). The write
    waits for the batch's end (``commit_set_based``)."""
    if batch.planned is not None:
        return bool(batch.planned)
    batch.planned = []
    if not isinstance(dispatcher, BatchDispatcher) or batch.position != 0 or not batch.events:
        return False
    now = clock.now()  # one time for the batch's decisions and outcomes
    session = batch.session
    pipeline.defer(session, pipeline.command(f"SAVEPOINT {CHECKPOINT}"))
    try:
        decisions = dispatcher.decide_batch(session, [e.as_event() for e in batch.events], now, batch.should_stop)
        if decisions is None:
            # no set-based path for this dispatcher: the per-event path takes its own checkpoint
            rollback_to_checkpoint(session)
            return False
        planned: list[tuple[EventOutcome, list[OutboundMessage]]] = []
        # fewer results than events: a stop arrived, the rest stay untouched (DEC-7)
        for event, decided in zip(batch.events[:len(decisions.results)], decisions.results, strict=True):
            result: DispatchResult | Exception = decided
            if not isinstance(decided, Exception):
                try:  # a value that is not a DispatchResult fails its own event, as per event
                    result = checked_result(decided)
                except NotADispatchResult as exc:
                    result = exc
            if isinstance(result, Exception):
                logger.error("%s: dispatch of scheduled event %s failed: %s", name, event.id, error_text(result),
                             exc_info=result)
                planned.append((failed(event, error_text(result), now), []))
            elif result.refusal is not None:
                planned.append((failed(event, result.refusal, now), []))
            else:
                planned.append((dispatched(event, now), list(result.outbound)))
        write = decisions.write_statement(outcome_parameters([o for o, _ in planned]))
    except Exception as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise  # nothing can be recorded on this transaction: the poll fails whole
        logger.warning("%s: the set-based batch failed (%s); its %d event(s) run one by one",
                       name, error_text(exc), len(batch.events))
        rollback_to_checkpoint(session)
        return False
    batch.planned = planned
    batch.set_write = write
    batch.recorded = len(planned)
    batch.per_event = (dispatcher, clock, name)
    return True


def commit_set_based(batch: Batch) -> int | None:
    """Send the set-based write with the COMMIT, in one round trip; ``None`` when it
    committed. When the write failed (its statement fails on rows other than decided, so
    the COMMIT did not run), roll back to the checkpoint and reset the batch to its first
    event; return how many of its events the caller runs per event (those decided)."""
    if batch.set_write is None:
        return None
    name, params = batch.set_write
    batch.set_write = None
    session = batch.session
    try:
        pipeline.send(session, [pipeline.named(name, params, fetch=False), pipeline.command("COMMIT")])
    except Exception as exc:
        if (isinstance(exc, DBAPIError) and exc.connection_invalidated) or not pipeline.in_failed_transaction(session):
            raise  # the connection is gone, or the COMMIT itself failed: the poll fails whole
        replica = batch.per_event[2] if batch.per_event else "scheduler"
        logger.warning("%s: the set-based write failed (%s); the batch's %d event(s) run one by one",
                       replica, error_text(exc), len(batch.events))
        rollback_to_checkpoint(session)
        decided = len(batch.planned or [])
        batch.position, batch.recorded, batch.planned = 0, 0, []
        batch.outcomes.clear()
        batch.outbound.clear()
        return decided
    return None


def rollback_to_checkpoint(session: Session) -> None:
    """Undo whatever ran since the batch's checkpoint: roll back to its savepoint if it was
    sent (the claim's row and participant locks predate it and stay held), else drop it
    unsent (nothing ran since). SQLAlchemy does not know this savepoint, so the session's
    objects are expunged, as its own rollback to a savepoint would expire them."""
    if not pipeline.discard(session):
        session.connection().exec_driver_sql(f"ROLLBACK TO SAVEPOINT {CHECKPOINT}")
        session.expunge_all()


def next_planned(batch: Batch) -> EventOutcome | None:
    """Hand out the next event's outcome decided set-based (its pushes join the batch's);
    ``None`` past the events decided (a stop cut the batch short: it ends there)."""
    planned = batch.planned or []
    if batch.position >= len(planned):
        return None
    outcome, outbound = planned[batch.position]
    batch.position += 1
    batch.outcomes.append(outcome)
    batch.outbound.extend(outbound)
    return outcome


def settle_planned(batch: Batch) -> None:
    """Before the commit: outcomes decided but not yet handed out (a stop arrived
    mid-batch) are part of what the write commits, so they join the batch's report."""
    while batch.planned and batch.position < len(batch.planned):
        next_planned(batch)
