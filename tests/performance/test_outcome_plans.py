"""The batch's outcomes reach their rows by primary key, pinned (PERF-7).

A batch's last statement updates its claimed rows: ``record_outcomes`` or the set-based
write's ``outcome`` part, both the one fragment ``write_outcomes`` over the same arrays
(``batch_outcomes``, DEC-1.7). Sent with client-side binding, the arrays are constants the
planner can count; a JSON document's elements are not (the write once read its outcomes from
one: the planner guessed a hundred of them and hash-joined a sequential scan of the whole
table, a third of the write at a few thousand rows, growing with the table). These tests
EXPLAIN the exact text a poll sends (bound the same way) over a few thousand ANALYZEd rows and
fail on any sequential scan of the table.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from bench.env import NOW, load_events
from sqlalchemy import Connection, Engine, text

from scheduler.database.queries import Statements

ROWS = 3_000
BATCH = 20


def table_scans(node: dict[str, Any]) -> list[str]:
    """How the plan reads scheduled_events: its sequential scans ("Seq Scan") and the
    index scans of its indexes ("Index Scan on pk_scheduled_events", bitmap ones included)."""
    found = []
    if node.get("Relation Name") == "scheduled_events" and node["Node Type"] == "Seq Scan":
        found.append("Seq Scan")
    if str(node.get("Index Name", "")).startswith(
            ("pk_scheduled_events", "ix_scheduled_events", "uq_scheduled_events")):
        found.append(f"{node['Node Type']} on {node['Index Name']}")
    for child in node.get("Plans", []):
        found += table_scans(child)
    return found


def plan_of(conn: Connection, name: str, params: dict[str, Any]) -> list[str]:
    """The table's scans in the plan of the statement ``name`` as a poll sends it."""
    compiled = Statements.of()[name].compile(dialect=conn.dialect)
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    with psycopg.ClientCursor(driver) as binder:
        sent = binder.mogrify(compiled.string, compiled.construct_params(params))
    raw = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sent).scalar_one()
    document = raw if isinstance(raw, list) else json.loads(raw)
    return table_scans(document[0]["Plan"])


@pytest.fixture
def claimed(engine: Engine) -> list[str]:
    load_events(engine, pending=ROWS)
    with engine.connect() as conn:
        return [str(i) for i in conn.execute(text(f"SELECT id FROM scheduled_events LIMIT {BATCH}")).scalars()]


@pytest.mark.clause("PERF-7")
def test_the_set_based_writes_outcomes_reach_their_rows_by_primary_key(engine: Engine, claimed: list[str]) -> None:
    """PERF-7: the set-based write's outcome update finds its twenty rows through the primary
    key among thousands, never by a sequential scan of the table."""
    document: dict[str, list[Any]] = {"new_keys": [], "repeated_keys": [], "notifications": [], "deliveries": []}
    with engine.connect() as conn:
        scans = plan_of(conn, "write_batch_decisions",
                        {"batch": json.dumps(document), "ids": claimed, "statuses": ["dispatched"] * BATCH,
                         "errors": [None] * BATCH, "times": [NOW] * BATCH, "not_befores": [None] * BATCH})
    assert scans and all(s.endswith("on pk_scheduled_events") for s in scans), scans


@pytest.mark.clause("PERF-7")
def test_the_recorded_outcomes_reach_their_rows_by_primary_key(engine: Engine, claimed: list[str]) -> None:
    """PERF-7: ``record_outcomes`` (the mechanics' and the per-event path's last statement) finds
    its twenty rows through the primary key among thousands."""
    with engine.connect() as conn:
        scans = plan_of(conn, "record_outcomes", {"ids": claimed, "statuses": ["dispatched"] * BATCH,
                                                   "errors": [None] * BATCH, "times": [NOW] * BATCH,
                                                   "not_befores": [None] * BATCH})
    assert scans and all(s.endswith("on pk_scheduled_events") for s in scans), scans
