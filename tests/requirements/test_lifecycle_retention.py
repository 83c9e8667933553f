"""RET — finished rows do not pile up forever (retention).

In our words: rows ``dispatched`` or ``cancelled`` more than ``SCHEDULER_RETENTION_DAYS``
ago (default 30; 0 keeps everything) are deleted with their history, in small batches, by
one replica at a time (elected with an advisory lock), at most once an hour by the
injected clock. Notifications and deliveries are kept; ``failed`` and ``pending`` rows are
never deleted, however old.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.operations.retention import RETENTION_LOCK_KEY, Retention
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST
from tests.helpers import later, post_event, reminder_facts, rows, statuses


def finished_rows(client: TestClient, service: SchedulerService, clock: ManualClock) -> dict[str, str]:
    """One row in each status, due and processed now: name -> id."""
    made = {
        "dispatched": post_event(client, user_id="p-sent")["id"],
        "failed": post_event(client, user_id="p-failed", facts=reminder_facts(day="soon"))["id"],
        "cancelled": post_event(client, user_id="p-cancelled")["id"],
        "pending": post_event(client, user_id="p-later", trigger_at=clock.now() + timedelta(days=400))["id"],
    }
    clock.advance(later())
    assert client.delete(f"/admin/scheduled-events/{made['cancelled']}", headers=INGEST).status_code == 200
    service.scheduler.poll_once()
    assert {name: statuses(service.engine)[i] for name, i in made.items()} == {n: n for n in made}
    return made


def history_ids(engine: Engine) -> set[str]:
    return {r["event_id"] for r in rows(engine, "SELECT DISTINCT event_id FROM scheduled_event_history")}


@pytest.mark.clause("RET-1")
@pytest.mark.clause("RET-2")
def test_old_dispatched_and_cancelled_rows_go_with_their_history_and_the_rest_stays(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-1, RET-2: after 31 days the dispatched and cancelled rows and their history are gone;
    the failed and pending rows, the notifications and the deliveries stay."""
    made = finished_rows(client, service, clock)
    notifications = rows(engine, "SELECT id FROM notifications ORDER BY id")
    deliveries = rows(engine, "SELECT id FROM deliveries ORDER BY id")
    assert notifications and deliveries
    clock.advance(timedelta(days=31))
    report = service.retention.run_if_due()
    assert report is not None and (report.deleted, report.done) == (2, True)
    assert set(statuses(engine)) == {made["failed"], made["pending"]}
    assert history_ids(engine) == {made["failed"], made["pending"]}
    assert rows(engine, "SELECT id FROM notifications ORDER BY id") == notifications
    assert rows(engine, "SELECT id FROM deliveries ORDER BY id") == deliveries


