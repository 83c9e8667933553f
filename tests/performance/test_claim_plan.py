"""The claim's plan, pinned: it walks the pending partial index and reads no terminal row.

This is the benchmark's EXPLAIN turned into a check (PERF-1): a schema change that loses
``ix_scheduled_events_pending_due`` (or a claim rewritten so the planner cannot use it)
makes each poll read every dispatched and failed row, and fails here. The table holds
enough terminal rows, loaded in bulk and ANALYZEd, for the planner's choice to mean
something; the statement is production's, with ``:now`` and ``:batch_size`` bound.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from bench.env import NOW, bench_sql, load_events
from sqlalchemy import Connection, Engine, text

from scheduler.core.clock import ManualClock
from scheduler.core.loop import claim_params
from scheduler.database.database import Database
from scheduler.database.queries import sql
from scheduler.operations.retention import Retention

TERMINAL = 30_000
PENDING = 200
BATCH = 20
PENDING_INDEX = "ix_scheduled_events_pending_due"
# The claim's expired step (EXP-2) reads the pending rows with an expiry by their own index,
# and rewrites each by primary key: neither may walk the terminal rows either.
EXPIRY_INDEXES = ("ix_scheduled_events_pending_expiry", "pk_scheduled_events")


def claim_plan(conn: Connection, mode: str) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the real claim, as a custom or a generic plan.

    psycopg prepares a statement after a few executions and PostgreSQL may then settle
    on a generic plan (``:now`` unknown at planning time): both must use the index.
    """
    params = claim_params(NOW, BATCH)
    if mode == "custom":
        explain = text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql("claim_due_events"))
        raw = conn.execute(explain, params).scalar_one()
    else:
        generic = (
            sql("claim_due_events").replace(":now", "$1").replace(":batch_size", "$2")
            .replace(":after_due", "$3").replace(":after_id", "$4").replace(":busy", "$5")
        )
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE bench_claim (timestamptz, integer, timestamptz, text, text[]) AS {generic}")
        # EXECUTE takes no bound parameters: the values go in as literals, the plan stays generic.
        after = params["after_due"].isoformat()
        raw = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_claim('{NOW.isoformat()}', {BATCH}, "
            f"'{after}', '', '{{}}')"
        ).scalar_one()
    conn.rollback()  # the claim locked rows; nothing else changed
    document = raw if isinstance(raw, list) else json.loads(raw)
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if "Scan" in node["Node Type"] else []
    for child in node.get("Plans", []):
        found += scans(child)
    return found


def plan_problems(plan: dict[str, Any]) -> list[str]:
    """What is wrong with a claim plan; empty when it reads only the pending index."""
    problems = []
    every_scan = [s for s in scans(plan) if s.get("Relation Name") == "scheduled_events"]
    expiry_scans = [s for s in every_scan if s.get("Index Name") in EXPIRY_INDEXES]
    table_scans = [s for s in every_scan if s not in expiry_scans]
    if len(table_scans) != 1:
        problems.append(f"expected one scan of scheduled_events besides the expired step's, got {len(table_scans)}")
    if sorted(s.get("Index Name") or "" for s in expiry_scans) != sorted(EXPIRY_INDEXES):
        problems.append(f"the expired step reads {[s.get('Index Name') for s in expiry_scans]}, not {EXPIRY_INDEXES}")
    for scan in expiry_scans:
        if scan.get("Actual Rows", 0) > BATCH or scan.get("Rows Removed by Filter", 0):
            problems.append(f"the expired step read {scan['Actual Rows']} rows on {scan['Index Name']}")
    for scan in table_scans:
        if scan.get("Index Name") != PENDING_INDEX:
            problems.append(f"{scan['Node Type']} on {scan.get('Index Name') or 'the heap'}, not {PENDING_INDEX}")
        if scan.get("Rows Removed by Filter", 0):
            problems.append(f"read and discarded {scan['Rows Removed by Filter']} non-pending rows")
        if scan.get("Actual Rows", 0) > BATCH:
            problems.append(f"read {scan['Actual Rows']} rows for a batch of {BATCH}")
        buffers = scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0)
        if buffers > 50:  # a walk over the terminal rows touches thousands of pages
            problems.append(f"touched {buffers} buffers")
    return problems


def pending_scan(plan: dict[str, Any]) -> dict[str, Any]:
    """The claim's own scan: the one on the pending index."""
    [scan] = [s for s in scans(plan) if s.get("Index Name") == PENDING_INDEX]
    return scan


@pytest.fixture
def settled_table(engine: Engine) -> Engine:
    """30,000 dispatched/failed rows due long ago, 200 due pending rows, fresh statistics."""
    load_events(engine, pending=PENDING, terminal=TERMINAL)
    return engine


