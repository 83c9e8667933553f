"""A deliberately broken variant of the host's dispatcher, for the simulation to find.

It writes the delivery row on a connection of its own, committed at once, instead of in the
session the scheduler hands it: a reminder whose dispatch then fails, or whose batch rolls
back, keeps a delivery nobody sent. The host's simulation has no check of its own for this:
the harness's rollback probe (SIM-HOST-8) finds it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from host_service.dispatcher import DELIVER, OPTED_OUT
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult


class OwnConnectionDispatcher:
    """The bug: ``engine.begin()`` of its own, committed beside the scheduler's transaction."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if session.execute(OPTED_OUT, {"user_id": event.user_id}).scalar():
            return DispatchResult(outcome=DispatchOutcome.INVALID_EVENT,
                                  refusal=f"{event.user_id} opted out of reminders with the host")
        if self.engine is None:
            self.engine = create_engine(session.get_bind().engine.url, poolclass=NullPool)
        with self.engine.begin() as own:
            own.execute(DELIVER, {"event_id": event.scheduled_event_id, "user_id": event.user_id,
                                  "body": "Reminder", "now": now})
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)
