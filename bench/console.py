"""Benchmark: the console's overview and a filtered events page with a big table.

One fresh database holds ``rows`` scheduled events: 1 % due pending (the backlog), the
rest terminal (nine in ten dispatched, one in ten failed), 5,000 of them dispatched in the
last hour and 2,000 failed in the last day; VACUUM ANALYZE as autovacuum would leave it.
Each page is requested through the whole ASGI app in-process (authentication, the
queries, Jinja2 rendering) with a signed-in cookie, interleaved, after a warm-up; the
figure is the median and p90 of the response time. The overview's queries are also
timed one by one, to show where the time goes.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import text
from starlette.testclient import TestClient

from bench.claim import percentile
from bench.env import NOW, Server, bench_engine, bench_sql, checkpoint, load_events, progress
from scheduler.application.counts import COUNT_CAP
from scheduler.application.events import Cursor, EventOrder
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.queries import Statements
from scheduler.service import SchedulerService
from scheduler.types import EventStatus
from scheduler.web.console.sign_in import COOKIE

# the benchmarks' and scenarios' databases are in the default schema
STATEMENTS = Statements.of()

SECRET = "bench-console-secret-0123456789abcdefghijklmnop"
PAGES = {
    "overview": "/console",
    "events: status=failed": "/console/events?status=failed",
    "events: failed, error text": "/console/events?status=failed&error_contains=smtp",
    "events: status=pending": "/console/events?status=pending",
    "events: no filter": "/console/events",
    "events: one participant": "/console/events?user_id=user-42",
    "events: failed, next page": "/console/events?status=failed&cursor="
                                 + Cursor(EventOrder.CHANGED_DESC, NOW - timedelta(days=1), "old-500000").encode(),
}


def _time(client: TestClient, path: str) -> float:
    started = time.perf_counter()
    response = client.get(path)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
    return elapsed


def _query_times(service: SchedulerService, samples: int) -> dict[str, float]:
    """Median ms of each overview query on its own."""
    queries: dict[str, dict[str, Any]] = {
        "backlog_gauges": {"now": NOW}, "count_pending": {"cap": COUNT_CAP}, "count_failed": {"cap": COUNT_CAP},
        "estimate_events": {},
        "estimate_events_by_status": {},
        "count_events_by_status (not run past 200,000 rows)": {"statuses": [str(s) for s in EventStatus]},
        "lateness_percentiles": {"since": NOW - timedelta(hours=1), "now": NOW},
        "failures_by_kind": {"since": NOW - timedelta(hours=24), "sample": 10_000},
        "count_failed_since": {"since": NOW - timedelta(hours=24)}, "list_replicas": {"now": NOW},
    }
    out: dict[str, float] = {}
    with service.engine.connect() as conn:
        for name, params in queries.items():
            times = []
            for _ in range(samples):
                started = time.perf_counter()
                conn.execute(STATEMENTS[name.split(" ")[0]], params).all()
                times.append((time.perf_counter() - started) * 1000)
            conn.rollback()
            out[name] = statistics.median(times)
    return out


def run(server: Server, *, rows: int, samples: int) -> dict[str, Any]:
    pending = rows // 100
    with server.fresh_database("console") as url:
        engine = bench_engine(url)
        try:
            progress(f"console: loading {rows:,} rows ({pending:,} due pending)")
            load_events(engine, pending=pending, terminal=rows - pending)
            with engine.begin() as conn:
                conn.execute(bench_sql("console_recent_dispatches"), {"now": NOW, "count": 5_000})
                conn.execute(bench_sql("console_recent_failures"), {"now": NOW, "count": 2_000})
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(bench_sql("vacuum_analyze_events"))
            checkpoint(engine)
            with engine.connect() as conn:
                counted: dict[str, int] = {
                    str(status): int(n)
                    for status, n in conn.execute(
                        text("SELECT status, count(*) FROM scheduler.scheduled_events GROUP BY 1"))
                }
            service = SchedulerService(Settings(jwt_secret=SECRET), engine=engine, clock=ManualClock(NOW),
                                       run_scheduler=False)
            with TestClient(service.app) as client:
                # a signed-in console session, as the sign-in page opens one
                signed_in = service.web_sessions.create("bench", "admin", token_seconds_left=3600)
                client.cookies.set(COOKIE, signed_in.secret, path="/console")
                for path in PAGES.values():  # warm the plans and the buffers
                    for _ in range(3):
                        _time(client, path)
                times: dict[str, list[float]] = {name: [] for name in PAGES}
                for _ in range(samples):
                    for name, path in PAGES.items():
                        times[name].append(_time(client, path))
            queries = _query_times(service, max(samples // 2, 5))
        finally:
            engine.dispose()
    pages = {name: {"median_ms": statistics.median(t), "p90_ms": percentile(t, 0.9), "samples": len(t)}
             for name, t in times.items()}
    for name, figures in pages.items():
        progress(f"console: {name}: median {figures['median_ms']:.1f} ms, p90 {figures['p90_ms']:.1f} ms")
    return {"rows": rows, "by_status": counted, "pages": pages, "overview_queries_median_ms": queries}


def table(result: dict[str, Any]) -> list[str]:
    by_status = ", ".join(f"{k} {v:,}" for k, v in sorted(result["by_status"].items()))
    lines = [f"### Console pages with {result['rows']:,} rows ({by_status})",
             "", "| page | median ms | p90 ms |", "| --- | ---: | ---: |"]
    for name, figures in result["pages"].items():
        lines.append(f"| {name} | {figures['median_ms']:.1f} | {figures['p90_ms']:.1f} |")
    lines += ["", "| overview query | median ms |", "| --- | ---: |"]
    for name, ms in result["overview_queries_median_ms"].items():
        lines.append(f"| `{name}` | {ms:.2f} |")
    return lines
