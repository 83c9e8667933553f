"""Benchmark: the scheduler at 10k, 1M and 10M rows.

Each size gets a fresh database holding a long history and the same live work:
``size - 1,000`` finished rows (nine in ten dispatched, one in ten failed), one finished
every second going back from two days before the run's instant (10M rows reach back 116
days), for 5,000 participants; 1,000 due pending rows; 5,000 of the history's dispatches
moved into the last hour and 2,000 of its failures into the last day (what the overview's
windows show). What grows is the history; the live work stays the same, so a figure that
grows with the size is a figure that grows with the table.

Loading is set-based, ``INSERT ... SELECT generate_series`` as ``bench claim`` loads, in
chunks of a million rows with a progress line each, through the real schema (every index,
the history trigger); then ``VACUUM (ANALYZE)`` (what autovacuum leaves) and
``CHECKPOINT``. All sizes' databases are then open together and every figure is sampled
round-robin across them, so load from elsewhere on the machine falls on all sizes alike:

- the claim (production's statement, bound as the loop binds it, rolled back each time):
  median, p90, p99; alone, and while other replicas hold a claimed batch each;
- the console's pages through the whole app (signed-in cookie, queries, templates) and the
  ``/metrics`` scrape (its five-second cache off, so every scrape runs its queries);
- each hot statement alone (median), and its ``EXPLAIN (ANALYZE, BUFFERS)``;
- retention, as production runs it after a poll (batches of 500, at most 20 per call), 31
  days later so that the same rows are expired at every size; then the claim again.

A participant with no rows at all (``events: unknown participant``) is the one page no
index serves: it is measured once per size, not sampled (it reads the whole table).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text
from starlette.testclient import TestClient

from bench.claim import BATCH, PENDING, percentile
from bench.env import DAY, NOW, Server, bench_engine, bench_sql, checkpoint, progress
from scheduler.application.counts import COUNT_CAP
from scheduler.application.events import EventQuery
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.poll import claim_params
from scheduler.database.database import Database
from scheduler.database.queries import Statements, sql
from scheduler.operations.retention import Retention
from scheduler.service import SchedulerService
from scheduler.types import EventStatus
from scheduler.web.console.sign_in import COOKIE

# the benchmarks' and scenarios' databases are in the default schema
STATEMENTS = Statements.of()

CHUNK = 1_000_000
RECENT_DISPATCHES = 5_000
RECENT_FAILURES = 2_000
SECRET = "bench-scale-secret-0123456789abcdefghijklmnopqrs"
PAGE_LIMIT = 51  # the console's 50 rows and one more (is there a next page)
# The pages an operator and a scraper request, timed through the whole app.
PAGES = {
    "overview": "/console",
    "events: no filter": "/console/events",
    "events: status=failed": "/console/events?status=failed",
    "events: status=pending": "/console/events?status=pending",
    "events: one participant": "/console/events?user_id=user-42",
    "metrics scrape": "/metrics",
}
UNSERVED_PAGE = ("events: unknown participant", "/console/events?user_id=nobody")
HELD_BY_OTHERS = (1, 3)  # other replicas each holding a claimed batch while this one claims
RETENTION_CALLS = 3


def _page(**fields: Any) -> dict[str, Any]:
    return {**EventQuery(**fields).params(), "after_at": None, "after_id": "", "limit": PAGE_LIMIT}


def hot_statements() -> dict[str, tuple[str, dict[str, Any]]]:
    """Label -> (statement of queries.sql, its parameters): what runs often, and its worst filters."""
    return {
        "claim": ("claim_due_events", claim_params(NOW, BATCH)),
        "next due (prompt mode)": ("next_pending_trigger", {"now": NOW}),
        "metrics: backlog": ("backlog_gauges", {"now": NOW}),
        "metrics, overview: failed count": ("count_failed", {"cap": COUNT_CAP}),
        "metrics, overview: replicas": ("list_replicas", {"now": NOW}),
        "overview: pending count": ("count_pending", {"cap": COUNT_CAP}),
        "overview: status estimate": ("estimate_events_by_status", {}),
        "overview: lateness, last hour": ("lateness_percentiles", {"since": NOW - timedelta(hours=1), "now": NOW}),
        "overview: failures by kind, 24 h": ("failures_by_kind", {"since": NOW - timedelta(hours=24),
                                                                   "sample": 10_000}),
        "overview: failed in 24 h": ("count_failed_since", {"since": NOW - timedelta(hours=24)}),
        "events page: no filter": ("filter_events_page", _page()),
        "events page: failed": ("filter_events_page", _page(status=EventStatus.FAILED)),
        "events page: pending": ("filter_pending_page", _page(status=EventStatus.PENDING)),
        "events page: one participant": ("filter_events_page", _page(user_id="user-42")),
        "store: new event": ("upsert_event_by_key", {
            "id": "bench-new-event", "event_type": "commitment", "user_id": "user-new", "community_id": None,
            "external_key": "bench-new-key", "trigger_at": NOW + timedelta(days=1),
            "facts": json.dumps({"facts_version": "1", "scenario": "commitment_reminder",
                                 "commitment": "water the plants", "date": DAY}), "now": NOW,
            "traceparent": None, "expires_at": None}),
        "retention: one batch": ("delete_expired_events", {"cutoff": NOW + timedelta(days=1), "batch_size": 500}),
    }


def _load(engine: Engine, size: int) -> dict[str, Any]:
    """The history in chunks, the live work, the recent windows; VACUUM (ANALYZE), CHECKPOINT."""
    started = time.perf_counter()
    history = size - PENDING
    for first in range(1, history + 1, CHUNK):
        last = min(first + CHUNK - 1, history)
        with engine.begin() as conn:
            conn.execute(bench_sql("load_history_events"), {"now": NOW, "first": first, "last": last})
        if history > CHUNK:
            progress(f"scale: {size:,} rows: {last:,} of {history:,} history rows loaded "
                     f"({time.perf_counter() - started:.0f}s)")
    with engine.begin() as conn:
        conn.execute(bench_sql("load_pending_events"), {"now": NOW, "day": DAY, "prefix": "user-", "count": PENDING})
        conn.execute(bench_sql("console_recent_dispatches"),
                     {"now": NOW, "count": min(RECENT_DISPATCHES, history // 2)})
        conn.execute(bench_sql("console_recent_failures"), {"now": NOW, "count": min(RECENT_FAILURES, history // 20)})
    loaded = time.perf_counter() - started
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(bench_sql("vacuum_analyze_events"))
    checkpoint(engine)
    total = time.perf_counter() - started
    with engine.connect() as conn:
        counted = conn.execute(text("SELECT status, count(*) FROM scheduler.scheduled_events GROUP BY 1"))
        by_status = {str(s): int(n) for s, n in counted}
        sizes = {str(name): int(n) for name, n in conn.execute(bench_sql("relation_sizes"))}
    progress(f"scale: {size:,} rows loaded in {loaded:.0f}s, vacuumed and analyzed in {total - loaded:.0f}s; "
             f"table {sizes.get('scheduled_events', 0) / 2**20:,.0f} MiB")
    return {"load_seconds": loaded, "vacuum_analyze_seconds": total - loaded, "by_status": by_status,
            "relation_bytes": sizes}


def _claim_once(conn: Connection) -> float:
    started = time.perf_counter()
    rows = conn.execute(STATEMENTS["claim_due_events"], claim_params(NOW, BATCH)).all()
    elapsed = (time.perf_counter() - started) * 1000
    conn.rollback()
    if len(rows) != BATCH:
        raise RuntimeError(f"the claim returned {len(rows)} rows, expected {BATCH}")
    return elapsed


def _summary(values: list[float]) -> dict[str, float]:
    return {"samples": len(values), "median_ms": statistics.median(values), "p90_ms": percentile(values, 0.9),
            "p99_ms": percentile(values, 0.99), "max_ms": max(values)}


def _round_robin(sizes: list[int], samples: int, budget: float, sample: Any) -> dict[int, list[float]]:
    """``sample(size)`` for every size in turn, ``samples`` rounds (at least 10 within ``budget`` s)."""
    for size in sizes:  # warm the plan cache and the buffers
        for _ in range(3):
            sample(size)
    values: dict[int, list[float]] = {size: [] for size in sizes}
    deadline = time.perf_counter() + budget
    rounds = 0
    while rounds < samples and (rounds < 10 or time.perf_counter() < deadline):
        for size in sizes:
            values[size].append(sample(size))
        rounds += 1
    return values


def measure_claims(conns: dict[int, Connection], samples: int, budget: float) -> dict[int, dict[str, float]]:
    values = _round_robin(list(conns), samples, budget, lambda size: _claim_once(conns[size]))
    return {size: _summary(v) for size, v in values.items()}


@contextlib.contextmanager
def _others_hold_batches(engines: dict[int, Engine], count: int) -> Iterator[None]:
    """``count`` other connections per database, each holding a claimed batch (its rows locked)."""
    with contextlib.ExitStack() as stack:
        for engine in engines.values():
            for _ in range(count):
                conn = stack.enter_context(engine.connect())
                conn.execute(STATEMENTS["claim_due_events"], claim_params(NOW, BATCH)).all()
                stack.callback(conn.rollback)
        yield


def explain(conn: Connection, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of one statement (rolled back): the text plan and its essentials."""
    body = "EXPLAIN (ANALYZE, BUFFERS{}) " + sql(name)
    plan_text = [row[0] for row in conn.execute(text(body.format("")), params)]
    conn.rollback()
    raw = conn.execute(text(body.format(", FORMAT JSON")), params).scalar_one()
    conn.rollback()
    top = (raw if isinstance(raw, list) else json.loads(raw))[0]
    scans = []
    for node in _nodes(top["Plan"]):
        if "Scan" in node["Node Type"] and node.get("Relation Name", node.get("Index Name")):
            scans.append({"node": node["Node Type"], "relation": node.get("Relation Name"),
                          "index": node.get("Index Name"), "rows": node.get("Actual Rows"),
                          "loops": node.get("Actual Loops"), "removed_by_filter": node.get("Rows Removed by Filter", 0),
                          "heap_fetches": node.get("Heap Fetches")})
    plan = top["Plan"]
    return {"statement": name, "text": plan_text, "execution_ms": top.get("Execution Time"),
            "shared_buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0), "scans": scans}


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _time_statement(conn: Connection, name: str, params: dict[str, Any]) -> float:
    started = time.perf_counter()
    conn.execute(STATEMENTS[name], params).all()
    elapsed = (time.perf_counter() - started) * 1000
    conn.rollback()
    return elapsed


def _get(client: TestClient, path: str) -> float:
    started = time.perf_counter()
    # no redirect followed: a console page that sends to the sign-in form is not a figure
    response = client.get(path, follow_redirects=False)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
    return elapsed


@contextlib.contextmanager
def _clients(engines: dict[int, Engine]) -> Iterator[dict[int, TestClient]]:
    """One signed-in client per database, on the whole app, its loop off and its clock at NOW."""
    with contextlib.ExitStack() as stack:
        clients: dict[int, TestClient] = {}
        for size, engine in engines.items():
            service = SchedulerService(Settings(jwt_secret=SECRET), engine=engine, clock=ManualClock(NOW),
                                       run_scheduler=False)
            service.metrics.cache_for = timedelta(0)  # every scrape runs its queries
            client = stack.enter_context(TestClient(service.app))
            # a signed-in console session, as the sign-in page opens one
            signed_in = service.web_sessions.create("bench", "admin", token_seconds_left=3600)
            client.cookies.set(COOKIE, signed_in.secret, path="/console")
            clients[size] = client
        yield clients


def _retention(engines: dict[int, Engine]) -> dict[int, dict[str, Any]]:
    """Production's retention 31 days later, as a poll hook calls it: each call at most 20
    batches of 500 rows (the defaults), the same expired rows at every size."""
    out: dict[int, dict[str, Any]] = {}
    for size, engine in engines.items():
        retention = Retention(Database(engine), ManualClock(NOW + timedelta(days=31)), days=30)
        calls = []
        for _ in range(RETENTION_CALLS):
            started = time.perf_counter()
            report = retention.run_if_due()
            elapsed = (time.perf_counter() - started) * 1000
            if report is None:
                break
            calls.append({"ms": elapsed, "deleted": report.deleted, "batches": report.batches, "done": report.done})
            if report.done:
                break
        deleted = sum(c["deleted"] for c in calls)
        ms = sum(c["ms"] for c in calls)
        out[size] = {"calls": calls, "deleted": deleted, "ms": ms,
                     "ms_per_1000_rows": ms / deleted * 1000 if deleted else None}
        progress(f"scale: {size:,} rows: retention deleted {deleted:,} rows in {len(calls)} calls, "
                 f"{ms:.0f} ms ({out[size]['ms_per_1000_rows'] or 0:.1f} ms per 1,000 rows)")
    return out


def _databases(server: Server, sizes: list[int], stack: contextlib.ExitStack) -> dict[int, Engine]:
    engines: dict[int, Engine] = {}
    for size in sizes:
        url = stack.enter_context(server.fresh_database(f"scale{size}"))
        engines[size] = bench_engine(url)
        stack.callback(engines[size].dispose)
    return engines


def run(server: Server, *, sizes: list[int], samples: int, budget: float, page_samples: int) -> dict[str, Any]:
    """Every figure at every size, side by side; ratios of the largest to the smallest."""
    sizes = sorted(sizes)
    if sizes[0] <= PENDING:
        raise ValueError(f"every size must be above the {PENDING:,} pending rows")
    result: dict[str, Any] = {"pending": PENDING, "batch_size": BATCH, "sizes": {str(s): {} for s in sizes}}
    by = result["sizes"]
    with contextlib.ExitStack() as stack:
        engines = _databases(server, sizes, stack)
        for size, engine in engines.items():
            progress(f"scale: loading {size:,} rows")
            by[str(size)]["load"] = _load(engine, size)
        result["load_average_after_load"] = [round(x, 2) for x in os.getloadavg()]

        conns = {size: stack.enter_context(engine.connect()) for size, engine in engines.items()}
        progress("scale: the claim, every size in turn")
        for size, figures in measure_claims(conns, samples, budget).items():
            by[str(size)]["claim"] = figures
        for held in HELD_BY_OTHERS:
            with _others_hold_batches(engines, held):
                for size, figures in measure_claims(conns, max(samples // 4, 10), budget / 4).items():
                    by[str(size)][f"claim_with_{held}_batches_held"] = figures
        for size in sizes:
            c = by[str(size)]
            progress(f"scale: {size:,} rows: claim median {c['claim']['median_ms']:.2f} ms, "
                     f"p99 {c['claim']['p99_ms']:.2f} ms; with {HELD_BY_OTHERS[-1]} batches held by others "
                     f"{c[f'claim_with_{HELD_BY_OTHERS[-1]}_batches_held']['median_ms']:.2f} ms")

        progress("scale: the console's pages and the /metrics scrape, every size in turn")
        with _clients(engines) as clients:
            pages: dict[int, dict[str, list[float]]] = {size: {name: [] for name in PAGES} for size in sizes}

            def page_round(size: int) -> float:
                for name, path in PAGES.items():
                    pages[size][name].append(_get(clients[size], path))
                return 0.0

            _round_robin(sizes, page_samples, budget, page_round)
            for size in sizes:
                page_figures: dict[str, dict[str, float]] = {  # the warm-up dropped
                    name: _summary(values[3:]) for name, values in pages[size].items()}
                started = time.perf_counter()
                _get(clients[size], UNSERVED_PAGE[1])
                page_figures[UNSERVED_PAGE[0]] = {"samples": 1, "median_ms": (time.perf_counter() - started) * 1000}
                by[str(size)]["pages"] = page_figures
                progress(f"scale: {size:,} rows: "
                         + ", ".join(f"{n} {f['median_ms']:.1f} ms" for n, f in page_figures.items()))

        progress("scale: each hot statement alone, and its plan")
        hot = hot_statements()
        for label, (name, params) in hot.items():
            timed = _round_robin(sizes, max(samples // 10, 10), budget / 4,
                                 lambda size, n=name, p=params: _time_statement(conns[size], n, p))
            for size in sizes:
                entry = by[str(size)].setdefault("statements", {})
                entry[label] = {**_summary(timed[size]), "plan": explain(conns[size], name, params)}
        for size in sizes:
            by[str(size)]["statements"][UNSERVED_PAGE[0]] = {
                "plan": explain(conns[size], "filter_events_page", _page(user_id="nobody"))}

        progress("scale: retention, 31 days later")
        for size, figures in _retention(engines).items():
            by[str(size)]["retention"] = figures
        for size, figures in measure_claims(conns, max(samples // 4, 10), budget / 4).items():
            by[str(size)]["claim_after_retention"] = figures
    smallest, largest = str(sizes[0]), str(sizes[-1])
    claim_small, claim_large = by[smallest]["claim"]["median_ms"], by[largest]["claim"]["median_ms"]
    result["claim_ratio_largest_to_smallest"] = claim_large / claim_small
    result["target"] = "claim median: largest / smallest <= 1.5"
    result["target_met"] = result["claim_ratio_largest_to_smallest"] <= 1.5
    result["page_ratios"] = {name: by[largest]["pages"][name]["median_ms"] / by[smallest]["pages"][name]["median_ms"]
                             for name in PAGES}
    progress(f"scale: claim median {largest} / {smallest} rows = {result['claim_ratio_largest_to_smallest']:.2f}x "
             f"(target <= 1.5x: {'met' if result['target_met'] else 'MISSED'})")
    return result


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}"


def table(result: dict[str, Any]) -> list[str]:
    """The Markdown tables: claim, pages, statements (with their plans' essentials), retention."""
    sizes = list(result["sizes"])
    head = "| | " + " | ".join(f"{int(s):,} rows" for s in sizes) + " |"
    rule = "| --- |" + " ---: |" * len(sizes)
    by = result["sizes"]
    lines = [f"### Scale: {', '.join(f'{int(s):,}' for s in sizes)} rows ({result['pending']:,} due pending in each, "
             f"the rest a history of finished rows; median ms, side by side)", "",
             "Load (s, set-based, then VACUUM ANALYZE) and size on disk:", "", head, rule,
             "| load + vacuum/analyze s | " + " | ".join(
                 f"{by[s]['load']['load_seconds']:.0f} + {by[s]['load']['vacuum_analyze_seconds']:.0f}"
                 for s in sizes) + " |",
             "| scheduled_events heap MiB | " + " | ".join(
                 f"{by[s]['load']['relation_bytes'].get('scheduled_events', 0) / 2**20:,.0f}" for s in sizes) + " |",
             "", "The claim (batch 20, rolled back each time): median / p99 ms", "", head, rule]
    for key, label in (("claim", "alone"), *((f"claim_with_{n}_batches_held", f"{n} other replica(s) holding a batch")
                                             for n in HELD_BY_OTHERS), ("claim_after_retention", "after retention")):
        lines.append(f"| {label} | " + " | ".join(
            f"{_ms(by[s][key]['median_ms'])} / {_ms(by[s][key]['p99_ms'])}" for s in sizes) + " |")
    lines += ["", f"Claim median, largest / smallest: **{result['claim_ratio_largest_to_smallest']:.2f}x** "
              f"(target <= 1.5x: {'met' if result['target_met'] else 'MISSED'}).", "",
              "Pages through the whole app (signed in; /metrics with its cache off): median / p99 ms", "", head, rule]
    for name in by[sizes[0]]["pages"]:
        lines.append(f"| {name} | " + " | ".join(
            f"{_ms(by[s]['pages'][name]['median_ms'])}" + (
                f" / {_ms(by[s]['pages'][name]['p99_ms'])}" if "p99_ms" in by[s]['pages'][name] else " (once)")
            for s in sizes) + " |")
    lines += ["", "Each hot statement alone (median ms) and its plan at the largest size "
              "(scans: node on index, rows; shared buffers of the whole plan)", "",
              head[:-1] + " | plan at the largest size |", rule + " --- |"]
    for label, entry in by[sizes[-1]]["statements"].items():
        plan = entry["plan"]
        scans = "; ".join(f"{s['node']} on {s['index'] or s['relation']} ({s['rows']} rows"
                          + (f", {s['removed_by_filter']} filtered" if s["removed_by_filter"] else "") + ")"
                          for s in plan["scans"])
        cells = " | ".join(_ms(by[s]["statements"][label].get("median_ms")) for s in sizes)
        lines.append(f"| {label} (`{plan['statement']}`) | {cells} | {scans}; {plan['shared_buffers']} buffers |")
    lines += ["", "Retention 31 days later (calls of at most 20 batches of 500): rows deleted, ms per 1,000 rows",
              "", head, rule,
              "| deleted / ms per 1,000 | " + " | ".join(
                  f"{by[s]['retention']['deleted']:,} / {_ms(by[s]['retention']['ms_per_1000_rows'])}"
                  for s in sizes) + " |"]
    return lines


def plans_markdown(result: dict[str, Any]) -> str:
    """Every statement's full EXPLAIN (ANALYZE, BUFFERS) at every size, as Markdown."""
    out = ["# EXPLAIN (ANALYZE, BUFFERS) of the hot statements (python -m bench scale)", ""]
    for size, entry in result["sizes"].items():
        out += [f"## {int(size):,} rows", ""]
        for label, figures in entry["statements"].items():
            plan = figures["plan"]
            out += [f"### {label}: `{plan['statement']}`", "", "```", *plan["text"], "```", ""]
    return "\n".join(out)
