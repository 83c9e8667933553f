"""The pacing: how long the loop waits after a poll (REQ-0065, DEC-9).

Literal mode waits ``poll_seconds`` after every poll, whatever it found. Prompt mode polls
again at once after a full batch, retries soon when busy participants left due rows
behind, and otherwise waits for the earliest of the interval, the next pending
``trigger_at`` and a wake-up (another replica's NOTIFY, or a ``recheck``). Nothing here
touches the database: the poll reads ``next_due`` and hands it over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

from scheduler.core.store import BEFORE_EVERY_TRIGGER
from scheduler.types import Clock, PollReport, SchedulerMode

# Prompt mode: how soon to look again after a poll left rows of busy participants behind.
BUSY_RETRY_SECONDS = 0.5

# What a wake-up without a trigger time stands for: "something may have changed, look now":
# a time before every storable trigger_at, so it is always the earliest (DEC-TRIGGER).
_LOOK_NOW = BEFORE_EVERY_TRIGGER


def is_full(report: PollReport, batch_size: int) -> bool:
    """A poll that claimed a whole batch, or ended a whole batch's worth of rows expired
    (a backlog of them drains without waiting an interval between claims): more may be due."""
    return report.claimed >= batch_size or len(report.expired) >= batch_size


def polls_again_at_once(mode: SchedulerMode, batch_size: int, report: PollReport | None) -> bool:
    """Prompt mode skips the wait after a full batch."""
    return mode is SchedulerMode.PROMPT and report is not None and is_full(report, batch_size)


def interval_after(mode: SchedulerMode, poll_seconds: float, report: PollReport | None) -> float:
    """The real-time bound of the wait after a poll: the interval, or in prompt mode a
    short retry when busy participants left due rows behind."""
    if mode is SchedulerMode.PROMPT and report is not None and report.skipped:
        return min(poll_seconds, BUSY_RETRY_SECONDS)
    return poll_seconds


class Pacing:
    """Prompt mode's wake state and the wait it implies. Thread-safe: the listener's thread
    announces while the loop waits in another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._announced: datetime | None = None  # the earliest trigger_at another replica announced
        self._interrupt: Callable[[], None] | None = None  # ends the current wait (set while a loop runs)
        self.next_due: datetime | None = None  # the next pending trigger_at, as the last poll read it
        self.waiting_until: datetime | None = None  # prompt mode: the current wait's clock deadline

    def announce(self, trigger_at: datetime | None) -> None:
        """Remember the earliest announced trigger (``None``: look now) and end the wait."""
        when = trigger_at or _LOOK_NOW
        with self._lock:
            if self._announced is None or when < self._announced:
                self._announced = when
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def recheck(self) -> None:
        """End the current wait so that it re-reads the clock."""
        with self._lock:
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def attach(self, interrupt: Callable[[], None] | None) -> None:
        """The running loop's way to end its wait (``None`` when no loop runs)."""
        with self._lock:
            self._interrupt = interrupt

    def poll_starts(self) -> None:
        """A poll is about to claim: it sees every row committed before, so earlier
        announcements are answered."""
        with self._lock:
            self._announced = None

    def wait_seconds(self, mode: SchedulerMode, clock: Clock, real_deadline: float) -> float:
        """How long to wait now before the next poll; 0 means poll now. ``real_deadline`` is
        the ``time.monotonic()`` at which the interval ends; a trigger time is measured on
        ``clock``."""
        remaining = real_deadline - time.monotonic()
        if mode is SchedulerMode.LITERAL or remaining <= 0:
            self.waiting_until = None
            return max(remaining, 0.0)
        with self._lock:
            announced = self._announced
        due = min((t for t in (self.next_due, announced) if t is not None), default=None)
        self.waiting_until = due
        if due is None:
            return remaining
        until_due = (due - clock.now()).total_seconds()
        return max(min(remaining, until_due), 0.0)
