"""The plans of the metrics gauges and the console's queries, pinned (like PERF-1).

Among 30,000 terminal rows and 200 pending ones (loaded in bulk and ANALYZEd), each query
the overview, the failed-events page and the metrics scrape run must read the index made
for it, never the table's terminal rows: a schema change that loses one of those indexes
(or a query rewritten so the planner cannot use it) fails here.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from bench.env import NOW, load_events
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import sessionmaker

from scheduler.application import counts
from scheduler.application.events import EventQuery
from scheduler.database.database import Database
from scheduler.database.events import EventRepository
from scheduler.database.queries import sql
from scheduler.types import EventStatus
from tests.performance.test_claim_plan import scans

PENDING = "ix_scheduled_events_pending_due"
FAILED = "ix_scheduled_events_failed"
UPDATED_AT = "ix_scheduled_events_updated_at"
# retention's partial index holds exactly the dispatched and cancelled rows by
# updated_at: as good a window for the lateness of the last hour, and smaller
FINISHED = "ix_scheduled_events_finished"
USER = "ix_scheduled_events_user_id"


def explain(conn: Connection, name: str, params: dict[str, Any], *, generic: bool = False) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the named production statement, custom or generic."""
    if generic:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        prepared = sql(name)
        names = sorted(params, key=len, reverse=True)
        for n, key in enumerate(names, 1):
            prepared = prepared.replace(f":{key}", f"${n}")
        types = ", ".join("timestamptz" for _ in names)
        conn.exec_driver_sql(f"PREPARE plan_check ({types}) AS {prepared}")
        values = ", ".join(f"'{params[k].isoformat()}'" for k in names)
        raw = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE plan_check({values})").scalar_one()
    else:
        raw = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql(name)), params).scalar_one()
    conn.rollback()
    document = raw if isinstance(raw, list) else json.loads(raw)
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def problems(plan: dict[str, Any], index: str | set[str], max_rows: int) -> list[str]:
    """What is wrong: a scan of scheduled_events off ``index`` (or any of a set), or reading more
    than ``max_rows``."""
    allowed = {index} if isinstance(index, str) else index
    found = []
    table_scans = [s for s in scans(plan) if s.get("Relation Name") == "scheduled_events"]
    if not table_scans:
        found.append("no scan of scheduled_events")
    for scan in table_scans:
        # a bitmap heap scan reads the heap pages its bitmap index scan (the child) found
        used = scan.get("Index Name") or next(
            (c.get("Index Name") for c in scan.get("Plans", []) if c["Node Type"] == "Bitmap Index Scan"), None)
        if used not in allowed:
            found.append(f"{scan['Node Type']} on {scan.get('Index Name') or 'the heap'}, "
                         f"not {' or '.join(sorted(allowed))}")
        read = scan.get("Actual Rows", 0) + scan.get("Rows Removed by Filter", 0)
        if read > max_rows:
            found.append(f"read {read} rows (at most {max_rows} expected)")
    return found


@pytest.fixture
def settled_table(engine: Engine) -> Engine:
    """30,000 dispatched/failed rows, 200 due pending rows, 50 rows dispatched in the last hour."""
    load_events(engine, pending=200, terminal=30_000)
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE scheduled_events SET dispatched_at = :now - interval '10 minutes', "
            "updated_at = :now - interval '10 minutes' "
            "WHERE id IN (SELECT id FROM scheduled_events WHERE status = 'dispatched' ORDER BY id LIMIT 50)"),
            {"now": NOW})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE scheduled_events"))
    return engine


@pytest.mark.clause("OBS-4")
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_metrics_gauges_read_only_the_partial_indexes(settled_table: Engine, generic: bool) -> None:
    """OBS-4: backlog and oldest overdue from the pending index, failed rows from the failed index
    (custom and generic plans: a scraper's statements get prepared)."""
    with settled_table.connect() as conn:
        backlog = explain(conn, "backlog_gauges", {"now": NOW}, generic=generic)
        failed = explain(conn, "count_failed", {"cap": counts.COUNT_CAP})
    assert problems(backlog, PENDING, 200) == [], json.dumps(backlog, indent=1)
    assert problems(failed, FAILED, 3_000) == [], json.dumps(failed, indent=1)