@pytest.mark.clause("PERF-1")
@pytest.mark.parametrize("mode", ["custom", "generic"])
def test_the_claim_reads_only_the_pending_index_among_many_terminal_rows(settled_table: Engine, mode: str) -> None:
    """PERF-1: the claim's plan (custom and generic) is one scan of the pending partial index
    that returns exactly one batch and reads no terminal row."""
    with settled_table.connect() as conn:
        plan = claim_plan(conn, mode)
    assert plan_problems(plan) == [], json.dumps(plan, indent=1)
    assert pending_scan(plan)["Actual Rows"] == BATCH


@pytest.mark.clause("PERF-1")
def test_the_plan_check_fails_when_the_schema_loses_the_pending_index(settled_table: Engine) -> None:
    """PERF-1: with only the plain trigger_at index a naive schema would have, the same check
    reports the walk over terminal rows (so the pin above can fail)."""
    with settled_table.begin() as conn:
        conn.execute(bench_sql("drop_pending_index"))
        conn.execute(bench_sql("create_naive_index"))
    with settled_table.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(bench_sql("analyze_events"))
    with settled_table.connect() as conn:
        problems = plan_problems(claim_plan(conn, "custom"))
    assert any(PENDING_INDEX in p for p in problems), problems
    assert any("discarded" in p or "buffers" in p for p in problems), problems


@pytest.mark.clause("PERF-1")
@pytest.mark.clause("RET-7")
@pytest.mark.parametrize("mode", ["custom", "generic"])
def test_the_claim_keeps_its_plan_after_a_retention_run(settled_table: Engine, mode: str) -> None:
    """PERF-1, RET-7: retention deletes the 27,000 old dispatched rows (and their history) in
    batches; the claim's plan is still one scan of the pending index returning one batch."""
    retention = Retention(Database(settled_table), ManualClock(NOW + timedelta(days=31)), days=30,
                          batch_size=5_000, max_batches=100)
    report = retention.run_if_due()
    assert report is not None and report.done and report.deleted == TERMINAL * 9 // 10
    with settled_table.connect() as conn:
        plan = claim_plan(conn, mode)
    assert plan_problems(plan) == [], json.dumps(plan, indent=1)
    assert pending_scan(plan)["Actual Rows"] == BATCH


HELD = 10_000


@pytest.mark.clause("PERF-9")
@pytest.mark.parametrize("mode", ["custom", "generic"])
def test_ten_thousand_held_rows_leave_the_claim_flat(engine: Engine, mode: str) -> None:
    """PERF-9: 10,000 rows held in quiet hours (pending, due by trigger_at before every due row,
    not_before hours ahead) cost the claim nothing: the same one scan of the pending index
    returning one batch, no row read and discarded, and the buffers of the claim without them
    (give or take a level of the index)."""
    load_events(engine, pending=PENDING)
    with engine.connect() as conn:
        without = pending_scan(claim_plan(conn, mode))
    engine.dispose()  # a fresh connection: the generic plan's PREPARE is the connection's
    load_events(engine, pending=0, held=HELD)
    with engine.connect() as conn:
        plan = claim_plan(conn, mode)
    # no scan of the table reads a held row (the expired step, which finds no expiry here, may
    # be planned as a hash join whose probe side stops at its first row: PERF-1 pins that step)
    table_scans = [s for s in scans(plan) if s.get("Relation Name") == "scheduled_events"]
    assert all(s.get("Actual Rows", 0) <= BATCH and not s.get("Rows Removed by Filter", 0) for s in table_scans), \
        json.dumps(plan, indent=1)
    held = pending_scan(plan)
    assert held["Actual Rows"] == without["Actual Rows"] == BATCH
    assert held.get("Rows Removed by Filter", 0) == 0

    def buffers(scan: dict[str, Any]) -> int:
        return int(scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0))

    assert buffers(held) <= buffers(without) + 2, (buffers(without), buffers(held))


@pytest.mark.clause("PERF-9")
def test_the_held_rows_check_fails_when_the_claim_index_is_on_trigger_at(engine: Engine) -> None:
    """PERF-9: with the pending index on (trigger_at, id), as before due_at, the held rows sort
    first and the same check sees them read (so the pin above can fail)."""
    load_events(engine, pending=PENDING, held=HELD)
    with engine.begin() as conn:
        conn.execute(text(f"DROP INDEX scheduler.{PENDING_INDEX}"))
        conn.execute(text(f"CREATE INDEX {PENDING_INDEX} ON scheduler.scheduled_events (trigger_at, id) "
                          "WHERE status = 'pending'"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(bench_sql("analyze_events"))
    with engine.connect() as conn:
        problems = plan_problems(claim_plan(conn, "custom"))
    assert problems, "a claim index on trigger_at should read the held rows"
