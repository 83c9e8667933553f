"""Benchmark 1: what one claim costs as the table fills with terminal rows.

Each size gets a fresh database holding 1,000 due pending rows among ``size`` rows; the
others are dispatched or failed with older trigger times (a table after months of use),
bulk-loaded as such. A second database per size reaches the same state the way production
does, every row pending first and then made terminal by UPDATE, and is measured before and
after a VACUUM (dead index entries are what an UPDATE-made history adds).
The measured statement is production's ``claim_due_events``, bound exactly as the loop
binds it, run in its own transaction and rolled back so every sample sees the same rows;
the sizes' databases are open together and sampled round-robin, side by side.
The same run then swaps our partial index for the plain ``trigger_at`` index a naive
schema would have, and measures again.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text

from bench.env import NOW, Server, bench_engine, bench_sql, checkpoint, load_events, progress
from scheduler.core.clock import ManualClock
from scheduler.core.loop import claim_params
from scheduler.database.database import Database
from scheduler.database.queries import Statements, sql
from scheduler.operations.retention import Retention

# the benchmarks' and scenarios' databases are in the default schema
STATEMENTS = Statements.of()

PENDING = 1_000
BATCH = 20


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _params() -> dict[str, Any]:
    return claim_params(NOW, BATCH)


def _claim_once(conn: Connection) -> float:
    """One claim in its own transaction, rolled back; its latency in ms."""
    started = time.perf_counter()
    rows = conn.execute(STATEMENTS["claim_due_events"], _params()).all()
    elapsed = (time.perf_counter() - started) * 1000
    conn.rollback()
    if len(rows) != BATCH:
        raise RuntimeError(f"the claim returned {len(rows)} rows, expected {BATCH}")
    return elapsed


def time_claims(conns: dict[int, Connection], samples: int, budget_seconds: float) -> dict[int, list[float]]:
    """Latencies (ms) of the real claim on every table, sampled round-robin.

    Interleaving puts the sizes side by side in time: a burst of load from elsewhere
    on the machine lands on all of them alike instead of on whichever ran then.
    """
    for conn in conns.values():
        for _ in range(5):  # warm the plan cache and the buffers
            _claim_once(conn)
    latencies: dict[int, list[float]] = {size: [] for size in conns}
    deadline = time.perf_counter() + budget_seconds
    rounds = 0
    while rounds < samples and (rounds < 10 or time.perf_counter() < deadline):
        for size, conn in conns.items():
            latencies[size].append(_claim_once(conn))
        rounds += 1
    return latencies


def explain(conn: Connection) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the claim: the text plan and its key numbers."""
    plan_text = [
        row[0]
        for row in conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql("claim_due_events")), _params())
    ]
    conn.rollback()
    raw = conn.execute(
        text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql("claim_due_events")), _params()
    ).scalar_one()
    conn.rollback()
    document = raw if isinstance(raw, list) else json.loads(raw)
    top = document[0]
    scans = list(_scan_nodes(top["Plan"]))
    return {
        "text": plan_text,
        "execution_ms": top.get("Execution Time"),
        "scans": [
            {
                "node": n["Node Type"],
                "index": n.get("Index Name"),
                "rows": n.get("Actual Rows"),
                "removed_by_filter": n.get("Rows Removed by Filter", 0),
                "shared_buffers": n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0),
            }
            for n in scans
        ],
    }


def _scan_nodes(node: dict[str, Any]) -> Any:
    if "Scan" in node["Node Type"]:
        yield node
    for child in node.get("Plans", []):
        yield from _scan_nodes(child)


def measure(engines: dict[int, Engine], samples: int, budget: float) -> dict[int, dict[str, Any]]:
    """Median, p90 and EXPLAIN of the claim on each table, measured side by side."""
    with contextlib.ExitStack() as stack:
        conns = {size: stack.enter_context(engine.connect()) for size, engine in engines.items()}
        latencies = time_claims(conns, samples, budget)
        return {
            size: {
                "samples": len(values),
                "median_ms": statistics.median(values),
                "p90_ms": percentile(values, 0.9),
                "explain": explain(conns[size]),
            }
            for size, values in latencies.items()
        }


def _each(engines: dict[int, Engine], name: str, autocommit: bool = False, **params: Any) -> None:
    for engine in engines.values():
        if autocommit:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(bench_sql(name), params)
        else:
            with engine.begin() as conn:
                conn.execute(bench_sql(name), params)


@contextlib.contextmanager
def _databases(server: Server, label: str, sizes: list[int]) -> Iterator[dict[int, Engine]]:
    """One fresh database (and engine) per size, all open at once."""
    with contextlib.ExitStack() as stack:
        engines: dict[int, Engine] = {}
        for size in sizes:
            url = stack.enter_context(server.fresh_database(label))
            engines[size] = bench_engine(url)
            stack.callback(engines[size].dispose)
        yield engines


