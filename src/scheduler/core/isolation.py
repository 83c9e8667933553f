"""Per-event isolation inside one batch transaction (REQ-0067): who runs a batch, and its end.

The claim's row locks must be held until each row's new status commits, and that status must
commit together with the event's effects; so a batch is one transaction, and every event
ends exactly as if it ran inside a SAVEPOINT of its own (DEC-1). One strategy owns a batch
from its first dispatch to its commit (``BatchStrategy``), chosen by what the dispatcher
declares (``choose_strategy``):

- it decides batches whole (``BatchDispatcher``): ``core.set_based``, with the per-event
  strategy below as its fallback (DEC-1.2, DEC-1.5);
- it is safe to call again after a rollback (``safe_to_repeat``): the optimistic batch, one
  checkpoint and a replay after a failure (``core.per_event.OptimisticBatch``, DEC-1);
- otherwise: a savepoint per event, called once per event (``SavepointPerEvent``, DEC-1.4).

The outcomes are kept in memory and written in one statement with the COMMIT
(``core.batch_transaction``).
"""

from __future__ import annotations

from scheduler.core.batch import Batch, BatchStrategy, EventOutcome
from scheduler.core.batch_transaction import commit_with_outcomes
from scheduler.core.dispatch_contract import repeatable
from scheduler.core.per_event import OptimisticBatch, SavepointPerEvent
from scheduler.core.set_based import decide_whole
from scheduler.types import BatchDispatcher, Clock, Dispatcher


def choose_strategy(batch: Batch, dispatcher: Dispatcher, clock: Clock, name: str) -> BatchStrategy:
    """The strategy that runs ``batch`` with ``dispatcher``: decided whole when it can be (at
    this, its first dispatch), else one event at a time. ``name`` (the replica's) labels the
    log lines."""
    per_event = (OptimisticBatch if repeatable(dispatcher) else SavepointPerEvent)(dispatcher, clock, name)
    if isinstance(dispatcher, BatchDispatcher) and batch.position == 0:
        whole = decide_whole(batch, dispatcher, clock, name, per_event)
        if whole is not None:
            return whole
    return per_event


def dispatch_next(batch: Batch, dispatcher: Dispatcher, clock: Clock, name: str) -> EventOutcome | None:
    """Dispatch the batch's next event, isolated from the others; ``None`` when none is left
    (a stop may end the batch early: the events not reached stay pending, DEC-7).

    The strategy, with ``dispatcher``, ``clock`` and ``name``, is chosen at the batch's first
    dispatch and runs the batch to its end: a dispatcher set on the scheduler mid-batch takes
    effect from the next batch."""
    if batch.closed:
        raise RuntimeError("batch already finished")
    if batch.remaining == 0:
        return None
    if batch.strategy is None:
        batch.strategy = choose_strategy(batch, dispatcher, clock, name)
    return batch.strategy.dispatch_next(batch)


def commit_batch(batch: Batch) -> None:
    """Record the batch's outcomes and commit, releasing its locks.

    Events not yet dispatched (a stop arrived mid-batch) were never touched, so committing
    releases them still ``pending`` for the next poll.
    """
    if batch.closed:
        raise RuntimeError("batch already finished")
    batch.closed = True
    try:
        if batch.strategy is None:
            commit_with_outcomes(batch.session, batch.outcomes, batch.events_repository)
        else:
            batch.strategy.commit(batch)
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
