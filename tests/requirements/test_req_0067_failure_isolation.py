"""REQ-0067 — one failing event does not take the batch or the loop with it.

In our words: an exception while dispatching one event marks that row ``failed`` with the
error text in ``last_error`` and no ``dispatched_at``, and the rest of the batch is still
processed, whether the exception came from Python or from the database. A successful
dispatch clears an earlier ``last_error``. An exception that escapes a whole poll is caught
by the loop, which goes on polling. Nothing restarts the loop if it exits, so its death
must at least be visible: ``GET /health/scheduler`` answers 503.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.core.loop import Batch
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, DispatchResult
from tests.conftest import ADMIN, T0
from tests.helpers import (
    DEADLINE_SECONDS,
    FakeDispatcher,
    event_row,
    eventually,
    post_event,
    rows,
    running,
    statuses,
)


def batch_of_five(client: TestClient, middle: str = "user-2") -> list[dict[str, Any]]:
    """Five due rows for five participants, in trigger order; ``middle`` is the third."""
    names = ["user-0", "user-1", middle, "user-3", "user-4"]
    return [post_event(client, user_id=name, trigger_at=T0 - timedelta(minutes=10 - i)) for i, name in enumerate(names)]


def sent_to(engine: Engine) -> list[str]:
    return sorted(r["user_id"] for r in rows(engine, "SELECT user_id FROM notifications WHERE status = 'sent'"))


@pytest.mark.clause("REQ-0067.1")
@pytest.mark.clause("REQ-0067.2")
def test_a_python_exception_fails_only_its_row_and_the_rest_of_the_batch_goes_on(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.1, REQ-0067.2: the middle row is failed with the error text; the four others dispatch."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = FakeDispatcher(service.dispatcher, {"user-2": ValueError("evaluator blew up")})
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "failed", "dispatched", "dispatched"]
    failed = event_row(engine, posted[2]["id"])
    assert (failed["status"], failed["dispatched_at"]) == ("failed", None)
    assert failed["last_error"] == "ValueError: evaluator blew up"
    assert sent_to(engine) == ["user-0", "user-1", "user-3", "user-4"]


class FailingStatementDispatcher:
    """A fake dispatcher that, for one participant, writes a notification and then runs a
    statement PostgreSQL rejects, after which the transaction would be aborted."""

    def __init__(self, real: Any, victim: str, sql: str) -> None:
        self.real, self.victim, self.sql = real, victim, sql

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        result: DispatchResult = self.real(session, event, now)
        if event.user_id == self.victim:
            session.execute(text(self.sql))
        return result


@pytest.mark.clause("DEC-1")
@pytest.mark.clause("REQ-0067.3")
@pytest.mark.parametrize(
    "bad_sql",
    ["SELECT 1 / 0", "INSERT INTO notifications SELECT * FROM notifications LIMIT 1", "SELECT * FROM no_such_table"],
    ids=["division-by-zero", "unique-violation", "undefined-table"],
)
def test_a_database_error_inside_one_event_does_not_poison_the_batch(
    client: TestClient, service: SchedulerService, engine: Engine, bad_sql: str
) -> None:
    """REQ-0067.3: the failed statement is confined to its savepoint; its writes vanish, others commit."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = FailingStatementDispatcher(service.dispatcher, "user-2", bad_sql)
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "failed", "dispatched", "dispatched"]
    last_error = event_row(engine, posted[2]["id"])["last_error"]
    assert last_error.startswith(("DataError", "IntegrityError", "ProgrammingError"))
    assert sent_to(engine) == ["user-0", "user-1", "user-3", "user-4"]  # user-2's notification rolled back


class DuplicateKeyDispatcher:
    """A fake dispatcher that reproduces the public implementation's incident: the middle
    event inserts a deduplication key that already exists (a unique violation)."""

    def __init__(self, real: Any, victim: str) -> None:
        self.real, self.victim = real, victim

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if event.user_id == self.victim:
            for _ in range(2):
                session.execute(
                    text("INSERT INTO dedup_keys (key, notification_id, created_at) VALUES ('dup', 'n', :now)"),
                    {"now": now},
                )
        result: DispatchResult = self.real(session, event, now)
        return result


