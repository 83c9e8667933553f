"""DEC-1.7: one fragment writes a claimed row's outcome; every other write of a row's status is
an operator's command or the store's re-post.

queries.sql is read as written (its blocks before their ``{{fragment}}`` includes are expanded):
a block writes ``scheduled_events.status`` when it updates that table (or rewrites it on a
conflict) with ``status =`` in its SET list. The blocks that do are exactly the ones named
below, each with what it is; the statements that end a claimed row (the batch's outcomes, the
set-based write, the claim's expiry) write nothing of the status themselves and include the
one fragment that does; no Python module of the package writes the table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler.database.queries import SQL_FILE, load_queries

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^-- name: (?P<name>\w+)\n-- (?P<doc>[^\n]+)\n(?P<sql>.*?)(?=^-- name: |\Z)", re.M | re.S)
UPDATES_EVENTS = re.compile(r"UPDATE scheduler\.scheduled_events\b|ON CONFLICT \(external_key\) DO UPDATE")
# ``status =`` as an assignment of a SET list (not a comparison in a WHERE or a CASE)
ASSIGNS_STATUS = re.compile(r"\bSET\b(?:(?!\bWHERE\b|\bFROM\b|\bRETURNING\b).)*?(?<![\w.>'])status\s*=", re.S)

# The one write of a claimed row's outcome, and the statements that end a claimed row.
OUTCOME_FRAGMENT = "write_outcomes"
OUTCOME_STATEMENTS = ("record_outcomes", "write_batch_decisions", "claim_due_events")
# Every other block that writes a row's status, and why it is not a row's outcome.
NOT_OUTCOMES = {
    "reset_event": "an operator's reset of one row, from the statuses a reset allows (DEC-12)",
    "cancel_event": "an operator's cancel of one row, from the statuses a cancel allows (DEC-12)",
    "change_filtered_chunk": "an operator's bulk reset or cancel, chunk by chunk (DEC-CANCEL-1)",
    "rewrite_by_key": "the store's re-post of a known key: the row is pending again (REQ-0064)",
    "mark_dispatched": "the benchmarks' raw-SQL ceiling and the status-first broken variant (never production's)",
}


def status_writers() -> set[str]:
    """The blocks of queries.sql that assign ``scheduled_events.status``, read as written."""
    found = set()
    for block in BLOCK.finditer(Path(SQL_FILE).read_text()):
        sql = re.sub(r"--[^\n]*", "", block["sql"])
        if UPDATES_EVENTS.search(sql) and ASSIGNS_STATUS.search(sql):
            found.add(block["name"])
    return found


@pytest.mark.clause("DEC-1.7")
def test_one_fragment_writes_a_claimed_rows_outcome_and_every_other_status_write_is_named() -> None:
    """DEC-1.7: the blocks that write a row's status are the outcome fragment and the operator
    commands and store named here, no more and no fewer; the three statements that end a claimed
    row write no status of their own and each includes the fragment."""
    assert status_writers() == {OUTCOME_FRAGMENT, *NOT_OUTCOMES}
    queries = load_queries()
    fragment = queries[OUTCOME_FRAGMENT].sql
    text = Path(SQL_FILE).read_text()
    for name in OUTCOME_STATEMENTS:
        assert re.search(r"-- name: " + name + r"\n.*?\{\{" + OUTCOME_FRAGMENT + r"\}\}", text, re.S), name
        assert fragment in queries[name].sql, name
    # the batch's two writes read the same arrays
    arrays = queries["batch_outcomes"].sql
    assert arrays in queries["record_outcomes"].sql and arrays in queries["write_batch_decisions"].sql


@pytest.mark.clause("DEC-1.7")
def test_the_status_writers_check_finds_a_second_outcome_write() -> None:
    """DEC-1.7: the reader is not vacuous: the outcome part the set-based write had before the
    fragment (its own SET of status from the JSON document) is found as a status writer."""
    former = ("UPDATE scheduler.scheduled_events AS e\n    SET status = o->>'status',\n"
              "        last_error = o->>'error'\n    FROM document, jsonb_array_elements(document.b->'outcomes') AS o")
    assert UPDATES_EVENTS.search(former) and ASSIGNS_STATUS.search(former)
    assert not ASSIGNS_STATUS.search("SELECT 1 FROM scheduler.scheduled_events WHERE status = 'failed'")


@pytest.mark.clause("DEC-1.7")
def test_no_python_module_writes_a_scheduled_events_status() -> None:
    """DEC-1.7: every production write of the table is a statement of queries.sql: no module of
    the package updates ``scheduled_events`` itself (the harness's broken variants do, on
    purpose: their mistakes are not production's)."""
    writes = re.compile(r"UPDATE\s+(?:\w+\.)?scheduled_events\b", re.I)
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "src" / "scheduler").rglob("*.py"))
                 if "migrations" not in p.parts and writes.search(p.read_text())]
    assert offenders == []