@pytest.mark.clause("CON-9")
def test_the_overview_queries_read_their_indexes(settled_table: Engine) -> None:
    """CON-9: lateness of the last hour reads only that hour's dispatches; the failures of 24 h and
    the pending count read their partial indexes."""
    with settled_table.connect() as conn:
        lateness = explain(conn, "lateness_percentiles", {"since": NOW - timedelta(hours=1), "now": NOW})
        failures = explain(conn, "failures_by_kind", {"since": NOW - timedelta(hours=24), "sample": 10_000})
        pending = explain(conn, "count_pending", {"cap": counts.COUNT_CAP})
    assert problems(lateness, {UPDATED_AT, FINISHED}, 50) == [], json.dumps(lateness, indent=1)
    assert problems(failures, FAILED, 3_000) == [], json.dumps(failures, indent=1)
    assert problems(pending, PENDING, 200) == [], json.dumps(pending, indent=1)


@pytest.mark.clause("CON-9")
def test_the_failed_events_page_reads_the_failed_index_and_stops_at_one_page(settled_table: Engine) -> None:
    """CON-9: the events page filtered by status failed walks the failed index newest first and
    reads one page (51 rows), not the terminal rows."""
    params = {**EventQuery(status=EventStatus.FAILED).params(), "after_at": None, "after_id": "", "limit": 51}
    with settled_table.connect() as conn:
        plan = explain(conn, "filter_events_page", params)
    assert problems(plan, FAILED, 3_000) == [], json.dumps(plan, indent=1)
    assert plan["Actual Rows"] == 51


@pytest.mark.clause("CON-9")
def test_every_events_page_reads_one_page_by_keyset_even_unfiltered_and_among_equal_times(
    settled_table: Engine,
) -> None:
    """CON-9: the unfiltered page walks the (updated_at, id) index; the next page of failed rows, whose
    times are all equal here, continues on the failed index without rereading the rows before it."""
    first = {**EventQuery().params(), "after_at": None, "after_id": "", "limit": 51}
    failed = EventQuery(status=EventStatus.FAILED).params()
    with settled_table.connect() as conn:
        last = conn.execute(text(
            "SELECT updated_at, id FROM scheduled_events WHERE status = 'failed' ORDER BY updated_at DESC, id DESC "
            "OFFSET 1500 LIMIT 1")).one()
        unfiltered = explain(conn, "filter_events_page", first)
        later = explain(conn, "filter_events_page", {**failed, "after_at": last[0], "after_id": last[1], "limit": 51})
    assert problems(unfiltered, UPDATED_AT, 51) == [], json.dumps(unfiltered, indent=1)
    assert problems(later, FAILED, 51) == [], json.dumps(later, indent=1)


@pytest.mark.clause("CON-9")
def test_the_pending_page_walks_the_pending_index_in_the_claims_order(settled_table: Engine) -> None:
    """CON-9: pending rows, next due first, first and next page: one page read from the pending index."""
    pending = EventQuery(status=EventStatus.PENDING).params()
    with settled_table.connect() as conn:
        first = explain(conn, "filter_pending_page", {**pending, "after_at": None, "after_id": "", "limit": 51})
        nxt = explain(conn, "filter_pending_page", {**pending, "after_at": NOW - timedelta(minutes=30),
                                                    "after_id": "", "limit": 51})
    assert problems(first, PENDING, 51) == [], json.dumps(first, indent=1)
    assert problems(nxt, PENDING, 51) == [], json.dumps(nxt, indent=1)


@pytest.mark.clause("CON-9")
def test_the_plan_check_fails_without_the_updated_at_index(settled_table: Engine) -> None:
    """CON-9: dropping the (updated_at, id) index makes the lateness query read the table, and the check says so."""
    with settled_table.begin() as conn:
        conn.execute(text(f"DROP INDEX {UPDATED_AT}"))
    with settled_table.connect() as conn:
        plan = explain(conn, "lateness_percentiles", {"since": NOW - timedelta(hours=1), "now": NOW})
    assert any(UPDATED_AT in p for p in problems(plan, UPDATED_AT, 50))


