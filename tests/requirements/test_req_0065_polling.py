"""REQ-0065 — the loop takes due, pending events, oldest first, in bounded batches.

In our words: every ``SCHEDULER_POLL_SECONDS`` the loop claims at most twenty rows (the
batch size) with ``status = 'pending'`` and ``trigger_at <= now``, oldest trigger first,
locking them with ``FOR UPDATE SKIP LOCKED`` so two replicas never take the same row.
``dispatched`` and ``failed`` are terminal: nothing retries a failed dispatch; somebody
resets the row by hand. The loop waits on its stop event with a timeout instead of
sleeping, so stopping is immediate whatever the interval.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock, SystemClock
from scheduler.core.loop import Scheduler
from scheduler.service import SchedulerService
from scheduler.types import SchedulerMode
from tests.conftest import ADMIN, T0
from tests.helpers import (
    DEADLINE_SECONDS,
    dispatch_all,
    event_row,
    eventually,
    later,
    post_event,
    statuses,
)


@pytest.mark.clause("REQ-0065.1")
def test_a_poll_takes_only_pending_rows_that_are_due(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0065.1: future rows and terminal rows are not taken; due pending rows are."""
    due = post_event(client, trigger_at=T0 - later(), user_id="a")
    exactly_now = post_event(client, trigger_at=T0, user_id="b")
    future = post_event(client, trigger_at=T0 + timedelta(seconds=1), user_id="c")
    failed = post_event(client, trigger_at=T0 - later(2), user_id="d",
                        facts={"facts_version": "1", "scenario": "nope", "date": "2026-11-30"})
    service.scheduler.poll_once()  # d fails (no rule), a and b dispatch
    assert statuses(engine)[failed["id"]] == "failed"
    batch = service.scheduler.claim()
    assert batch.events == []
    service.scheduler.finish(batch)
    assert statuses(engine) == {
        due["id"]: "dispatched", exactly_now["id"]: "dispatched", future["id"]: "pending", failed["id"]: "failed"}


@pytest.mark.clause("REQ-0065.2")
def test_a_poll_takes_at_most_the_batch_size(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0065.2: twenty-five due rows take two polls: twenty, then five."""
    for i in range(25):
        post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=i))
    assert service.scheduler.batch_size == 20
    first = service.scheduler.poll_once()
    second = service.scheduler.poll_once()
    assert (first.claimed, second.claimed) == (20, 5)


@pytest.mark.clause("REQ-0065.2")
def test_the_defaults_are_a_thirty_second_interval_and_twenty_per_poll() -> None:
    """REQ-0065.2: SCHEDULER_POLL_SECONDS defaults to 30 and the batch to 20; both are configurable."""
    assert (Settings.from_env({}).poll_seconds, Settings.from_env({}).batch_size) == (30.0, 20)
    custom = Settings.from_env({"SCHEDULER_POLL_SECONDS": "5", "SCHEDULER_BATCH_SIZE": "7"})
    assert (custom.poll_seconds, custom.batch_size) == (5.0, 7)


@pytest.mark.clause("REQ-0065.3")
def test_due_rows_are_taken_oldest_trigger_first(client: TestClient, service: SchedulerService) -> None:
    """REQ-0065.3: ordered by trigger_at (id breaks ties), not by insertion."""
    posted = [post_event(client, user_id=f"u{i}", trigger_at=T0 - timedelta(minutes=m))
              for i, m in enumerate([5, 50, 20, 50, 1])]
    batch = service.scheduler.claim()
    claimed = [e.id for e in batch.events]
    service.scheduler.abort(batch)
    expected = sorted(posted, key=lambda r: (datetime.fromisoformat(r["trigger_at"]), r["id"]))
    assert claimed == [r["id"] for r in expected]


@pytest.mark.clause("REQ-0065.4")
def test_two_replicas_claiming_at_once_never_take_the_same_row(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """REQ-0065.4: FOR UPDATE SKIP LOCKED: the second replica skips the first one's rows."""
    posted = [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=i)) for i in range(30)]
    other = Scheduler(service.database, service.dispatcher, clock, name="replica-2")
    first = service.scheduler.claim()
    second = other.claim()
    taken_first = [e.id for e in first.events]
    taken_second = [e.id for e in second.events]
    assert len(taken_first) == 20 and len(taken_second) == 10
    dispatch_all(service.scheduler, first)
    dispatch_all(other, second)
    other.finish(second)
    service.scheduler.finish(first)
    assert sorted(taken_first + taken_second) == sorted(r["id"] for r in posted)
    assert set(statuses(engine).values()) == {"dispatched"}


