"""What is read and set of a participant: their notifications and their preferences.

The API's participant routes run these; each is one short transaction, and answers rows as
the API shows them (times in ISO 8601).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from scheduler.core import store
from scheduler.database.database import Database


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
                    max_per_day: int, now: datetime) -> dict[str, Any]:
    """Set a participant's preferences (the kinds they accept, their daily cap); the stored row."""
    return store.set_preferences(database, user_id, enabled_kinds=enabled_kinds, max_per_day=max_per_day, now=now)


__all__ = ["list_deliveries", "list_notifications", "set_preferences"]
