"""Whether the outbox keeps up (HEALTH-4): the longest a due delivery has waited.

``/health/scheduler`` says ``degraded`` when an outbox row has been due and unsent for longer
than ``SCHEDULER_DELIVERY_STALE_SECONDS``: queued (due from the moment it was written) or
retrying past its ``next_attempt_at``. The outbox is shared by every replica, so this is the
deployment's state, not this replica's: the answer stays 200 (a load balancer that took every
replica out for a provider that is down would stop the reminders too) and the state and the
reason say it. The reading is one statement on the first entry of ``ix_deliveries_due``,
cached for a few seconds of the injected clock so frequent health checks cost nothing more,
and read only by the health routes (never on the poll's path). A database that cannot be
read gives no reading: the loop's own state says that.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy.exc import DBAPIError

from scheduler.database.database import Database
from scheduler.types import Clock

logger = logging.getLogger(__name__)

CACHE = timedelta(seconds=5)


class OutboxHealth:
    """The longest a due outbox row has waited, and whether that is past the threshold."""

    def __init__(self, database: Database, clock: Clock, *, stale_seconds: float, cache: timedelta = CACHE) -> None:
        self.database = database
        self.clock = clock
        self.stale_seconds = stale_seconds
        self.cache = cache
        self._cached: tuple[datetime, float | None] | None = None
        self._lock = threading.Lock()

    def overdue_seconds(self) -> float | None:
        """Seconds the longest-due row has waited (0.0 when none is due); None: unreadable."""
        now = self.clock.now()
        with self._lock:
            cached = self._cached
            if cached is not None and cached[0] <= now < cached[0] + self.cache:
                return cached[1]
            try:
                with self.database.begin() as session:
                    seconds = self.database.deliveries.oldest_due_seconds(session, now)
            except DBAPIError:
                # unreadable for the cache's while too: a health check never waits on a dead database twice
                logger.debug("the outbox's health could not be read", exc_info=True)
                self._cached = (now, None)
                return None
            value = 0.0 if seconds is None else seconds
            self._cached = (now, value)
            return value

    def stale(self, overdue: float | None) -> bool:
        return overdue is not None and overdue > self.stale_seconds
