"""Helpers for the reliability tests: bounded waits on conditions, never fixed sleeps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from reliability.cluster import wait_for
from sqlalchemy import Engine, text

from scheduler.core import store
from scheduler.database.database import Database


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll a condition until it holds (the deadline only turns a hang into a failure)."""
    return wait_for(predicate, timeout, what, interval=0.01)


def reminder(day: str = "2026-11-30") -> dict[str, Any]:
    return {"facts_version": "1", "scenario": "commitment_reminder", "date": day, "commitment": "run the dishwasher"}


def store_due(engine: Engine, users: list[str], trigger_at: datetime, facts: dict[str, Any] | None = None) -> list[str]:
    """Store one reminder per user, due before ``trigger_at`` (a second apart, in list order); return the ids."""
    sessions = Database(engine)
    ids = []
    for i, user in enumerate(users):
        row = store.store_event(sessions, event_type="reminder", user_id=user, community_id="community-1",
                                external_key=None, trigger_at=trigger_at - timedelta(seconds=len(users) - i),
                                facts=facts or reminder(), now=trigger_at)
        ids.append(row["id"])
    return ids


def statuses(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.id: r.status for r in conn.execute(text("SELECT id, status FROM scheduled_events"))}


def notifications_by_event(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT scheduled_event_id, count(*) AS n FROM notifications GROUP BY scheduled_event_id"))
        return {r.scheduled_event_id: r.n for r in rows}
