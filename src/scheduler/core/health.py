"""The loop's health: what ``GET /health/scheduler`` reports; the rows stay the real record."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from scheduler.core.batch import PollReport


@dataclass
class SchedulerHealth:
    """Counters and times of one replica's loop, updated by the loop's own thread."""

    running: bool = False
    started_at: datetime | None = None
    last_poll_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    polls: int = 0
    dispatched: int = 0
    failed: int = 0
    expired: int = 0  # rows this replica's claims ended expired (EXP-2)
    consecutive_failures: int = 0  # polls that failed since the last one that completed
    skipped: int = 0  # rows left pending because their participant was busy

    def started(self, now: datetime) -> None:
        self.running = True
        self.started_at = now

    def committed(self, report: PollReport, now: datetime) -> None:
        """A poll's batch committed at ``now``."""
        self.polls += 1
        self.skipped += report.skipped
        self.last_poll_at = now
        self.dispatched += report.dispatched
        self.failed += report.failed
        self.expired += len(report.expired)

    def poll_failed(self, error: str, now: datetime) -> None:
        self.last_error = error
        self.last_error_at = now
        self.consecutive_failures += 1

    def poll_completed(self) -> None:
        self.consecutive_failures = 0

    def is_stale(self, now: datetime, poll_seconds: float) -> bool:
        """True when no poll completed within three poll intervals."""
        reference = self.last_poll_at or self.started_at
        if reference is None:
            return False
        return now - reference > timedelta(seconds=3 * max(poll_seconds, 1.0))

    def snapshot(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "running": self.running,
            "started_at": iso(self.started_at),
            "last_poll_at": iso(self.last_poll_at),
            "last_error": self.last_error,
            "last_error_at": iso(self.last_error_at),
            "polls": self.polls,
            "dispatched": self.dispatched,
            "failed": self.failed,
            "expired": self.expired,
            "consecutive_failures": self.consecutive_failures,
            "skipped_busy": self.skipped,
        }