def _bulk_loaded(server: Server, sizes: list[int], samples: int,
                 budget: float) -> tuple[dict[int, Any], dict[int, Any]]:
    """Terminal rows bulk-loaded: ours, then the naive index, each size side by side."""
    with _databases(server, "claim", sizes) as engines:
        for size, engine in engines.items():
            started = time.perf_counter()
            load_events(engine, pending=PENDING, terminal=size - PENDING)
            progress(f"claim: loaded {size:,} rows in {time.perf_counter() - started:.1f}s")
        ours = measure(engines, samples, budget)
        _each(engines, "drop_pending_index")
        _each(engines, "create_naive_index")
        _each(engines, "analyze_events", autocommit=True)
        naive = measure(engines, samples, budget)
    return ours, naive


def _retain(engines: dict[int, Engine]) -> dict[int, int]:
    """Production's retention, 31 days after the rows were finished: rows deleted per size."""
    deleted: dict[int, int] = {}
    for size, engine in engines.items():
        retention = Retention(Database(engine), ManualClock(NOW + timedelta(days=31)), days=30, batch_size=5_000,
                              max_batches=10_000)
        started = time.perf_counter()
        report = retention.run_if_due()
        assert report is not None and report.done
        deleted[size] = report.deleted
        progress(f"claim: retention deleted {report.deleted:,} of {size:,} rows in {report.batches} batches "
                 f"in {time.perf_counter() - started:.1f}s")
    return deleted


def _after_updates(
    server: Server, sizes: list[int], samples: int, budget: float
) -> tuple[dict[int, Any], dict[int, Any], dict[int, Any]]:
    """The realistic history: every row was pending once and was made terminal by UPDATE.

    Each such UPDATE leaves a dead entry in the partial index until VACUUM removes it, and
    the claim's index scan steps over them (the first scan marks them dead, later scans
    still read their pages). Measured with autovacuum held off, then after a VACUUM; then
    31 days later, after retention deleted the dispatched rows and their history (before
    and after another VACUUM): retention deletes rows the pending index no longer holds.
    """
    with _databases(server, "claim_updated", sizes) as engines:
        for size, engine in engines.items():
            started = time.perf_counter()
            with engine.begin() as conn:
                conn.execute(bench_sql("disable_autovacuum"))
            load_events(engine, pending=size)
            with engine.begin() as conn:
                conn.execute(bench_sql("finish_oldest_events"), {"now": NOW, "count": size - PENDING})
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(bench_sql("analyze_events"))
            checkpoint(engine)
            progress(f"claim: {size:,} rows loaded pending and {size - PENDING:,} made terminal by UPDATE "
                     f"in {time.perf_counter() - started:.1f}s")
        updated = measure(engines, samples, budget)
        _each(engines, "vacuum_events", autocommit=True)
        vacuumed = measure(engines, samples, budget)
        deleted = _retain(engines)
        retained = measure(engines, samples, budget)
        _each(engines, "vacuum_events", autocommit=True)
        retained_vacuumed = measure(engines, samples, budget)
        for size in sizes:
            retained[size]["deleted"] = deleted[size]
            retained[size]["vacuumed"] = retained_vacuumed[size]
    return updated, vacuumed, retained


def run(server: Server, *, sizes: list[int], samples: int, budget: float) -> dict[str, Any]:
    """Claim latency per table size, ours and naive, and the ratios the issue asks for."""
    results: dict[str, Any] = {"pending": PENDING, "batch_size": BATCH, "sizes": {}}
    ours, naive = _bulk_loaded(server, sizes, samples, budget)
    for size in sizes:
        progress(f"claim: {size:,} rows: ours median {ours[size]['median_ms']:.2f} ms "
                 f"(p90 {ours[size]['p90_ms']:.2f}), naive median {naive[size]['median_ms']:.2f} ms "
                 f"(p90 {naive[size]['p90_ms']:.2f})")
    updated, vacuumed, retained = _after_updates(server, sizes, samples, budget)
    for size in sizes:
        progress(f"claim: {size:,} rows made terminal by UPDATE: median {updated[size]['median_ms']:.2f} ms "
                 f"before VACUUM, {vacuumed[size]['median_ms']:.2f} ms after; after retention "
                 f"{retained[size]['median_ms']:.2f} ms, and VACUUM {retained[size]['vacuumed']['median_ms']:.2f} ms")
        again = retained[size].pop("vacuumed")
        results["sizes"][str(size)] = {"ours": ours[size], "naive": naive[size], "ours_updated": updated[size],
                                       "ours_vacuumed": vacuumed[size], "ours_retained": retained[size],
                                       "ours_retained_vacuumed": again,
                                       "retention_deleted": retained[size].pop("deleted")}
    smallest, largest = str(min(sizes)), str(max(sizes))
    by_size = results["sizes"]
    results["ratio_largest_to_smallest"] = {
        schema: by_size[largest][schema]["median_ms"] / by_size[smallest][schema]["median_ms"]
        for schema in ("ours", "naive", "ours_updated", "ours_vacuumed")
    }
    results["naive_over_ours_at_largest"] = (
        by_size[largest]["naive"]["median_ms"] / by_size[largest]["ours"]["median_ms"]
    )
    results["target"] = "ours: largest / smallest <= 1.5"
    results["target_met"] = results["ratio_largest_to_smallest"]["ours"] <= 1.5
    return results
