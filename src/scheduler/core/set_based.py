"""The set-based batch (DEC-1): a whole batch decided and written in two statements.

When the dispatcher can decide a batch at once (``BatchDispatcher``, the production
``NudgingPlatform`` with only the in-app channel), the batch's first dispatch reads what
the decisions need in one statement, decides every event in Python in batch order, and
writes every decision with the batch's outcomes in one more, under the checkpoint
savepoint. The later dispatches hand out the outcomes already decided, so the harness's
step API (``claim``, ``dispatch_next``, ``finish``) is unchanged.

Isolation stays exact. An event whose rules raise (or refuse it) fails alone: its result
is its error and it writes nothing, as the per-event path would leave it. Anything else
that goes wrong (a database error, a write that differs from the decisions) rolls back to
the checkpoint, undoing every set-based write, and the batch takes the per-event path
from its first event (``core.isolation``).
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError

from scheduler.core.batch import (
    Batch,
    EventOutcome,
    dispatched,
    error_text,
    failed,
    outcome_parameters,
)
from scheduler.types import BatchDispatcher, Clock, Dispatcher, OutboundMessage

logger = logging.getLogger(__name__)


def dispatch_set_based(batch: Batch, dispatcher: Dispatcher, clock: Clock, name: str) -> bool:
    """Decide and write the whole batch set-based, once, before its first event; return
    whether it did (``False``: the batch runs per event, its checkpoint not yet taken)."""
    if batch.planned is not None:
        return bool(batch.planned)
    batch.planned = []
    if not isinstance(dispatcher, BatchDispatcher) or batch.position != 0 or not batch.events:
        return False
    now = clock.now()  # one time for the batch's decisions and outcomes
    checkpoint = batch.session.begin_nested()
    try:
        decisions = dispatcher.decide_batch(batch.session, [e.as_event() for e in batch.events], now)
        if decisions is None:
            # no set-based path for this dispatcher: the savepoint is the per-event checkpoint
            batch.checkpoint, batch.checkpoint_position, batch.checkpoint_outbound = checkpoint, 0, len(batch.outbound)
            return False
        planned: list[tuple[EventOutcome, list[OutboundMessage]]] = []
        for event, result in zip(batch.events, decisions.results, strict=True):
            if isinstance(result, Exception):
                logger.error("%s: dispatch of scheduled event %s failed: %s", name, event.id, error_text(result),
                             exc_info=result)
                planned.append((failed(event, error_text(result), now), []))
            elif result.refusal is not None:
                planned.append((failed(event, result.refusal, now), []))
            else:
                planned.append((dispatched(event, now), list(result.outbound)))
        decisions.write(batch.session, outcome_parameters([o for o, _ in planned]))
    except Exception as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise  # nothing can be recorded on this transaction: the poll fails whole
        logger.warning("%s: the set-based batch failed (%s); its %d event(s) run one by one",
                       name, error_text(exc), len(batch.events))
        if checkpoint.is_active:
            checkpoint.rollback()  # ROLLBACK TO SAVEPOINT: the claim's locks predate it
        return False
    batch.checkpoint = checkpoint  # released at the commit
    batch.planned = planned
    batch.recorded = len(planned)
    return True


def next_planned(batch: Batch) -> EventOutcome:
    """Hand out the next event's outcome decided set-based (its pushes join the batch's)."""
    outcome, outbound = (batch.planned or [])[batch.position]
    batch.position += 1
    batch.outcomes.append(outcome)
    batch.outbound.extend(outbound)
    return outcome


def settle_planned(batch: Batch) -> None:
    """Before the commit: outcomes decided and written but not yet handed out (a stop
    arrived mid-batch) are part of what commits, so they join the batch's report."""
    while batch.planned and batch.position < len(batch.planned):
        next_planned(batch)
