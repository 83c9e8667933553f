"""Benchmark 1: what one claim costs as the table fills with terminal rows.

Each size gets a fresh database holding 1,000 due pending rows among ``size`` rows; the
others are dispatched or failed with older trigger times (a table after months of use),
bulk-loaded as such. A second database per size reaches the same state the way production
does, every row pending first and then made terminal by UPDATE, and is measured before and
after a VACUUM (dead index entries are what an UPDATE-made history adds).
The measured statement is production's ``claim_due_events``, bound exactly as the loop
binds it, run in its own transaction and rolled back so every sample sees the same rows.
The same run then swaps our partial index for the plain ``trigger_at`` index a naive
schema would have, and measures again.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from sqlalchemy import Connection, text

from bench.env import NOW, Server, bench_engine, bench_sql, load_events, progress
from scheduler.queries import sql, statement

PENDING = 1_000
BATCH = 20


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _params() -> dict[str, Any]:
    return {"now": NOW, "batch_size": BATCH}


def time_claims(conn: Connection, samples: int, budget_seconds: float) -> list[float]:
    """Latencies (ms) of the real claim, each in its own rolled-back transaction."""
    claim = statement("claim_due_events")
    for _ in range(5):  # warm the plan cache and the buffers
        conn.execute(claim, _params()).all()
        conn.rollback()
    latencies: list[float] = []
    deadline = time.perf_counter() + budget_seconds
    while len(latencies) < samples and (len(latencies) < 10 or time.perf_counter() < deadline):
        started = time.perf_counter()
        rows = conn.execute(claim, _params()).all()
        latencies.append((time.perf_counter() - started) * 1000)
        conn.rollback()
        if len(rows) != BATCH:
            raise RuntimeError(f"the claim returned {len(rows)} rows, expected {BATCH}")
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


def measure(conn: Connection, samples: int, budget: float) -> dict[str, Any]:
    latencies = time_claims(conn, samples, budget)
    return {
        "samples": len(latencies),
        "median_ms": statistics.median(latencies),
        "p90_ms": percentile(latencies, 0.9),
        "explain": explain(conn),
    }


def _after_updates(server: Server, size: int, samples: int, budget: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The realistic history: every row was pending once and was made terminal by UPDATE.

    Each such UPDATE leaves a dead entry in the partial index until VACUUM removes it, and
    the claim's index scan steps over them (the first scan marks them dead, later scans
    still read their pages). Measured with autovacuum held off, then after a VACUUM.
    """
    with server.fresh_database("claim_updated") as url:
        engine = bench_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(bench_sql("disable_autovacuum"))
            started = time.perf_counter()
            load_events(engine, pending=size)
            with engine.begin() as conn:
                conn.execute(bench_sql("finish_oldest_events"), {"now": NOW, "count": size - PENDING})
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(bench_sql("analyze_events"))
            progress(f"claim: {size:,} rows loaded pending and {size - PENDING:,} made terminal by UPDATE "
                     f"in {time.perf_counter() - started:.1f}s")
            with engine.connect() as conn:
                updated = measure(conn, samples, budget)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(bench_sql("vacuum_events"))
            with engine.connect() as conn:
                vacuumed = measure(conn, samples, budget)
        finally:
            engine.dispose()
    return updated, vacuumed


def run(server: Server, *, sizes: list[int], samples: int, budget: float) -> dict[str, Any]:
    """Claim latency per table size, ours and naive, and the ratios the issue asks for."""
    results: dict[str, Any] = {"pending": PENDING, "batch_size": BATCH, "sizes": {}}
    for size in sizes:
        with server.fresh_database("claim") as url:
            engine = bench_engine(url)
            try:
                started = time.perf_counter()
                load_events(engine, pending=PENDING, terminal=size - PENDING)
                progress(f"claim: loaded {size:,} rows in {time.perf_counter() - started:.1f}s")
                with engine.connect() as conn:
                    ours = measure(conn, samples, budget)
                with engine.begin() as conn:
                    conn.execute(bench_sql("drop_pending_index"))
                    conn.execute(bench_sql("create_naive_index"))
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(bench_sql("analyze_events"))
                with engine.connect() as conn:
                    naive = measure(conn, samples, budget)
            finally:
                engine.dispose()
        updated, vacuumed = _after_updates(server, size, samples, budget)
        results["sizes"][str(size)] = {"ours": ours, "naive": naive, "ours_updated": updated, "ours_vacuumed": vacuumed}
        progress(f"claim: {size:,} rows made terminal by UPDATE: median {updated['median_ms']:.2f} ms before "
                 f"VACUUM, {vacuumed['median_ms']:.2f} ms after")
        progress(
            f"claim: {size:,} rows: ours median {ours['median_ms']:.2f} ms (p90 {ours['p90_ms']:.2f}), "
            f"naive median {naive['median_ms']:.2f} ms (p90 {naive['p90_ms']:.2f})"
        )
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
