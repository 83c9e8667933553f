"""How many scheduled events are in each status: for the console's overview and the metrics.

Every status of the ``EventStatus`` enum is counted, ``cancelled`` included, with one
``GROUP BY`` over the enum's values (a status with no row counts 0). That statement reads
the table whole, so it runs only while the table is small (``exact_limit`` rows by the
planner's estimate). Past it, the statuses with a partial index of their own (pending,
failed) are still counted exactly on it up to ``COUNT_CAP`` rows each, and the others (the
finished rows, the bulk of a big table) are the planner's estimate of that status from
ANALYZE's statistics, and are marked as estimated: never a difference of other counts.
An indexed status past ``COUNT_CAP`` rows (failed rows pile up, retention keeps them) is
estimated the same way and marked too, so no count reads more than ``COUNT_CAP + 1``
index entries: at 10M rows with a million failed ones, counting them took a fifth of a
second per overview refresh and per scrape (docs/performance.md, "Scale").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.orm import Session

from scheduler.database.events import EventRepository
from scheduler.types import EventStatus

EXACT_LIMIT = 200_000  # rows in the table (the planner's estimate) above which finished rows are estimated
COUNT_CAP = 100_000  # rows of an indexed status counted one by one; past it, the planner's estimate
# Statuses with a partial index of their own: counted exactly at any size, on the index only.
_INDEXED = {EventStatus.PENDING: "count_pending", EventStatus.FAILED: "count_failed"}


@dataclass(frozen=True)
class StatusCounts:
    """A count for every status, and which of them are estimates."""

    counts: dict[EventStatus, int]
    estimated: frozenset[EventStatus]

    def as_json(self) -> dict[str, int]:
        return {str(s): self.counts[s] for s in EventStatus}

    def estimated_json(self) -> list[str]:
        return [str(s) for s in EventStatus if s in self.estimated]


def indexed_count(session: Session, events: EventRepository, status: EventStatus, *,
                  cap: int | None = None) -> int | None:
    """The exact count of a status that has a partial index (pending, failed), read from it
    only; None when there are more than ``cap`` (default ``COUNT_CAP``) such rows."""
    limit = COUNT_CAP if cap is None else cap
    count = events.count_indexed(session, _INDEXED[status], limit)
    return count if count <= limit else None


def counted_or_estimated(session: Session, events: EventRepository, status: EventStatus, *,
                         cap: int | None = None) -> tuple[int, bool]:
    """An indexed status's count, exact up to ``cap`` rows, else the planner's estimate: (count, estimated)."""
    exact = indexed_count(session, events, status, cap=cap)
    if exact is not None:
        return exact, False
    stats = events.estimate_by_status(session)
    return _estimates(stats, [status])[status], True


def status_counts(session: Session, events: EventRepository, *, exact_limit: int = EXACT_LIMIT,
                  cap: int | None = None) -> StatusCounts:
    """Every status's count: exact in a table under ``exact_limit`` rows, else exact for the
    indexed statuses up to ``cap`` rows each and the planner's estimate for the others and
    for an indexed status past the cap (all marked ``estimated``)."""
    size = events.estimate_size(session)
    if size is None or size < exact_limit:
        by_status = events.count_by_status(session, [str(s) for s in EventStatus])
        exact = {EventStatus(status): count for status, count in by_status.items()}
        return StatusCounts({s: exact.get(s, 0) for s in EventStatus}, frozenset())
    counts: dict[EventStatus, int] = {}
    for status in _INDEXED:
        found = indexed_count(session, events, status, cap=cap)
        if found is not None:
            counts[status] = found
    estimated = [s for s in EventStatus if s not in counts]
    stats = events.estimate_by_status(session)
    for status, count in _estimates(stats, estimated).items():
        counts[status] = count
    return StatusCounts({s: counts[s] for s in EventStatus}, frozenset(estimated))


def _estimates(stats: Mapping[str, Any] | RowMapping, wanted: list[EventStatus]) -> dict[EventStatus, int]:
    """Each wanted status's row estimate as the planner makes it for ``status = X``: its
    frequency among ANALYZE's most common values, else an equal share of what those leave
    to the statuses missing from them (a status seen once in the sample is never listed)."""
    rows = int(stats["reltuples"] or 0)
    frequencies = dict(zip(stats["statuses"] or [], stats["freqs"] or [], strict=True))
    listed = {str(s) for s in EventStatus} & frequencies.keys()
    rest = max(1.0 - float(stats["null_frac"] or 0.0) - sum(frequencies[s] for s in listed), 0.0)
    missing = [s for s in EventStatus if str(s) not in listed]
    share = rest / len(missing) if missing else 0.0
    return {s: round(rows * (frequencies[str(s)] if str(s) in listed else share)) for s in wanted}
