"""The smoke tier: a few broad, cheap tests of the core path, run first (WIRE-11).

Each one goes through the real API and the real claim on its own database and checks many
clauses at once, so that with ``bash scripts/test -x`` a bug in the claim, the store or the
dispatch fails here within seconds of the start, before the hundreds of narrower tests
that prove the same clauses one by one (tests/requirements). The rows are stored against
their trigger order and claimed by a replica whose sessions may not scan an index: on a
small table the planner would walk the pending index and hand back trigger order by
itself, so a claim that forgot its ``ORDER BY`` would pass every test but the scale
benchmark's plan check, 10 to 13 minutes in (docs/performance.md, "Time to the first failing
test").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0
from tests.helpers import (
    dispatch_all,
    event_body,
    event_row,
    post_event,
    reminder_facts,
    rows,
    statuses,
)

# A claim that waits on a lock it should skip fails after this instead of hanging the tier.
LOCK_TIMEOUT_MS = 5_000


def _sequential_scans_only(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off")


@contextlib.contextmanager
def table_order_replica(database_url: str, service: SchedulerService, clock: ManualClock) -> Iterator[Scheduler]:
    """A second replica whose sessions may not scan an index: its claim reads rows in the
    table's physical order, so only the claim's ``ORDER BY`` can make it take the oldest."""
    engine = make_engine(database_url, Settings(lock_timeout_ms=LOCK_TIMEOUT_MS, statement_timeout_ms=60_000))
    event.listen(engine, "connect", _sequential_scans_only)  # this engine only
    try:
        yield Scheduler(Database(engine), service.dispatcher, clock, name="table-order")
    finally:
        engine.dispose()


@pytest.mark.clause("REQ-0065.1")
@pytest.mark.clause("REQ-0065.2")
@pytest.mark.clause("REQ-0065.3")
@pytest.mark.clause("REQ-0065.5")
def test_a_claim_takes_the_oldest_due_pending_rows_up_to_the_batch_and_never_a_terminal_or_future_one(
    client: TestClient, service: SchedulerService, engine: Engine, database_url: str, clock: ManualClock
) -> None:
    """REQ-0065.1, .2, .3, .5: with rows dispatched and failed long ago, rows not yet due, and
    more due pending rows than a batch stored youngest first, one claim takes exactly the
    twenty oldest due pending rows, in trigger order; the next takes the rest; then nothing."""
    done = post_event(client, user_id="done", trigger_at=T0 - timedelta(days=2))
    refused = post_event(client, user_id="refused", trigger_at=T0 - timedelta(days=2),
                         facts={"facts_version": "1", "scenario": "no_such_rule", "date": "2026-11-30"})
    assert service.scheduler.poll_once().claimed == 2
    assert statuses(engine) == {done["id"]: "dispatched", refused["id"]: "failed"}
    future = [post_event(client, user_id=f"later-{i}", trigger_at=T0 + timedelta(minutes=1 + i)) for i in range(3)]
    # stored youngest first: the table's physical order is the reverse of the trigger order
    due = [post_event(client, user_id=f"due-{i}", trigger_at=T0 - timedelta(minutes=i)) for i in range(25)]
    oldest_first = [row["id"] for row in reversed(due)]

    # Whatever plan PostgreSQL picks, the order is the claim's own: on a replica whose planner
    # reads the table in physical order (youngest first here), it is still oldest first.
    with table_order_replica(database_url, service, clock) as replica:
        first = replica.claim()
        assert [e.id for e in first.events] == oldest_first[:20]
        dispatch_all(replica, first)
        replica.finish(first)
    second = service.scheduler.claim()
    assert [e.id for e in second.events] == oldest_first[20:]
    dispatch_all(service.scheduler, second)
    service.scheduler.finish(second)
    third = service.scheduler.claim()
    assert third.events == []
    service.scheduler.finish(third)

    final = statuses(engine)
    assert {final[r["id"]] for r in due} == {"dispatched"}
    assert {final[r["id"]] for r in future} == {"pending"}
    assert (final[done["id"]], final[refused["id"]]) == ("dispatched", "failed")


@pytest.mark.clause("REQ-0063.3")
@pytest.mark.clause("REQ-0064.1")
@pytest.mark.clause("REQ-0064.2")
@pytest.mark.clause("REQ-0066.1")
@pytest.mark.clause("REQ-0066.6")
@pytest.mark.clause("REQ-0067.2")
def test_stored_events_go_through_the_engine_once_each_and_a_failing_one_fails_alone(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0063.3, REQ-0064.1, .2, REQ-0066.1, .6, REQ-0067.2: a post without a contract is
    refused and stores nothing; a dispatched row re-posted by its key is rewritten and pending
    again; one poll dispatches it and another event through the rule engine (a notification
    each, the re-post's with its new text) and fails the one no rule claims, with the reason
    and no dispatched_at, beside them; the next poll claims nothing."""
    refused = client.post("/admin/scheduled-events", headers=INGEST,
                          json=event_body(facts={"date": "2026-11-30"}))
    assert refused.status_code == 422 and refused.json()["detail"]["error"] == "invalid_facts_contract", refused.text
    assert statuses(engine) == {}
    first = post_event(client, user_id="anna", external_key="anna-today", trigger_at=T0 - timedelta(minutes=3))
    assert service.scheduler.poll_once().claimed == 1
    assert event_row(engine, first["id"])["status"] == "dispatched"
    # the sender re-posts the key for the next day: the same row, rewritten and pending again
    again = post_event(client, user_id="anna", external_key="anna-today", trigger_at=T0 - timedelta(minutes=2),
                       facts=reminder_facts(day="2026-12-01", commitment="water the plants"))
    assert again["id"] == first["id"] and again["status"] == "pending", again
    assert (again["dispatched_at"], again["last_error"]) == (None, None)
    broken = post_event(client, user_id="bert", trigger_at=T0 - timedelta(minutes=4),
                        facts={"facts_version": "1", "scenario": "no_such_rule", "date": "2026-11-30"})
    other = post_event(client, user_id="cleo", trigger_at=T0 - timedelta(minutes=1))

    report = service.scheduler.poll_once()
    assert report.claimed == 3
    by_id = {r["id"]: r for r in rows(engine, "SELECT id, status, last_error, dispatched_at FROM scheduled_events")}
    assert set(by_id) == {first["id"], broken["id"], other["id"]}
    assert by_id[broken["id"]]["status"] == "failed"
    assert "no_rule_for_scenario" in by_id[broken["id"]]["last_error"], by_id[broken["id"]]
    assert by_id[broken["id"]]["dispatched_at"] is None
    for event_id in (first["id"], other["id"]):
        assert by_id[event_id]["status"] == "dispatched" and by_id[event_id]["last_error"] is None
        assert by_id[event_id]["dispatched_at"] is not None
    notes = rows(engine, "SELECT user_id, title, status FROM notifications ORDER BY user_id, created_at")
    assert [(n["user_id"], n["status"]) for n in notes] == [("anna", "sent"), ("anna", "sent"), ("cleo", "sent")], notes
    assert "dishwasher" in notes[0]["title"] and "water the plants" in notes[1]["title"]
    assert service.scheduler.poll_once().claimed == 0


@pytest.mark.clause("REQ-0065.4")
def test_two_replicas_claiming_at_once_take_disjoint_rows_without_waiting(
    client: TestClient, service: SchedulerService, database_url: str, clock: ManualClock
) -> None:
    """REQ-0065.4: while one replica holds its batch, another's claim skips those rows (it
    neither waits on them nor takes them) and takes the rest."""
    posted = [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=i)) for i in range(25)]
    # the second replica's own engine, with a lock timeout: a claim that waits fails, never hangs
    engine = make_engine(database_url, Settings(lock_timeout_ms=LOCK_TIMEOUT_MS, statement_timeout_ms=60_000))
    try:
        other = Scheduler(Database(engine), service.dispatcher, clock, name="replica-2")
        first = service.scheduler.claim()
        second = other.claim()
        taken = [e.id for e in first.events], [e.id for e in second.events]
        assert (len(taken[0]), len(taken[1])) == (20, 5)
        assert not set(taken[0]) & set(taken[1])
        assert sorted(taken[0] + taken[1]) == sorted(r["id"] for r in posted)
        other.abort(second)
        service.scheduler.abort(first)
    finally:
        engine.dispose()
