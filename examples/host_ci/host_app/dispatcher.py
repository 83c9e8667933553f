"""The host's dispatcher: one ``host_deliveries`` row per event, written in the scheduler's
transaction (the session it is handed), so a rolled-back event or batch leaves no row.

Participants the host knows have opted out (``OPTED_OUT``) are refused, in either of the two
ways the dispatcher contract allows (docs/embedding.md): ``DeliveryDispatcher`` raises,
``RefusingDispatcher`` returns ``DispatchResult(refusal=...)``. Either way the scheduler
records the row as failed with the reason in ``last_error``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult

OPTED_OUT = frozenset({"p3"})

CREATE = text(
    "CREATE TABLE IF NOT EXISTS host_deliveries ("
    " id bigserial PRIMARY KEY,"
    " event_id text NOT NULL,"
    " user_id text NOT NULL,"
    " body text NOT NULL,"
    " delivered_at timestamptz NOT NULL)"
)
EMPTY = text("TRUNCATE host_deliveries")
INSERT = text(
    "INSERT INTO host_deliveries (event_id, user_id, body, delivered_at)"
    " VALUES (:event_id, :user_id, :body, :now)"
)


class OptedOut(RuntimeError):
    """The participant asked the host for no reminders."""


def create_tables(connection: Connection) -> None:
    """The host's own table, created once and emptied before every simulated run."""
    connection.execute(CREATE)
    connection.execute(EMPTY)


def delivery(event: DigitalTwinEvent, now: datetime) -> dict[str, object]:
    if event.user_id in OPTED_OUT:
        raise OptedOut(f"{event.user_id} opted out of reminders")
    body = f"Reminder: {event.facts.get('commitment', 'your commitment')}"
    return {"event_id": event.scheduled_event_id, "user_id": event.user_id, "body": body, "now": now}


class DeliveryDispatcher:
    """Writes the delivery in the session the scheduler hands it, and never commits; raises
    for an opted-out participant."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        session.execute(INSERT, delivery(event, now))
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)


class RefusingDispatcher:
    """The same deliveries; an opted-out participant's event is refused by returning the
    reason, as docs/embedding.md shows, instead of raising."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if event.user_id in OPTED_OUT:
            return DispatchResult(outcome=DispatchOutcome.INVALID_EVENT, refusal="opted out")
        session.execute(INSERT, delivery(event, now))
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)
