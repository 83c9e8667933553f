"""DEC-PLANS: a burst's statements reach the rows they name through their keys, whatever the
planner's statistics and costs say, on real PostgreSQL.

A batch's write names its events by id, and the delivery worker's claim names a few hundred
rows and joins each to its notification and its event. Left to itself, PostgreSQL's planner
counts a random page read as four sequential ones, so while a table holds some tens of
thousands of rows it prefers to hash a sequential scan of all of it over a hundred probes
of the primary key: every batch of a burst then read every row stored so far. Each test
below shows the planner doing that to the statement without its safeguard, and not doing it
to the statement as the scheduler sends it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService

ROWS = 3000  # a burst's tables: small enough that the planner would rather scan them whole


def _fill(engine: Engine, now: Any, *, queued: bool) -> None:
    """``ROWS`` decided reminders: events, their notifications and outbox rows (queued and due,
    or delivered), analyzed, as a table looks in the middle of a burst."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at, facts, "
            "status, created_at, updated_at, dispatched_at) "
            "SELECT 'e-' || g, 'commitment_reminder', 'u-' || g, 'c', 'k-' || g, :now, '{}', 'dispatched', "
            ":now, :now, :now FROM generate_series(1, :n) AS g"), {"now": now, "n": ROWS})
        conn.execute(text(
            "INSERT INTO notifications (id, user_id, community_id, rule_id, kind, scenario, time_scope, dedup_key, "
            "title, body, status, source, scheduled_event_id, created_at) "
            "SELECT 'n-' || g, 'u-' || g, 'c', 'r', 'reminder', 's', '2026-11-30', 'd-' || g, 't', 'b', 'sent', "
            "'scheduled', 'e-' || g, :now FROM generate_series(1, :n) AS g"), {"now": now, "n": ROWS})
        conn.execute(text(
            "INSERT INTO dedup_keys (key, notification_id, created_at) "
            "SELECT 'd-' || g, 'n-' || g, :now FROM generate_series(1, :n) AS g"), {"now": now, "n": ROWS})
        conn.execute(text(
            "INSERT INTO participant_preferences (user_id, max_per_day, updated_at) "
            "SELECT 'u-' || g, 3, :now FROM generate_series(1, :n) AS g"), {"now": now, "n": ROWS})
        conn.execute(text(
            "INSERT INTO deliveries (notification_id, user_id, channel, status, created_at, idempotency_key, "
            "message, next_attempt_at, updated_at, attempts) "
            "SELECT 'n-' || g, 'u-' || g, 'sms', :status, :now, 'i-' || g, '{}', "
            "CASE WHEN :queued THEN :now - g * interval '1 ms' END, :now, 0 FROM generate_series(1, :n) AS g"),
            {"now": now, "n": ROWS, "queued": queued, "status": "queued" if queued else "delivered"})
        conn.execute(text("ANALYZE scheduled_events, notifications, dedup_keys, deliveries, participant_preferences"))


def _plan(engine: Engine, statement: str, params: dict[str, Any], *, first: str | None = None) -> list[dict[str, Any]]:
    """Every node of ``statement``'s plan (EXPLAIN, FORMAT JSON; nothing runs), ``first`` sent
    before it in the same transaction."""
    with engine.connect() as conn:
        if first is not None:
            conn.execute(text(first))
        [[document]] = conn.execute(text("EXPLAIN (FORMAT JSON) " + statement), params).fetchall()
        conn.rollback()
    nodes: list[dict[str, Any]] = []
    pending = [document[0]["Plan"]]
    while pending:
        node = pending.pop()
        nodes.append(node)
        pending.extend(node.get("Plans", []))
    return nodes


def _scanned_whole(nodes: list[dict[str, Any]]) -> set[str]:
    """The tables a plan reads by a sequential scan."""
    return {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}


def _without(sql: str, safeguard: str) -> str:
    """``sql`` with the lines of its safeguard (one clause and its comment) taken out."""
    lines = sql.splitlines()
    [at] = [i for i, line in enumerate(lines) if safeguard in line]
    start = at
    while lines[start - 1].lstrip().startswith("--"):
        start -= 1
    return "\n".join(lines[:start] + lines[at + 1:])


