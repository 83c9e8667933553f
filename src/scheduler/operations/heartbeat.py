"""Heartbeats: every process that runs the loop records a row after its polls, so any
replica (and the console) can see all of them.

The row is written by a ``Scheduler.poll_hooks`` hook with the injected clock's time. In
prompt mode polls can run back to back, so a heartbeat is written at most once per
``min_interval`` (one second by default) of that clock, except that a change in the
failure state (a poll failed, or the first good poll after failures) is written at once.
A replica is *stale* when its last heartbeat is older than three of its poll intervals;
rows of replicas silent for ``SCHEDULER_REPLICA_RETENTION_SECONDS`` (a day: a killed replica's)
are deleted by retention's hourly run (``scheduler.operations.retention``), and a replica
that stops cleanly deletes its own row.

The row's counters are this process's ``SchedulerHealth``: completed polls, dispatched,
failed and expired events, the same counts ``/metrics`` gives (OBS-7). ``list_replicas`` and
``replica_state`` are the one reading of the table and the one judgement of a row's state,
for ``/admin/replicas``, the console and the ``scheduler_replicas`` gauge alike.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.types import Clock

logger = logging.getLogger(__name__)

MIN_INTERVAL = timedelta(seconds=1)


def scheduler_mode(scheduler: Scheduler) -> str:
    """The loop's mode: ``literal`` or ``prompt`` (SCHEDULER_MODE, DEC-9)."""
    return str(scheduler.mode)


class Heartbeat:
    """A poll hook that upserts this process's row in ``scheduler_replicas``."""

    def __init__(
        self,
        database: Database,
        clock: Clock,
        *,
        replica_id: str | None = None,
        min_interval: timedelta = MIN_INTERVAL,
    ) -> None:
        self.database = database
        self.clock = clock
        self.replica_id = replica_id or uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.min_interval = min_interval
        self._written_at: datetime | None = None
        self._written_failures = 0
        self._warned = False

    def __call__(self, scheduler: Scheduler) -> None:
        now = self.clock.now()
        failures = scheduler.health.consecutive_failures
        due = self._written_at is None or now - self._written_at >= self.min_interval
        if not due and (failures > 0) == (self._written_failures > 0):
            return
        try:
            self.write(scheduler, now)
        except DBAPIError as exc:
            # The poll that just failed has already logged the outage with its traceback.
            if not self._warned:
                logger.warning("%s: heartbeat not recorded (%s)", scheduler.name, type(exc).__name__)
                self._warned = True
            return
        self._warned = False
        self._written_at = now
        self._written_failures = failures

    def write(self, scheduler: Scheduler, now: datetime) -> None:
        """Upsert this replica's row now."""
        health = scheduler.health
        with self.database.begin() as session:
            self.database.operations.write_heartbeat(
                session,
                {
                    "replica_id": self.replica_id,
                    "name": scheduler.name,
                    "host": self.host,
                    "pid": self.pid,
                    "mode": scheduler_mode(scheduler),
                    "poll_seconds": float(scheduler.poll_seconds),
                    "started_at": health.started_at or now,
                    "last_poll_at": health.last_poll_at,
                    "now": now,
                    "last_error": health.last_error if health.consecutive_failures else None,
                    "consecutive_failures": health.consecutive_failures,
                    "polls": health.polls,
                    "dispatched": health.dispatched,
                    "failed": health.failed,
                    "expired": health.expired,
                },
            )

    def forget(self) -> None:
        """Delete this replica's row (a clean stop): it leaves the list instead of going stale."""
        try:
            with self.database.begin() as session:
                self.database.operations.delete_replica(session, self.replica_id)
        except DBAPIError as exc:
            logger.warning("heartbeat row %s not removed on stop (%s); it will show as stale",
                           self.replica_id, type(exc).__name__)


def replica_state(row: dict[str, Any]) -> str:
    """``stale`` (silent three intervals), ``failing`` (its last poll failed) or ``ok``."""
    if row["stale"]:
        return "stale"
    if row["consecutive_failures"]:
        return "failing"
    return "ok"


def replica_rows(session: Session, database: Database, now: datetime) -> list[dict[str, Any]]:
    """Every replica's heartbeat, with ``stale`` and ``state`` judged at ``now``, in ``session``."""
    rows = database.operations.list_replicas(session, now)
    for row in rows:
        row["state"] = replica_state(row)
    return rows


def list_replicas(database: Database, now: datetime) -> list[dict[str, Any]]:
    """Every replica's heartbeat, with ``stale`` and ``state`` judged at ``now``."""
    with database.begin() as session:
        return replica_rows(session, database, now)


def replicas_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()} for row in rows]
