"""The host's own dispatcher: one ``host_deliveries`` row per reminder, written in the
transaction the scheduler hands it (never committed here), so an event that fails, or a
batch that rolls back, leaves no row behind.

A participant who opted out with the host (``users.opted_out``) is refused: the dispatcher
returns a refusal, and the scheduler records the row ``failed`` with the reason in
``last_error`` and rolls back whatever this event wrote.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult

OPTED_OUT = text("SELECT opted_out FROM users WHERE id = :user_id")
DELIVER = text(
    "INSERT INTO host_deliveries (scheduled_event_id, user_id, body, delivered_at)"
    " VALUES (:event_id, :user_id, :body, :now)"
)


class HostDispatcher:
    """Writes the host's delivery row in the scheduler's transaction (the ``Dispatcher``
    contract: called in the loop's worker thread with a sync session; writes, never commits;
    returns a ``DispatchResult``)."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if session.execute(OPTED_OUT, {"user_id": event.user_id}).scalar():
            return DispatchResult(outcome=DispatchOutcome.INVALID_EVENT,
                                  refusal=f"{event.user_id} opted out of reminders with the host")
        body = f"Reminder: {event.facts.get('commitment', 'your commitment')}"
        session.execute(DELIVER, {"event_id": event.scheduled_event_id, "user_id": event.user_id,
                                  "body": body, "now": now})
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)
