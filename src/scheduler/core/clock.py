"""Clocks. Scheduler code never asks the database for the time: it binds ``:now``."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


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
