"""The observer: a connection of its own that reads committed state and PostgreSQL's lock table.

It never writes to the scheduler's tables during a run (only ``truncate`` before one), and it
takes no row locks, so looking never changes what the replicas do.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import Engine, create_engine, text

ROWS = text(
    "SELECT id, external_key, user_id, trigger_at, status,"
    " CAST(facts->>'sim_version' AS integer) AS version,"
    " last_error IS NOT NULL AS has_error, dispatched_at IS NOT NULL AS has_dispatched_at"
    " FROM scheduler.scheduled_events"
)
NOTIFICATIONS = text("SELECT id, scheduled_event_id, status, reason FROM scheduler.notifications")
SENT_PER_DAY = text(
    "SELECT user_id, CAST(created_at AT TIME ZONE 'UTC' AS date) AS day, count(*) AS sent"
    " FROM scheduler.deliveries WHERE status = 'sent' GROUP BY 1, 2"
)
SENT_PER_KEY = text(
    "SELECT dedup_key, count(*) AS sent FROM scheduler.notifications WHERE status = 'sent'"
    " GROUP BY dedup_key HAVING count(*) > 1"
)
WAITING = text("SELECT pid, locktype FROM pg_locks WHERE NOT granted AND pid = ANY(:pids)")
HELD = text("SELECT pid, locktype, mode FROM pg_locks WHERE granted AND pid = ANY(:pids)")
ACTIVITY = text("SELECT pid, state FROM pg_stat_activity WHERE pid = ANY(:pids)")
# A backend that cannot move by itself: in a transaction but idle, or waiting on a lock.
STUCK = text(
    "SELECT pid FROM pg_stat_activity WHERE pid = ANY(:pids)"
    " AND (state LIKE 'idle in transaction%' OR (state = 'active' AND wait_event_type = 'Lock'))"
)
BLOCKERS = text("SELECT pid, pg_blocking_pids(pid) AS blockers FROM unnest(CAST(:pids AS integer[])) AS pid")
TERMINATE = text("SELECT pg_terminate_backend(:pid, 10000)")
TRUNCATE = text(
    "TRUNCATE scheduler.scheduled_events, scheduler.notifications, scheduler.deliveries, scheduler.dedup_keys, "
    "scheduler.participant_preferences"
)
# A leftover session of an earlier run must not make the next one hang: fail instead.
TRUNCATE_LOCK_TIMEOUT = text("SET lock_timeout = '30s'")


@dataclass(frozen=True)
class DbRow:
    id: str
    external_key: str | None
    user_id: str
    trigger_at: datetime
    status: str
    version: int
    has_error: bool
    has_dispatched_at: bool


class StateObserver:
    """Reads what is committed, who waits on which lock, and which backends are alive."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)
        self.conn = self.engine.connect()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()

    def _all(self, query: Any, params: dict[str, Any] | None = None) -> list[Any]:
        return list(self.conn.execute(query, params or {}).all())

    def truncate(self) -> None:
        self.conn.execute(TRUNCATE_LOCK_TIMEOUT)
        self.conn.execute(TRUNCATE)

    def rows(self) -> dict[str, DbRow]:
        return {r.id: DbRow(*r) for r in self._all(ROWS)}

    def notifications(self) -> list[tuple[str, str | None, str, str | None]]:
        return [(r.id, r.scheduled_event_id, r.status, r.reason) for r in self._all(NOTIFICATIONS)]

    def sent_per_day(self) -> dict[tuple[str, date], int]:
        return {(r.user_id, r.day): int(r.sent) for r in self._all(SENT_PER_DAY)}

    def keys_sent_twice(self) -> dict[str, int]:
        return {r.dedup_key: int(r.sent) for r in self._all(SENT_PER_KEY)}

    def waiting(self, pids: Iterable[int]) -> dict[int, str]:
        """pid -> locktype, for the given backends that wait on a lock right now."""
        pids = [p for p in pids if p]
        if not pids:
            return {}
        return {r.pid: r.locktype for r in self._all(WAITING, {"pids": pids})}

    def held_locks(self, pids: Iterable[int]) -> dict[int, list[str]]:
        pids = [p for p in pids if p]
        if not pids:
            return {}
        held: dict[int, list[str]] = {}
        for r in self._all(HELD, {"pids": pids}):
            held.setdefault(r.pid, []).append(f"{r.locktype}/{r.mode}")
        return held

    def states(self, pids: Iterable[int]) -> dict[int, str | None]:
        pids = [p for p in pids if p]
        if not pids:
            return {}
        return {r.pid: r.state for r in self._all(ACTIVITY, {"pids": pids})}

    def stuck(self, pids: Iterable[int]) -> set[int]:
        pids = [p for p in pids if p]
        if not pids:
            return set()
        return {r.pid for r in self._all(STUCK, {"pids": pids})}

    def blockers(self, pids: Iterable[int]) -> dict[int, list[int]]:
        pids = [p for p in pids if p]
        if not pids:
            return {}
        return {r.pid: list(r.blockers or []) for r in self._all(BLOCKERS, {"pids": pids})}

    def terminate(self, pid: int) -> bool:
        """``pg_terminate_backend`` from this session; returns once the backend has exited."""
        return bool(self.conn.execute(TERMINATE, {"pid": pid}).scalar())

    def alive(self, pids: Iterable[int]) -> list[int]:
        return list(self.states(pids))

    def wait_gone(self, pid: int, timeout: float = 30.0) -> None:
        """Wait until a backend whose client hung up has exited (its locks are then free)."""
        deadline = time.monotonic() + timeout
        while self.states([pid]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"backend {pid} did not exit within {timeout:g}s")
            time.sleep(0.001)  # polling a condition, not a timed wait: PostgreSQL shows no event
