"""What is read and set of a participant: their notifications and their preferences.

The API's participant routes run these; each is one short transaction, and answers rows as
the API shows them (times in ISO 8601).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from scheduler.core import store
from scheduler.database.database import Database, row_as_json
from scheduler.nudging.local_time import DEFAULT_TIME_ZONE_NAME, QuietHours
from scheduler.nudging.orchestrator import DEFAULT_MAX_PER_DAY


def list_notifications(database: Database, *, user_id: str | None, status: str | None,
                       limit: int) -> list[dict[str, Any]]:
    """Notifications, of one participant (``user_id``) or everyone's, in one status or any,
    at most ``limit``."""
    return store.list_notifications(database, user_id=user_id, status=status, limit=limit)


def list_deliveries(database: Database, *, status: str | None, channel: str | None,
                    user_id: str | None, notification_id: str | None, limit: int) -> list[dict[str, Any]]:
    """Deliveries (the in-app log and the outbox's rows with every attempt's record), newest
    first, filtered by status, channel, participant and notification, at most ``limit``."""
    return store.list_deliveries(database, status=status, channel=channel, user_id=user_id,
                                 notification_id=notification_id, limit=limit)


def set_preferences(database: Database, user_id: str, *, enabled_kinds: Sequence[str] | None,
                    max_per_day: int, now: datetime, time_zone: str | None = None,
                    quiet_hours: QuietHours | None = None) -> dict[str, Any]:
    """Set a participant's preferences (the kinds they accept, their daily cap, their time zone
    and quiet hours, already parsed: ``parse_time_zone``, ``parse_quiet_hours``); the stored
    row as the API shows it. A change of the zone or the quiet hours releases their held rows
    (QUIET-5)."""
    row = store.set_preferences(database, user_id, enabled_kinds=enabled_kinds, max_per_day=max_per_day, now=now,
                                time_zone=time_zone,
                                quiet_start=None if quiet_hours is None else quiet_hours.start,
                                quiet_end=None if quiet_hours is None else quiet_hours.end)
    return preferences_as_json(row)


def get_preferences(database: Database, user_id: str) -> dict[str, Any]:
    """A participant's preferences as the API shows them; the defaults (every kind, the
    default cap, UTC, no quiet hours, ``updated_at`` null) when none were ever set."""
    row = store.get_preferences(database, user_id)
    if row is None:
        return {"user_id": user_id, "enabled_kinds": None, "max_per_day": DEFAULT_MAX_PER_DAY,
                "time_zone": DEFAULT_TIME_ZONE_NAME, "quiet_hours": None, "updated_at": None}
    return preferences_as_json(row)


def preferences_as_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A preferences row as the API shows it: the zone's name (UTC when none is stored) and
    the quiet hours as ``{"start": "HH:MM", "end": "HH:MM"}`` or null."""
    start, end = row["quiet_hours_start"], row["quiet_hours_end"]
    return row_as_json({
        "user_id": row["user_id"], "enabled_kinds": row["enabled_kinds"], "max_per_day": row["max_per_day"],
        "time_zone": row["time_zone"] or DEFAULT_TIME_ZONE_NAME,
        "quiet_hours": None if start is None or end is None else QuietHours(start, end).as_json(),
        "updated_at": row["updated_at"],
    })


__all__ = ["get_preferences", "list_deliveries", "list_notifications", "preferences_as_json", "set_preferences"]
