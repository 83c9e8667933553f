"""Clocks. Scheduler SQL never asks the database for the time: it binds ``:now`` from the
injected clock. In production that clock *is* the database's (``DatabaseClock``, DEC-10);
tests and the simulation inject a clock they control (``ManualClock``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from scheduler.types import Clock

if TYPE_CHECKING:
    from sqlalchemy import Engine

logger = logging.getLogger(__name__)


class SystemClock:
    """The wall clock, in UTC. Honours freezegun, since it calls ``datetime.now``."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to: the simulation's single source of time."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime")
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move forwards (or backwards, with a negative delta) and return the new time."""
        with self._lock:
            self._now = self._now + delta
            return self._now

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime")
        with self._lock:
            self._now = when


class OffsetClock:
    """Another clock shifted by a fixed offset: a host whose wall clock is wrong (the
    simulation's skewed replicas; ``offset`` may change, as an NTP step would)."""

    def __init__(self, base: Clock, offset: timedelta = timedelta(0)) -> None:
        self.base = base
        self.offset = offset

    def now(self) -> datetime:
        return self.base.now() + self.offset


class ClockNotReady(RuntimeError):
    """Production's clock has not read the database's time yet: nothing may be judged due."""


def ensure_ready(clock: Clock) -> None:
    """Refuse to go on while ``clock`` is a ``DatabaseClock`` that has never read the
    database's time (its ``now()`` would be the host's); every other clock is ready."""
    if isinstance(clock, DatabaseClock) and not clock.synced:
        raise ClockNotReady("the database's clock has not been read yet (DEC-10); the claim waits for it")


class DatabaseClock:
    """The database server's clock, as this process measures it (DEC-10).

    ``sync()`` reads the server's time (``read_server_time``: ``SELECT clock_timestamp()``
    in production) and anchors it to this process's monotonic clock; ``now()`` is that
    server time plus the monotonic seconds since, so it never reads the host's wall clock
    at all: a host clock that is minutes off, or that NTP steps, changes nothing. The
    anchor is the server's time paired with the monotonic time *after* the answer arrived,
    so ``now()`` can only lag the server by up to one round trip, never lead it: a
    reminder never leaves before its trigger by the database's clock.

    Before the first successful sync (the database unreachable at start) ``now()`` is the
    host's clock, and ``synced`` says so. ``offset_seconds`` (server minus host wall clock,
    measured at the last sync) is the ``scheduler_clock_offset_seconds`` metric; the log
    warns once when it exceeds ``warn_seconds``.
    """

    def __init__(
        self,
        read_server_time: Callable[[], datetime],
        *,
        host: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        warn_seconds: float = 1.0,
    ) -> None:
        self.read_server_time = read_server_time
        self.host = host or SystemClock()
        self.monotonic = monotonic
        self.warn_seconds = warn_seconds
        self._lock = threading.Lock()
        self._anchor: tuple[datetime, float] | None = None
        self.offset_seconds: float | None = None
        self.round_trip_seconds: float | None = None
        self.synced_at: datetime | None = None
        self.syncs = 0
        self.warned = False

    @property
    def synced(self) -> bool:
        return self._anchor is not None

    def sync(self) -> float:
        """Measure the server's time now; return the offset (server minus host, seconds).
        Raises what ``read_server_time`` raises (the database is unreachable)."""
        before = self.monotonic()
        server = self.read_server_time()
        after = self.monotonic()
        host = self.host.now()
        if server.tzinfo is None:
            raise ValueError("the server's time must be timezone-aware")
        # in UTC whatever zone the session read it in: the daily cap's day, lateness and every
        # time this clock stamps are UTC (DEC-UTC)
        server = server.astimezone(UTC)
        offset = (server - host).total_seconds()
        with self._lock:
            self._anchor = (server, after)
            self.offset_seconds = offset
            self.round_trip_seconds = after - before
            self.synced_at = server
            self.syncs += 1
            warn = abs(offset) > self.warn_seconds and not self.warned
            if warn:
                self.warned = True
        if warn:
            logger.warning(
                "this host's clock is %.3f s %s the database's (more than SCHEDULER_CLOCK_SKEW_WARN_SECONDS=%s); "
                "the scheduler uses the database's clock, but fix the host's time sync (NTP)",
                abs(offset), "behind" if offset > 0 else "ahead of", self.warn_seconds)
        return offset

    def now(self) -> datetime:
        with self._lock:
            if self._anchor is None:
                return self.host.now()
            server, at = self._anchor
        return server + timedelta(seconds=self.monotonic() - at)

    def details(self) -> dict[str, Any]:
        """What ``/health/scheduler`` shows an admin about this clock."""
        return {
            "source": "database",
            "synced": self.synced,
            "offset_seconds": self.offset_seconds,
            "round_trip_seconds": self.round_trip_seconds,
            "synced_at": self.synced_at.isoformat() if self.synced_at else None,
        }


def clock_details(clock: Clock) -> dict[str, Any]:
    """How ``clock`` tells time, for health: the database's (measured) or an injected one."""
    if isinstance(clock, DatabaseClock):
        return clock.details()
    return {"source": "injected", "synced": None, "offset_seconds": None, "round_trip_seconds": None,
            "synced_at": None}


def synced_database_clock(engine: Engine, *, warn_seconds: float = 1.0) -> DatabaseClock:
    """Production's clock for a short-lived command (``scheduler events reset``, ``cancel``,
    ``import``): the database's, read once now (DEC-10)."""
    from scheduler.database.engine import database_time

    clock = DatabaseClock(partial(database_time, engine), warn_seconds=warn_seconds)
    clock.sync()
    return clock
