"""What the console's overview shows (and streams): counts, backlog, lateness, replicas, failures.

Each figure reads an index made for it (the pending and failed partial indexes, the
``(updated_at, id)`` index for the last hour's dispatches) except the counts of finished
rows (dispatched, cancelled), which are counted exactly only in a table under
``EXACT_LIMIT`` rows and are the planner's estimate above, marked as such
(``scheduler.application.counts``; see docs/console.md for the cost at 1M rows).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from scheduler.application import counts as status_counts
from scheduler.database.database import Database
from scheduler.operations.heartbeat import list_replicas, replicas_json

LATENESS_WINDOW = timedelta(hours=1)
FAILURE_WINDOW = timedelta(hours=24)
EXACT_LIMIT = status_counts.EXACT_LIMIT  # rows in the table above which finished rows are estimated
FAILURE_SAMPLE = 10_000  # more failures than this in 24 h: the kinds are those of the latest ones


def overview(database: Database, now: datetime) -> dict[str, Any]:
    """Every figure of the overview at ``now`` (the injected clock's), JSON-ready."""
    operations = database.operations
    with database.begin() as session:
        backlog = operations.backlog(session, now)
        # Every status, cancelled included; past EXACT_LIMIT rows the finished ones are the
        # planner's estimate (named in "estimated"), never a scan every refresh.
        counts = status_counts.status_counts(session, database.events, exact_limit=EXACT_LIMIT)
        lateness = operations.lateness(session, since=now - LATENESS_WINDOW, now=now)
        since = now - FAILURE_WINDOW
        failures = [
            {"kind": r["kind"] or "(empty)", "count": r["count"], "latest": r["latest"].isoformat()}
            for r in operations.failures_by_kind(session, since=since, sample=FAILURE_SAMPLE)
        ]
        failed_in_window = operations.count_failed_since(session, since)
    oldest = backlog["oldest_trigger_at"]
    return {
        "generated_at": now.isoformat(),
        "counts": counts.as_json(),
        "estimated": counts.estimated_json(),
        "backlog": backlog["backlog"],
        "oldest_overdue_seconds": max((now - oldest).total_seconds(), 0.0) if oldest else None,
        "lateness": {
            "p50": lateness["p50"], "p99": lateness["p99"], "dispatched": lateness["dispatched"],
        },
        "replicas": replicas_json(list_replicas(database, now)),
        "failures": failures,
        "failures_total": failed_in_window,
        "failures_sampled": failed_in_window > FAILURE_SAMPLE,
    }


def duration(seconds: float | None) -> str:
    """A short human duration: ``-`` for none, ``42 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"
