"""Retention: old dispatched and cancelled rows, with their history, are deleted.

A table that only grows makes every replica slower to start and every operator query
slower to answer (a stuck scheduler in the public system wrote 141k audit rows). Rows that
reached ``dispatched`` or ``cancelled`` more than ``SCHEDULER_RETENTION_DAYS`` ago (their
``updated_at``, set from the injected clock) are deleted with their history; ``failed``
and ``pending`` rows are never deleted (an operator still has to look at a failed one).
Notifications and deliveries are the participant's record and feed the daily cap: they
are kept unless ``SCHEDULER_NOTIFICATION_RETENTION_DAYS`` (``notification_days``, at least 2,
the cap's window) is set; then notifications created longer ago go with their deliveries
(the in-app row, the delivered outbox rows), and so do a host dispatcher's delivered outbox
rows, which have no notification (RET-8). A notification with a delivery still ``queued``,
``retrying`` or ``undeliverable`` is kept with all its rows: an operator may still retry it
(it goes, once delivered, at a later run). The events go first, then the notifications, in
the same run and the same batch budget.

Who and when. ``Retention`` is a ``Scheduler.poll_hook``: after a poll, every replica may
try. One replica at a time is elected by an advisory lock (``pg_try_advisory_xact_lock``,
never waited for, taken again in every batch's transaction, so it needs no session and
works behind a transaction-pooling PgBouncer); the elected replica starts a run only if no
replica started one within the last hour by the injected clock (``scheduler_maintenance``
holds the time, shared by replicas and restarts). A run deletes in small batches, each its own short transaction
(``FOR UPDATE SKIP LOCKED``, so a row a re-post is changing right now is left for the next
run), at most ``max_batches`` per poll so the loop is never held up for long; a backlog is
carried on over the next polls of the same replica.

Heartbeats too. A run starts by deleting the heartbeat rows of replicas silent for
``replicas`` (``SCHEDULER_REPLICA_RETENTION_SECONDS``, a day): a killed replica, which never
deleted its own row, leaves ``/admin/replicas``, the console and the ``scheduler_replicas``
gauge within an hour of that (OBS-2). This runs with ``days=0`` as well: keeping every
finished event says nothing about the rows of processes long gone.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from scheduler.database.database import Database
from scheduler.types import Clock

logger = logging.getLogger(__name__)

TASK = "retention"
RETENTION_LOCK_KEY = int.from_bytes(hashlib.blake2b(b"nudging-retention", digest_size=8).digest(), "big", signed=True)
REPLICA_RETENTION = timedelta(days=1)  # SCHEDULER_REPLICA_RETENTION_SECONDS's default


@dataclass(frozen=True)
class RetentionReport:
    """One call that ran: rows deleted, batches used, whether the run is complete, the cutoff
    (rows finished before it go; with ``days=0`` the run's time, and none go), and the
    heartbeat rows of gone replicas it deleted (at the start of a run, else 0)."""

    deleted: int
    batches: int
    done: bool
    cutoff: datetime
    replicas_deleted: int = 0
    notifications_deleted: int = 0  # with ``deliveries_deleted`` of their and a host's outbox rows (RET-8)
    deliveries_deleted: int = 0


class Retention:
    """Deletes expired rows; call it after a poll (it is a ``poll_hooks`` entry)."""

    def __init__(
        self,
        database: Database,
        clock: Clock,
        *,
        days: int,
        batch_size: int = 500,
        max_batches: int = 20,
        interval: timedelta = timedelta(hours=1),
        name: str = "retention",
        replicas: timedelta = REPLICA_RETENTION,
        notification_days: int = 0,
    ) -> None:
        if days < 0:
            raise ValueError("days must be 0 (keep everything) or more")
        if notification_days < 0 or notification_days == 1:
            raise ValueError("notification_days must be 0 (keep every notification) or at least 2")
        if replicas <= timedelta(0):
            raise ValueError("replicas must be a positive window")
        self.database = database
        self.engine = database.engine
        self.clock = clock
        self.days = days
        self.notification_days = notification_days
        self.replicas = replicas
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.interval = interval
        self.name = name
        self._checked_at: datetime | None = None  # no database round trip within an interval of this
        self._resume: datetime | None = None  # the cutoff of a run this replica has not finished
        self._events_done = False  # that run deleted every expired event; the notifications are next
        self._notification_cutoff: datetime | None = None  # that run's, when notifications are pruned
        self.last_report: RetentionReport | None = None

    def __call__(self, scheduler: Any = None) -> None:
        """The poll hook: run if due (a failure is logged by the loop and retried next time)."""
        self.run_if_due()

    def run_if_due(self) -> RetentionReport | None:
        """Run (or carry on) retention if this replica is elected and a run is due: the gone
        replicas' heartbeats at the start of a run, then the expired events (none with ``days=0``)."""
        now = self.clock.now()
        checked = self._checked_at
        if self._resume is None and checked is not None and checked <= now < checked + self.interval:
            return None  # checked within the hour (a clock that went back checks again)
        with self.engine.connect() as conn:
            cutoff = self._resume
            replicas_deleted = 0
            if cutoff is None:
                if not self._elected(conn):
                    # another replica is deleting right now; it carries its run to the end
                    conn.rollback()
                    self._checked_at = now
                    return None
                started = self.database.operations.claim_maintenance_run(
                    conn, task=TASK, now=now, interval_seconds=self.interval.total_seconds())
                if started:
                    replicas_deleted = self.database.operations.delete_gone_replicas(conn, now - self.replicas)
                conn.commit()
                self._checked_at = now
                if not started:
                    return None  # a replica started a run within the interval
                if replicas_deleted:
                    logger.info("%s: deleted the heartbeats of %d replicas silent since %s", self.name,
                                replicas_deleted, (now - self.replicas).isoformat())
                if self.days == 0 and self.notification_days == 0:  # only the heartbeats are pruned
                    report = RetentionReport(0, 0, True, now, replicas_deleted)
                    self.last_report = report
                    return report
                cutoff = now - timedelta(days=self.days) if self.days else now
                self._events_done = self.days == 0  # days=0 keeps every finished event
                self._notification_cutoff = (now - timedelta(days=self.notification_days)
                                             if self.notification_days else None)
            return self._delete(conn, cutoff, replicas_deleted)

    def _elected(self, conn: Any) -> bool:
        """The election, for the current transaction only: a lock nobody waits for, released
        by the commit or the rollback (or the end of a dead connection's backend)."""
        return self.database.operations.try_retention_lock(conn, RETENTION_LOCK_KEY)

    def _delete(self, conn: Any, cutoff: datetime, replicas_deleted: int) -> RetentionReport:
        deleted = batches = notifications = deliveries = 0
        done = False
        try:
            while batches < self.max_batches:
                if not self._elected(conn):
                    break  # another replica took over meanwhile: carry on next poll
                if not self._events_done:
                    ids = self.database.operations.delete_finished(conn, cutoff=cutoff, batch_size=self.batch_size)
                    conn.commit()
                    deleted += len(ids)
                    batches += 1
                    self._events_done = len(ids) < self.batch_size
                    continue
                notification_cutoff = self._notification_cutoff
                if notification_cutoff is None:
                    done = True
                    break
                gone = self.database.operations.delete_old_notifications(conn, cutoff=notification_cutoff,
                                                                         batch_size=self.batch_size)
                conn.commit()
                notifications += gone["notifications"]
                deliveries += gone["deliveries"]
                batches += 1
                if gone["notifications"] < self.batch_size and gone["host_rows"] < self.batch_size:
                    done = True
                    break
        finally:
            conn.rollback()  # nothing is left open (a failed batch leaves its transaction aborted)
            self._resume = None if done else cutoff
            if done:
                self._events_done, self._notification_cutoff = False, None
        report = RetentionReport(deleted, batches, done, cutoff, replicas_deleted, notifications, deliveries)
        self.last_report = report
        if deleted:
            logger.info("%s: deleted %d rows finished before %s%s", self.name, deleted, cutoff.isoformat(),
                        "" if done else " (more next poll)")
        if notifications or deliveries:
            logger.info("%s: deleted %d notifications and %d deliveries older than %d days%s", self.name,
                        notifications, deliveries, self.notification_days, "" if done else " (more next poll)")
        return report