@pytest.mark.clause("REQ-0067.4")
def test_a_duplicate_key_in_the_middle_of_a_batch_fails_one_row_and_blocks_nothing(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """REQ-0067.4: the seven-week incident, replayed: a unique violation mid-batch fails only that row,
    and the reminders behind it go out in this poll and in every later one."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = DuplicateKeyDispatcher(service.dispatcher, "user-2")
    service.scheduler.poll_once()
    assert "duplicate key" in event_row(engine, posted[2]["id"])["last_error"]
    assert sent_to(engine) == ["user-0", "user-1", "user-3", "user-4"]
    later_one = post_event(client, user_id="user-5", trigger_at=clock.now())
    assert service.scheduler.poll_once().dispatched == 1
    assert statuses(engine)[later_one["id"]] == "dispatched"


@pytest.mark.clause("REQ-0067.4")
def test_two_reminders_for_one_period_in_one_batch_are_both_dispatched_once_notified(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.4: a real duplicate (same dedup key twice in a batch) is suppressed, never an error."""
    first = post_event(client, trigger_at=T0 - timedelta(minutes=2))
    second = post_event(client, trigger_at=T0 - timedelta(minutes=1))
    third = post_event(client, user_id="someone-else")
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched"] * 3
    assert [event_row(engine, r["id"])["last_error"] for r in (first, second, third)] == [None] * 3
    notes = rows(engine, "SELECT user_id, status, reason FROM notifications ORDER BY user_id, status")
    assert [(n["user_id"], n["status"], n["reason"]) for n in notes] == [
        ("participant-1", "sent", None), ("participant-1", "suppressed", "suppressed_dedup"),
        ("someone-else", "sent", None)]


@pytest.mark.clause("REQ-0067.5")
def test_a_successful_dispatch_clears_a_previous_last_error(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.5: a row put back to pending by hand with its old error keeps it only until it succeeds."""
    stored = post_event(client)
    with engine.begin() as conn:  # an operator's manual UPDATE that forgot to clear last_error
        conn.execute(text("UPDATE scheduled_events SET last_error = 'RuntimeError: old' WHERE id = :id"),
                     {"id": stored["id"]})
    service.scheduler.poll_once()
    row = event_row(engine, stored["id"])
    assert (row["status"], row["last_error"]) == ("dispatched", None)


@pytest.mark.clause("REQ-0067.1")
def test_cancellation_is_not_swallowed_as_an_event_failure(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.1: isolation catches Exception only; a BaseException (shutdown) propagates and the
    whole batch rolls back, leaving its rows pending for the next poll."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = FakeDispatcher(service.dispatcher, {"user-1": KeyboardInterrupt()})  # type: ignore[dict-item]
    with pytest.raises(KeyboardInterrupt):
        service.scheduler.poll_once()
    assert set(statuses(engine).values()) == {"pending"}
    assert sent_to(engine) == []
    service.scheduler.dispatcher = service.dispatcher
    assert service.scheduler.poll_once().dispatched == len(posted)


@pytest.mark.clause("REQ-0067.6")
def test_an_exception_escaping_a_poll_is_caught_and_the_loop_continues(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.6: the first poll raises outside any event; the loop logs it, keeps going, and dispatches."""
    stored = post_event(client)
    scheduler = service.scheduler
    scheduler.poll_seconds = 0.0
    real_claim = scheduler.claim
    calls = {"n": 0}

    def flaky_claim() -> Batch:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("database went away")
        return real_claim()

    scheduler.claim = flaky_claim  # type: ignore[method-assign]

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(scheduler.run(stop))
        await eventually(lambda: scheduler.health.dispatched >= 1 or task.done(), "a dispatch after the failed poll")
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, timeout=DEADLINE_SECONDS)

    asyncio.run(scenario())
    assert scheduler.health.last_error == "ConnectionError: database went away"
    assert event_row(engine, stored["id"])["status"] == "dispatched"


@pytest.mark.clause("REQ-0067.7")
def test_the_health_route_reports_a_live_loop_and_its_counters(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """REQ-0067.7: while the loop task runs and polls, /health/scheduler is 200 with its counters."""
    service.run_scheduler = True
    post_event(client)
    with running(service.app) as live:  # service.app's own lifespan runs the loop
        answer = wait_for_health(live, lambda body: body["polls"] >= 1)
        assert answer.status_code == 200
        body = answer.json()
        assert body["running"] is True and body["dispatched"] == 1 and body["failed"] == 0
        assert body["last_poll_at"] == clock.now().isoformat()
        clock.advance(timedelta(seconds=3 * 30 + 1))  # three intervals without a completed poll
        stale = live.get("/health/scheduler")
        assert (stale.status_code, stale.json()["stale"]) == (503, True)
    assert client.get("/health/scheduler", headers=ADMIN).status_code == 503  # after shutdown: not running


@pytest.mark.clause("REQ-0067.7")
def test_a_loop_that_died_is_reported_as_503_not_silence(service: SchedulerService) -> None:
    """REQ-0067.7: if the loop task exits (here: a bug outside the poll guard), health answers 503."""
    service.run_scheduler = True

    async def broken_loop(stop: asyncio.Event) -> None:
        raise RuntimeError("a bug outside the poll guard")

    service.scheduler.run = broken_loop  # type: ignore[method-assign]
    with running(service.app) as live:
        answer = wait_for_health(live, lambda body: body["running"] is False)
        assert answer.status_code == 503


def wait_for_health(client: TestClient, condition: Any, attempts: int = 5000) -> Any:
    """Ask /health/scheduler until ``condition`` holds (each request yields to the loop)."""
    for _ in range(attempts):
        answer = client.get("/health/scheduler")
        if condition(answer.json()):
            return answer
    raise AssertionError(f"health never satisfied the condition: {answer.json()}")
