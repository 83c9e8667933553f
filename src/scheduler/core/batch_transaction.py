"""The batch's transaction: its two savepoints, the rollback to them, and the commit that
carries the outcomes (DEC-1, "Round trips"; DEC-1.4).

Both savepoints have names of their own, unknown to SQLAlchemy's session, and are deferred
(``database.pipeline.defer``): each travels ahead of the next statement, so a dispatcher that
writes nothing never sends one. The checkpoint is never released (the COMMIT ends it).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from scheduler.core.batch import Batch, EventOutcome, outcome_parameters
from scheduler.database import pipeline
from scheduler.database.events import EventRepository

# The optimistic or set-based run's one savepoint, taken before the batch's first event.
CHECKPOINT = "scheduler_checkpoint"
# The savepoint of one event run alone (DEC-1.4, and the replay after a failure).
EVENT_SAVEPOINT = "scheduler_event"


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone (a database restart, a terminated backend):
    no fault of an event, and nothing can be recorded on this transaction, so the poll fails
    whole with the real cause and its rows are pending again."""
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def stopping(batch: Batch) -> bool:
    """Whether the poll's stop has arrived: asked between every two events of a replay and of a
    fallback (``Scheduler.poll_once`` asks between those of the first pass), DEC-7.1."""
    return batch.should_stop is not None and batch.should_stop()


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


def commit_with_outcomes(session: Session, unrecorded: Sequence[EventOutcome], events: EventRepository) -> None:
    """Write ``unrecorded`` (``record_outcomes``) and COMMIT, in one round trip; the checkpoint
    is not released first (the COMMIT ends it) and one never sent stays unsent."""
    if session.in_nested_transaction():
        # a savepoint the dispatcher left open: SQLAlchemy releases it before its COMMIT
        if unrecorded:
            events.record_outcomes(session, outcome_parameters(list(unrecorded)))
        session.commit()
        return
    pipeline.discard(session)
    if unrecorded:
        events.commit_with(session, statement="record_outcomes", params=outcome_parameters(list(unrecorded)))
    else:
        events.commit_with(session)
    session.commit()  # the COMMIT went out with the outcomes: the session's sends nothing
