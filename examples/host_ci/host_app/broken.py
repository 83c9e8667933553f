"""A deliberately broken variant of the host's dispatcher, for the simulation to find.

It writes its delivery row on a connection of its own, in autocommit, instead of in the
session the scheduler hands it: the row is committed before the scheduler's transaction
is, so an event that fails after it (or a batch that rolls back: a crash, a killed
backend, a failed commit) keeps a delivery nobody dispatched.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from host_app.dispatcher import INSERT, delivery
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult


class OutsideTransactionDispatcher:
    """The bug: ``engine.begin()`` of its own, committed at once, beside the scheduler's."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        row = delivery(event, now)
        if self.engine is None:
            url = session.get_bind().engine.url
            self.engine = create_engine(url, poolclass=NullPool)  # a connection per write, closed after it
        with self.engine.begin() as own:
            own.execute(INSERT, row)
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)
