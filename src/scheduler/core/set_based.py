"""The set-based batch (DEC-1, DEC-1.5): a whole batch decided at its first dispatch and
written with its COMMIT, a ``BatchStrategy``.

A dispatcher that can decide a batch at once (``BatchDispatcher``: the built-in platform,
whatever its channels, and the simulation's) reads what the decisions need and decides
every event in order, under the checkpoint; the batch's end sends the one statement that
writes every decision and outcome with the COMMIT. The later dispatches hand out what was
decided, so the step API (``claim``, ``dispatch_next``, ``finish``) is the same.

An event whose rules raise (or refuse it) fails alone and writes nothing, as per event.
Anything that fails as a whole (the read, the decisions, a write that differs from them:
DEC-1.2) rolls back to the checkpoint, and the batch is handed to its per-event strategy
from its first event: at the first dispatch, or at the end when the write failed.
"""

from __future__ import annotations

import logging
from typing import Any

from scheduler.core.batch import (
    FORMER_FIELDS,
    Batch,
    BatchStrategy,
    EventOutcome,
    dispatched,
    error_text,
    failed,
    outcome_parameters,
)
from scheduler.core.batch_transaction import (
    connection_lost,
    rollback_to_checkpoint,
    stopping,
    take_checkpoint,
)
from scheduler.core.dispatch_contract import NotADispatchResult, checked_result
from scheduler.database import pipeline
from scheduler.types import BatchDispatcher, Clock, DispatchResult, OutboundMessage

logger = logging.getLogger(__name__)

Planned = list[tuple[EventOutcome, list[OutboundMessage]]]


def decide_whole(batch: Batch, dispatcher: BatchDispatcher, clock: Clock, name: str,
                 fallback: BatchStrategy) -> SetBasedBatch | None:
    """Decide the whole batch under a fresh checkpoint; ``None`` when it could not be (the
    dispatcher has no set-based path for it, or it failed as a whole: rolled back, the batch
    runs through ``fallback``)."""
    now = clock.now()  # one time for the batch's decisions and outcomes
    session = batch.session
    take_checkpoint(session)
    try:
        decisions = dispatcher.decide_batch(session, [e.as_event() for e in batch.events], now, batch.should_stop)
        if decisions is None:
            rollback_to_checkpoint(session)
            return None
        planned: Planned = []
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
        if connection_lost(exc):
            raise
        logger.warning("%s: the set-based batch failed (%s); its %d event(s) run one by one",
                       name, error_text(exc), len(batch.events))
        rollback_to_checkpoint(session)
        return None
    return SetBasedBatch(planned, write, fallback, name)


class SetBasedBatch:
    """A batch decided whole: hands out its decisions, then writes them with the COMMIT."""

    decided_whole = True

    def __init__(self, planned: Planned, write: tuple[str, dict[str, Any]], fallback: BatchStrategy,
                 name: str) -> None:
        self.planned = planned  # each event's outcome and outbound, in batch order
        self.write = write  # the statement (name, parameters) that writes it all, outcomes too
        self.fallback = fallback
        self.name = name
        self.sent = False  # the write went out (with the COMMIT, or failed)

    def former_fields(self) -> dict[str, Any]:
        per_event = getattr(self.fallback, "dispatcher", None), getattr(self.fallback, "clock", None), self.name
        return {**FORMER_FIELDS, "planned": self.planned, "set_write": None if self.sent else self.write,
                "recorded": len(self.planned), "per_event": per_event}

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        """The next event's decided outcome (its pushes join the batch's); ``None`` past the
        events decided (a stop cut the batch short: it ends there)."""
        if batch.position >= len(self.planned):
            # fewer decisions than events: a stop arrived while they were taken (DEC-7), or the
            # dispatcher decided a part only; the rest are not reached and stay pending
            batch.stopped = True
            return None
        outcome, outbound = self.planned[batch.position]
        batch.position += 1
        batch.outcomes.append(outcome)
        batch.outbound.extend(outbound)
        return outcome

    def commit(self, batch: Batch) -> None:
        """Send the write with the COMMIT, in one round trip. When the write failed (it fails on
        rows other than decided, so the COMMIT did not run), roll back to the checkpoint and run
        the decided events again through the fallback, honouring a stop between every two
        (DEC-7.1): the events not reached were rolled back too, and stay pending."""
        # outcomes decided but not handed out (a stop arrived mid-batch) are part of the write
        while batch.position < len(self.planned):
            self.dispatch_next(batch)
        name, params = self.write
        session = batch.session
        self.sent = True
        try:
            batch.events_repository.commit_with(session, statement=name, params=params)
        except Exception as exc:
            if connection_lost(exc) or not pipeline.in_failed_transaction(session):
                raise  # the connection is gone, or the COMMIT itself failed: the poll fails whole
            logger.warning("%s: the set-based write failed (%s); the batch's %d event(s) run one by one",
                           self.name, error_text(exc), len(batch.events))
        else:
            session.commit()  # the write went with the COMMIT: nothing is sent
            return
        rollback_to_checkpoint(session)
        batch.position = 0
        batch.outcomes.clear()
        batch.outbound.clear()
        batch.strategy = self.fallback
        batch.stopped = False  # a plan cut short ended the batch; the decided events run again
        while batch.position < len(self.planned) and not batch.stopped:
            if stopping(batch):
                batch.stopped = True
                break
            self.fallback.dispatch_next(batch)
        self.fallback.commit(batch)