@pytest.mark.clause("DEC-PLANS")
def test_a_claim_of_deliveries_finds_each_rows_notification_and_event_by_primary_key_in_a_burst(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """DEC-PLANS: a claim of a few hundred due outbox rows, sent as the worker sends it
    (``claim_by_due_order`` first), leases them and joins each to its notification and its
    event through their primary keys, reading none of the three tables whole; without the
    setting, the planner hashes a sequential scan of them."""
    now = clock.now()
    _fill(engine, now, queued=True)
    statements = service.database.deliveries.statements
    sql = str(statements["claim_due_deliveries"])
    params = {"now": now, "lease_until": now + timedelta(seconds=30), "worker": "w", "limit": 512}

    ordered = _plan(engine, sql, params, first=str(statements["claim_by_due_order"]))
    assert not _scanned_whole(ordered) & {"deliveries", "notifications", "scheduled_events"}
    assert not {"Hash Join", "Merge Join"} & {n["Node Type"] for n in ordered}
    assert {n.get("Index Name") for n in ordered} >= {"pk_deliveries", "pk_notifications", "pk_scheduled_events"}

    alone = _plan(engine, sql, params, first="SELECT set_config('enable_bitmapscan', 'off', true)")
    assert _scanned_whole(alone) & {"deliveries", "notifications", "scheduled_events"}


@pytest.mark.clause("DEC-PLANS")
def test_a_batchs_write_finds_its_events_and_its_repeated_keys_by_primary_key_in_a_burst(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """DEC-PLANS: a batch's write of 100 outcomes and 50 repeated deduplication keys reaches
    each event and each key through its primary key, reading neither table whole; the same
    statement without the arrays of ids hashes a sequential scan of both."""
    now = clock.now()
    _fill(engine, now, queued=False)
    sql = service.database.statements.sql("write_batch_decisions")
    document = {"new_keys": [], "notifications": [], "deliveries": [], "push_deliveries": [],
                "repeated_keys": [{"key": f"d-{i}", "duplicates": 1, "at": now.isoformat(), "notification_id": None}
                                  for i in range(1, 51)]}
    ids = [f"e-{i}" for i in range(1, 101)]
    params = {"batch": json.dumps(document), "ids": ids, "statuses": ["dispatched"] * 100, "errors": [None] * 100,
              "times": [now] * 100, "not_befores": [None] * 100}

    assert not _scanned_whole(_plan(engine, sql, params)) & {"scheduled_events", "dedup_keys"}

    alone = _without(_without(sql, "AND e.id = ANY(ARRAY(SELECT id FROM outcomes))"), "AND d.key = ANY(ARRAY(")
    assert _scanned_whole(_plan(engine, alone, params)) >= {"scheduled_events", "dedup_keys"}


@pytest.mark.clause("DEC-PLANS")
def test_a_claimed_batchs_outcomes_are_recorded_by_primary_key_in_a_burst(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """DEC-PLANS: ``record_outcomes`` (the per-event path's write of a batch's outcomes, the
    same fragment as the batch's write) reaches each event through the primary key."""
    now = clock.now()
    _fill(engine, now, queued=False)
    ids = [f"e-{i}" for i in range(1, 101)]
    params = {"ids": ids, "statuses": ["dispatched"] * 100, "errors": [None] * 100, "times": [now] * 100,
              "not_befores": [None] * 100}
    sql = service.database.statements.sql("record_outcomes")
    assert "scheduled_events" not in _scanned_whole(_plan(engine, sql, params))
    alone = _without(sql, "AND e.id = ANY(ARRAY(SELECT id FROM outcomes))")
    assert "scheduled_events" in _scanned_whole(_plan(engine, alone, params))


@pytest.mark.clause("DEC-PLANS")
def test_a_batchs_read_finds_its_participants_preferences_and_taken_keys_by_primary_key_in_a_burst(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """DEC-PLANS: the decision's one read (``read_batch_limits``) of a batch of 100 participants
    and 100 deduplication keys probes ``participant_preferences`` and ``dedup_keys`` by primary
    key; with the ids as counted arrays, the planner scans both tables whole, comparing every
    row with every id."""
    now = clock.now()
    _fill(engine, now, queued=False)
    sql = service.database.statements.sql("read_batch_limits")
    params = {"user_ids": [f"u-{i}" for i in range(1, 101)], "keys": [f"d-{i}" for i in range(1, 101)],
              "window_start": now - timedelta(hours=48), "window_end": now + timedelta(hours=48)}
    assert not _scanned_whole(_plan(engine, sql, params)) & {"participant_preferences", "dedup_keys"}
    counted = (sql.replace("ANY(ARRAY(SELECT unnest(CAST(:user_ids AS text[]))))", "ANY(CAST(:user_ids AS text[]))")
               .replace("ANY(ARRAY(SELECT unnest(CAST(:keys AS text[]))))", "ANY(CAST(:keys AS text[]))"))
    assert counted != sql
    assert _scanned_whole(_plan(engine, counted, params)) >= {"participant_preferences", "dedup_keys"}