@pytest.mark.clause("CON-16")
def test_past_the_exact_limit_the_status_counts_read_no_row_of_the_table(
    settled_table: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CON-16: in a big table the estimate of each status reads the catalogue only, the exact pending
    and failed counts their partial indexes, and the estimates land near the truth."""
    with settled_table.connect() as conn:
        estimate = explain(conn, "estimate_events_by_status", {})
        truth = {s: n for s, n in conn.execute(text("SELECT status, count(*) FROM scheduled_events GROUP BY 1"))}
    assert [s for s in scans(estimate) if s.get("Relation Name") == "scheduled_events"] == []
    sessions = sessionmaker(settled_table)
    with sessions.begin() as session:
        figures = counts.status_counts(session, EventRepository.of(), exact_limit=10_000)
    assert figures.estimated == {EventStatus.DISPATCHED, EventStatus.CANCELLED, EventStatus.EXPIRED}
    assert figures.counts[EventStatus.PENDING] == truth["pending"]
    assert figures.counts[EventStatus.FAILED] == truth["failed"]
    assert abs(figures.counts[EventStatus.DISPATCHED] - truth["dispatched"]) <= truth["dispatched"] * 0.05


@pytest.mark.clause("PERF-4")
def test_the_pending_and_failed_counts_stop_at_the_cap_and_are_estimated_past_it(
    settled_table: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PERF-4: a count of an indexed status reads at most cap + 1 entries of its partial index; past
    the cap the overview and the failed gauge show the planner's estimate (near the truth), and the
    overview names it estimated; under the cap both stay exact."""
    from scheduler.operations.metrics import database_gauges

    with settled_table.connect() as conn:
        failed_plan = explain(conn, "count_failed", {"cap": 1_000})
        pending_plan = explain(conn, "count_pending", {"cap": 100})
        truth = {s: n for s, n in conn.execute(text("SELECT status, count(*) FROM scheduled_events GROUP BY 1"))}
    assert problems(failed_plan, FAILED, 1_001) == [], json.dumps(failed_plan, indent=1)
    assert problems(pending_plan, PENDING, 101) == [], json.dumps(pending_plan, indent=1)
    sessions = sessionmaker(settled_table)
    with sessions.begin() as session:
        exact = counts.counted_or_estimated(session, EventRepository.of(), EventStatus.FAILED, cap=10_000)
        assert exact == (truth["failed"], False)
        estimate, estimated = counts.counted_or_estimated(session, EventRepository.of(), EventStatus.FAILED, cap=1_000)
        assert estimated and abs(estimate - truth["failed"]) <= truth["failed"] * 0.1
        figures = counts.status_counts(session, EventRepository.of(), exact_limit=10_000, cap=1_000)
    assert figures.estimated == {EventStatus.DISPATCHED, EventStatus.FAILED, EventStatus.CANCELLED,
                                 EventStatus.EXPIRED}
    assert figures.counts[EventStatus.PENDING] == truth["pending"]
    assert abs(figures.counts[EventStatus.FAILED] - truth["failed"]) <= truth["failed"] * 0.1
    # 1,000 more failures since ANALYZE: the estimate lags them, the exact count does not
    with settled_table.begin() as conn:
        conn.execute(text("UPDATE scheduled_events SET status = 'failed' WHERE id IN "
                          "(SELECT id FROM scheduled_events WHERE status = 'dispatched' ORDER BY id LIMIT 1000)"))
    monkeypatch.setattr(counts, "COUNT_CAP", 1_000)
    assert abs(database_gauges(Database(settled_table), NOW)["failed"] - truth["failed"]) <= truth["failed"] * 0.1
    monkeypatch.setattr(counts, "COUNT_CAP", 10_000)
    assert database_gauges(Database(settled_table), NOW)["failed"] == truth["failed"] + 1_000


@pytest.mark.clause("PERF-5")
@pytest.mark.parametrize("user_id", ["user-42", "nobody"], ids=["some-rows", "no-row"])
def test_a_participants_rows_are_read_from_the_participant_index_one_page_at_most(
    settled_table: Engine, user_id: str
) -> None:
    """PERF-5: the console's events page and the API's list filtered by participant read
    ix_scheduled_events_user_id and that participant's rows only (one page at most), whether the
    participant has rows or none: never a walk of the whole table."""
    with settled_table.connect() as conn:
        for name, order_note in (("filter_events_page", "console"), ("list_events", "api")):
            params = {**EventQuery(user_id=user_id).params(), "after_at": None, "after_id": "", "limit": 51}
            plan = explain(conn, name, params)
            assert problems(plan, USER, 51) == [], (order_note, json.dumps(plan, indent=1))