@pytest.mark.clause("REQ-0065.5")
def test_dispatched_and_failed_rows_are_never_taken_again(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0065.5: terminal rows stay put however many polls follow; a failure is not retried."""
    ok = post_event(client, user_id="ok")
    bad = post_event(client, user_id="bad", facts={"facts_version": "1", "scenario": "commitment_reminder"})
    service.scheduler.poll_once()
    before = {r: event_row(engine, r) for r in (ok["id"], bad["id"])}
    for _ in range(3):
        clock.advance(later(24))
        assert service.scheduler.poll_once().claimed == 0
    assert {r: event_row(engine, r) for r in (ok["id"], bad["id"])} == before
    assert before[bad["id"]]["status"] == "failed"


@pytest.mark.clause("REQ-0065.5")
def test_an_operator_resets_a_failed_row_by_hand_and_it_runs_again(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0065.5: the reset by hand (admin route) puts a failed row back to pending, cleared."""
    bad = post_event(client, facts={"facts_version": "1", "scenario": "commitment_reminder", "date": "2026-11-31",
                                    "commitment": "x"})
    service.scheduler.poll_once()
    failed = client.get("/admin/scheduled-events?status=failed", headers=ADMIN).json()
    assert [r["id"] for r in failed] == [bad["id"]]
    assert failed[0]["last_error"].startswith("missing_or_invalid_time_scope")
    with engine.begin() as conn:  # the operator fixes the data, then resets
        conn.execute(text("UPDATE scheduled_events SET facts = jsonb_set(facts, '{date}', '\"2026-11-30\"') "
                          "WHERE id = :id"),
                     {"id": bad["id"]})
    reset = client.post(f"/admin/scheduled-events/{bad['id']}/reset", headers=ADMIN)
    assert reset.status_code == 200
    assert (reset.json()["status"], reset.json()["last_error"], reset.json()["dispatched_at"]) == (
        "pending", None, None)
    assert service.scheduler.poll_once().dispatched == 1
    assert client.get(f"/admin/scheduled-events/{bad['id']}", headers=ADMIN).json()["status"] == "dispatched"
    assert client.post("/admin/scheduled-events/no-such-id/reset", headers=ADMIN).status_code == 404


@pytest.mark.clause("REQ-0065.6")
def test_the_loop_polls_every_interval_and_stops_at_once_even_with_a_one_hour_interval(
    service: SchedulerService,
) -> None:
    """REQ-0065.6: the wait is on the stop event with a timeout, so stop ends the loop immediately."""
    scheduler = service.scheduler
    scheduler.poll_seconds = 3600.0

    async def scenario() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(scheduler.run(stop))
        await eventually(lambda: scheduler.health.polls >= 1, "the first poll")  # it happens at once
        assert not task.done()
        stop.set()
        # The loop must end well within one interval: give it a tiny fraction of the hour.
        await asyncio.wait_for(task, timeout=60)
        return scheduler.health.polls

    assert asyncio.run(scenario()) == 1
    assert scheduler.health.running is False


HOUR = 3600.0
# How long a stop may take to end a loop waiting out an hour: a hundredth of the interval
# would be 36 s; a loop that waits on its stop event returns in milliseconds.
STOP_DEADLINE_SECONDS = 5.0


def _stopped_during_the_wait_asyncio(scheduler: Scheduler) -> float:
    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(scheduler.run(stop))
        await eventually(lambda: scheduler.health.polls >= 1 and scheduler.waiting, "the loop waiting out its interval")
        started = time.monotonic()
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_DEADLINE_SECONDS)
        assert task in done, f"the loop did not end within {STOP_DEADLINE_SECONDS:g}s of a stop during its wait"
        assert task.exception() is None
        return time.monotonic() - started

    return asyncio.run(scenario())


def _stopped_during_the_wait_thread(scheduler: Scheduler) -> float:
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_blocking, args=(stop,), name="loop-under-test", daemon=True)
    thread.start()
    assert scheduler.wait_for(lambda: scheduler.health.polls >= 1 and scheduler.waiting, DEADLINE_SECONDS), \
        "the loop never started waiting out its interval"
    started = time.monotonic()
    stop.set()
    thread.join(STOP_DEADLINE_SECONDS)
    assert not thread.is_alive(), f"the loop did not end within {STOP_DEADLINE_SECONDS:g}s of a stop during its wait"
    return time.monotonic() - started


RUNNERS = {"asyncio task": _stopped_during_the_wait_asyncio, "thread of its own": _stopped_during_the_wait_thread}


@pytest.mark.clause("REQ-0065.6")
@pytest.mark.parametrize("mode", list(SchedulerMode), ids=[str(m) for m in SchedulerMode])
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_stop_during_the_wait_ends_the_loop_within_a_fraction_of_its_one_hour_interval(
    service: SchedulerService, runner: str, mode: SchedulerMode
) -> None:
    """REQ-0065.6 ("the shutdown is immediate"): the loop has polled and is waiting out a
    one-hour interval; a stop set during that wait ends it within seconds, a small fraction of
    the interval, in either runner (``Scheduler.run``, ``run_blocking``): the wait is on the
    stop event, not a sleep of the interval."""
    assert HOUR / 100 > STOP_DEADLINE_SECONDS
    scheduler = service.scheduler
    scheduler.poll_seconds = HOUR
    scheduler.mode = mode
    elapsed = RUNNERS[runner](scheduler)
    assert elapsed < STOP_DEADLINE_SECONDS
    assert scheduler.health.polls == 1 and scheduler.health.running is False


@pytest.mark.clause("REQ-0065.6")
def test_a_zero_interval_loop_polls_again_and_again_until_stopped(service: SchedulerService) -> None:
    """REQ-0065.6: the interval is the timeout of the wait; with zero the loop polls back to back."""
    scheduler = service.scheduler
    scheduler.poll_seconds = 0.0

    async def scenario() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(scheduler.run(stop))
        await eventually(lambda: scheduler.health.polls >= 3, "three polls")
        stop.set()
        await asyncio.wait_for(task, timeout=DEADLINE_SECONDS)
        return scheduler.health.polls

    assert asyncio.run(scenario()) >= 3


@pytest.mark.clause("REQ-0065.7")
def test_whether_a_row_is_due_follows_the_injected_clock_not_the_database_clock(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0065.7: the claim binds :now from the clock; under freezegun the frozen time decides."""
    in_2031 = post_event(client, trigger_at=datetime(2031, 1, 1, tzinfo=UTC))
    scheduler = Scheduler(service.database, service.dispatcher, SystemClock())
    with freeze_time("2030-12-31T23:59:59Z"):
        assert scheduler.poll_once().claimed == 0
    with freeze_time("2031-01-01T00:00:00Z"):
        assert scheduler.poll_once().dispatched == 1
    assert event_row(engine, in_2031["id"])["dispatched_at"] == datetime(2031, 1, 1, tzinfo=UTC)