@pytest.mark.clause("RET-1")
def test_rows_finished_less_than_the_retention_ago_are_kept(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-1: 29 days after dispatch nothing is deleted (the age is counted from updated_at)."""
    finished_rows(client, service, clock)
    clock.advance(timedelta(days=29))
    report = service.retention.run_if_due()
    assert report is not None and report.deleted == 0
    assert len(statuses(engine)) == 4


@pytest.mark.clause("RET-3")
@pytest.mark.clause("DEC-LIFE-2")
def test_retention_days_zero_keeps_everything(
    client: TestClient, engine: Engine, clock: ManualClock, service: SchedulerService
) -> None:
    """RET-3, DEC-LIFE-2: SCHEDULER_RETENTION_DAYS=0 deletes no event, ever (its run still
    deletes gone replicas' heartbeats, OBS-2); the default is 30."""
    assert Settings.from_env({}).retention_days == 30
    assert Settings.from_env({"SCHEDULER_RETENTION_DAYS": "0"}).retention_days == 0
    finished_rows(client, service, clock)
    clock.advance(timedelta(days=3650))
    report = Retention(Database(engine), clock, days=0).run_if_due()
    assert report is not None and (report.deleted, report.batches, report.done) == (0, 0, True)
    assert len(statuses(engine)) == 4


@pytest.mark.clause("RET-4")
def test_a_run_starts_at_most_once_an_hour_by_the_injected_clock_across_replicas(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-4: a run 10 minutes before the rows expire deletes nothing; 30 minutes later they
    have expired but no replica runs (the start time is shared); 61 minutes after the first
    run the loop's poll hook deletes them."""
    finished_rows(client, service, clock)
    clock.advance(timedelta(days=30, minutes=-10))
    first = Retention(Database(engine), clock, days=30)
    report = first.run_if_due()
    assert report is not None and report.deleted == 0
    clock.advance(timedelta(minutes=30))
    assert Retention(Database(engine), clock, days=30, name="replica-2").run_if_due() is None
    assert first.run_if_due() is None
    assert len(statuses(engine)) == 4
    clock.advance(timedelta(minutes=31))
    service.scheduler.poll_guarded(lambda: False)  # the loop's poll, then its hooks
    assert service.retention.last_report is not None and service.retention.last_report.deleted == 2
    assert len(statuses(engine)) == 2


@pytest.mark.clause("RET-5")
def test_only_the_replica_holding_the_advisory_lock_runs(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-5: while another session holds the election lock, a replica deletes nothing and
    does not wait; once the lock is free it runs."""
    finished_rows(client, service, clock)
    clock.advance(timedelta(days=31))
    with engine.connect() as other:
        assert other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": RETENTION_LOCK_KEY}).scalar()
        assert Retention(Database(engine), clock, days=30).run_if_due() is None
        assert len(statuses(engine)) == 4
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": RETENTION_LOCK_KEY})
    report = Retention(Database(engine), clock, days=30).run_if_due()
    assert report is not None and report.deleted == 2


@pytest.mark.clause("RET-6")
def test_a_backlog_is_deleted_in_small_batches_over_several_polls(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-6: batches of 2, at most 2 per call: 5 expired rows take two calls (4, then 1), the
    second carrying on the same run without waiting an hour."""
    for i in range(5):
        post_event(client, user_id=f"p-{i}")
    clock.advance(later())
    service.scheduler.poll_once()
    clock.advance(timedelta(days=31))
    retention = Retention(Database(engine), clock, days=30, batch_size=2, max_batches=2)
    first = retention.run_if_due()
    assert first is not None and (first.deleted, first.batches, first.done) == (4, 2, False)
    second = retention.run_if_due()
    assert second is not None and (second.deleted, second.done) == (1, True)
    assert statuses(engine) == {}
    assert retention.run_if_due() is None  # the run is complete: the next waits an hour


@pytest.mark.clause("RET-5")
def test_a_failing_run_gives_the_election_back(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-5: a run whose delete fails (it cannot take a lock within its lock_timeout) raises
    to the loop, which logs it, and gives the election lock back, so the next run can go."""
    finished_rows(client, service, clock)
    clock.advance(timedelta(days=31))
    failing = Retention(Database(engine), clock, days=30)
    with engine.connect() as blocker:
        # an exclusive lock on the history table makes the delete wait; lock_timeout ends the wait
        blocker.execute(text("LOCK TABLE scheduled_event_history IN ACCESS EXCLUSIVE MODE"))
        impatient = make_engine(str(engine.url.render_as_string(hide_password=False)),
                                Settings(lock_timeout_ms=50, statement_timeout_ms=5_000))
        try:
            with pytest.raises(DBAPIError):
                Retention(Database(impatient), clock, days=30).run_if_due()
        finally:
            impatient.dispose()
        blocker.rollback()
    with engine.connect() as other:
        assert other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": RETENTION_LOCK_KEY}).scalar()
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": RETENTION_LOCK_KEY})
    clock.advance(timedelta(hours=2))
    report = failing.run_if_due()
    assert report is not None and report.deleted == 2


@pytest.mark.clause("RET-1")
def test_the_age_is_counted_from_when_the_row_finished_not_when_it_was_stored_or_due(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-1: rows whose store, trigger and finish lie at different instants. Forty days on,
    with thirty days' retention: a row stored forty days ago but dispatched (at its trigger)
    twenty days ago stays; a row dispatched forty days ago and reset and dispatched again
    twenty days ago stays; a row due a year from now but cancelled thirty-five days ago goes;
    a row stored and dispatched forty days ago goes. Only updated_at says when a row finished."""

    def store(user: str, due: timedelta = timedelta(0)) -> str:
        when = clock.now() + due
        stored = post_event(client, user_id=user, trigger_at=when, facts=reminder_facts(when.date().isoformat()))
        return str(stored["id"])

    old = store("p-old")
    due_later = store("p-due-later", due=timedelta(days=20))
    sent_again = store("p-sent-again")
    far_off = store("p-far-off", due=timedelta(days=365))
    assert service.scheduler.poll_once().dispatched == 2  # old and sent_again, at T0
    clock.advance(timedelta(days=5))
    assert client.delete(f"/admin/scheduled-events/{far_off}", headers=INGEST).status_code == 200
    clock.advance(timedelta(days=15))  # T0 + 20 days
    assert client.post(f"/admin/scheduled-events/{sent_again}/reset", headers=ADMIN).status_code == 200
    assert service.scheduler.poll_once().dispatched == 2  # due_later at its trigger, sent_again again
    clock.advance(timedelta(days=20))  # T0 + 40 days
    report = service.retention.run_if_due()
    assert report is not None and report.deleted == 2
    assert set(statuses(engine)) == {due_later, sent_again}
    assert history_ids(engine) == {due_later, sent_again}
    assert old not in statuses(engine) and far_off not in statuses(engine)


@pytest.mark.clause("RET-2")
def test_a_row_a_writer_is_making_pending_during_a_run_is_neither_deleted_nor_waited_for(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """RET-2: a run that starts while a writer is re-arming an expired dispatched row (the
    writer's transaction holds the row, pending but not yet committed) leaves that row alone
    without waiting for the writer, deletes the other expired row, and once the writer commits
    the row is there, pending, with its history. A run that read the doomed rows first and
    deleted them by id afterwards would delete the row that had just become pending."""
    from concurrent.futures import ThreadPoolExecutor

    rearmed = post_event(client, user_id="p-rearmed", external_key="k-rearmed")["id"]
    other = post_event(client, user_id="p-other")["id"]
    assert service.scheduler.poll_once().dispatched == 2
    clock.advance(timedelta(days=31))
    # the writer is the inner block: on a failure it rolls back first, so the run can end
    with ThreadPoolExecutor(max_workers=1) as pool, engine.connect() as writer:
        writer.execute(text("UPDATE scheduled_events SET status = 'pending', dispatched_at = NULL, updated_at = :now "
                            "WHERE id = :id"), {"now": clock.now(), "id": rearmed})
        run = pool.submit(Retention(Database(engine), clock, days=30).run_if_due)
        try:
            report = run.result(timeout=20)
        except TimeoutError:
            raise AssertionError("the run waited for the writer's transaction") from None
        assert report is not None and report.deleted == 1
        writer.commit()
    assert statuses(engine) == {rearmed: "pending"}
    assert rearmed in history_ids(engine) and other not in history_ids(engine)
