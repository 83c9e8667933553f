"""Every replica visible from any replica: heartbeats in PostgreSQL and GET /admin/replicas.

In our words: each process that runs the loop records a heartbeat row after its polls
(name, host, pid, mode, started_at, last_poll_at, last_error, consecutive failures and its
counters) with the injected clock's time, at most once a second unless its failure state
changes; a replica silent for three poll intervals is stale; rows of replicas gone for a
day are deleted; ``GET /admin/replicas`` (admin) lists them, and ``/health/scheduler``
still reports this process alone.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.operations.heartbeat import Heartbeat
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import FakeDispatcher, event_body, post_event, rows, running
from tests.operations.support import loop_step, scrape


def _replicas(engine: Engine) -> list[dict[str, object]]:
    return rows(engine, "SELECT * FROM scheduler_replicas ORDER BY name")


@pytest.mark.clause("OBS-1")
def test_a_poll_of_the_loop_records_this_replicas_heartbeat_with_the_injected_clock(
    service: SchedulerService, client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OBS-1: after a poll the row holds name, host, pid, mode, times from the frozen clock and counters."""
    post_event(client, user_id="anna")
    post_event(client, user_id="bob", facts={"facts_version": "1", "scenario": "commitment_reminder", "date": "x"})
    service.scheduler.health.started(clock.now())
    loop_step(service)
    [row] = _replicas(engine)
    assert (row["name"], row["host"], row["pid"], row["mode"]) == (
        "scheduler", socket.gethostname(), os.getpid(), "literal")
    assert row["started_at"] == row["last_poll_at"] == row["seen_at"] == T0
    assert (row["polls"], row["dispatched"], row["failed"], row["consecutive_failures"]) == (1, 1, 1, 0)
    assert row["last_error"] is None
    assert row["poll_seconds"] == 30.0


@pytest.mark.clause("OBS-1")
def test_back_to_back_polls_write_at_most_one_heartbeat_a_second_but_a_failure_at_once(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OBS-1: within one second of the clock a second poll is not written; a failed poll is, at once."""
    loop_step(service)
    loop_step(service)
    assert _replicas(engine)[0]["polls"] == 1  # the second poll came within the same second
    clock.advance(timedelta(seconds=1))
    loop_step(service)
    assert _replicas(engine)[0]["polls"] == 3

    def broken_claim() -> None:
        raise RuntimeError("database said no")

    service.scheduler.claim = broken_claim  # type: ignore[assignment,method-assign]
    loop_step(service)  # same clock second, but the failure state changed: written now
    [row] = _replicas(engine)
    assert row["consecutive_failures"] == 1
    assert row["last_error"] == "RuntimeError: database said no"


@pytest.mark.clause("OBS-2")
def test_replicas_lists_every_replica_and_marks_the_silent_one_stale(
    service: SchedulerService, client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OBS-2: two replicas on one database; the one silent for over three intervals is stale."""
    other = Scheduler(Database(engine), FakeDispatcher(service.dispatcher), clock,
                      poll_seconds=10.0, name="replica-b")
    other_beat = Heartbeat(Database(engine), clock)
    other.poll_hooks.append(other_beat)
    other.poll_guarded(lambda: False)
    loop_step(service)
    listed = {r["name"]: r for r in client.get("/admin/replicas", headers=ADMIN).json()}
    assert {n: (r["state"], r["stale"]) for n, r in listed.items()} == {
        "replica-b": ("ok", False), "scheduler": ("ok", False)}
    clock.advance(timedelta(seconds=31))  # replica-b (10 s interval) is silent for over 30 s
    loop_step(service)
    listed = {r["name"]: r for r in client.get("/admin/replicas", headers=ADMIN).json()}
    assert (listed["replica-b"]["state"], listed["scheduler"]["state"]) == ("stale", "ok")
    assert listed["replica-b"]["seen_at"] == T0.isoformat()
    assert client.get("/admin/replicas", headers=INGEST).status_code == 403


@pytest.mark.clause("OBS-2")
def test_a_replica_gone_for_a_day_is_removed_and_health_still_reports_this_process(
    service: SchedulerService, client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OBS-2: a heartbeat a day old is deleted by the next heartbeat; /health/scheduler is this process's."""
    gone = Heartbeat(Database(engine), clock, replica_id="gone")
    gone(Scheduler(Database(engine), service.dispatcher, clock, name="gone-replica"))
    clock.advance(timedelta(hours=23))
    loop_step(service)
    assert sorted(str(r["name"]) for r in _replicas(engine)) == ["gone-replica", "scheduler"]
    clock.advance(timedelta(hours=1, seconds=1))
    loop_step(service)
    assert [r["name"] for r in _replicas(engine)] == ["scheduler"]
    health = client.get("/health/scheduler").json()
    assert health["polls"] == 2


@pytest.mark.clause("OBS-2")
def test_a_replica_that_stops_cleanly_leaves_the_list_instead_of_going_stale(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """OBS-2: the service's loop polls once (a heartbeat), then the app stops: its row is gone."""
    from scheduler.service import create_app

    app = create_app(settings.with_(poll_seconds=3600.0), engine=engine, clock=clock)
    service = app.state.service
    with running(app):
        assert service.scheduler.wait_for(lambda: service.scheduler.health.polls >= 1, 30)
        assert [r["name"] for r in _replicas(engine)] == ["scheduler"]
    assert _replicas(engine) == []


@pytest.mark.clause("OBS-2")
def test_of_two_replicas_the_one_that_stops_leaves_the_list_and_the_other_stays(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """OBS-2: two replicas (both named `scheduler`, as replicas of one deployment are) run their
    loops on one database; each is listed. The first stops cleanly: only its own row goes; the
    other is still listed, `ok`, and goes when it stops in turn."""
    from scheduler.service import create_app
    from tests.servers import wait_for

    apps = [create_app(settings.with_(poll_seconds=3600.0), engine=engine, clock=clock) for _ in range(2)]
    first, second = (app.state.service for app in apps)
    ids = [first.heartbeat.replica_id, second.heartbeat.replica_id]
    assert ids[0] != ids[1]
    with running(apps[1]) as client:
        with running(apps[0]):
            wait_for(lambda: len(_replicas(engine)) == 2, what="both replicas' first heartbeat")
            assert sorted(str(r["replica_id"]) for r in _replicas(engine)) == sorted(ids)
        assert [r["replica_id"] for r in _replicas(engine)] == [ids[1]]
        assert [(r["name"], r["state"]) for r in client.get("/admin/replicas", headers=ADMIN).json()] == [
            ("scheduler", "ok")]
    assert _replicas(engine) == []


@pytest.mark.clause("OBS-1")
def test_a_recovery_is_written_at_once_too_and_the_next_beats_wait_their_second(
    service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OBS-1: the failure state changes both ways. Within one second of the clock: a poll
    succeeds (written), the next fails (written at once), the next succeeds again (written at
    once: the replica must not stay `failing` after it recovered), and one more success in
    that second is not written; a second later it is."""
    real_claim = service.scheduler.claim

    def broken_claim() -> None:
        raise RuntimeError("database said no")

    def step(works: bool) -> dict[str, object]:
        service.scheduler.claim = real_claim if works else broken_claim  # type: ignore[assignment,method-assign]
        loop_step(service)
        [row] = _replicas(engine)
        return {"polls": row["polls"], "failures": row["consecutive_failures"], "error": row["last_error"]}

    assert step(True) == {"polls": 1, "failures": 0, "error": None}
    assert step(False) == {"polls": 1, "failures": 1, "error": "RuntimeError: database said no"}
    assert step(True) == {"polls": 2, "failures": 0, "error": None}
    assert step(True) == {"polls": 2, "failures": 0, "error": None}  # same second: not written
    clock.advance(timedelta(seconds=1))
    assert step(True) == {"polls": 4, "failures": 0, "error": None}


@pytest.mark.clause("OBS-2")
def test_a_killed_replicas_heartbeat_leaves_the_list_and_the_gauge_once_retention_runs_past_the_window(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """OBS-2: a replica killed (its row never deleted) is stale, then gone from /admin/replicas
    and from ``scheduler_replicas`` at retention's first hourly run after
    SCHEDULER_REPLICA_RETENTION_SECONDS (two hours here) of silence; with retention of events
    off (SCHEDULER_RETENTION_DAYS=0) all the same."""
    assert Settings.from_env({}).replica_retention == timedelta(days=1)
    service = SchedulerService(settings.with_(replica_retention_seconds=7200, retention_days=0), engine=engine,
                               clock=clock, run_scheduler=False)
    killed = Heartbeat(Database(engine), clock, replica_id="killed")
    killed(Scheduler(Database(engine), service.dispatcher, clock, name="killed-replica"))
    with TestClient(service.app) as client:
        def listed() -> dict[str, str]:
            return {r["name"]: r["state"] for r in client.get("/admin/replicas", headers=ADMIN).json()}

        clock.advance(timedelta(hours=1, minutes=59))
        loop_step(service)  # retention's first run: silent 1 h 59 min, kept
        assert listed() == {"killed-replica": "stale", "scheduler": "ok"}
        clock.advance(timedelta(minutes=2))
        loop_step(service)  # past the window, but retention ran less than an hour ago
        assert listed() == {"killed-replica": "stale", "scheduler": "ok"}
        clock.advance(timedelta(hours=1))
        loop_step(service)  # the next hourly run deletes it
        report = service.retention.last_report
        assert report is not None and (report.replicas_deleted, report.deleted) == (1, 0)
        assert listed() == {"scheduler": "ok"}
        m = scrape(client)
        assert (m["scheduler_replicas{state=stale}"], m["scheduler_replicas{state=ok}"]) == (0, 1)


@pytest.mark.clause("OBS-2")
def test_the_replica_retention_setting_is_bounded_and_named_when_wrong() -> None:
    """OBS-2: SCHEDULER_REPLICA_RETENTION_SECONDS is a whole number of seconds, an hour at least."""
    assert Settings.from_env({"SCHEDULER_REPLICA_RETENTION_SECONDS": "7200"}).replica_retention == timedelta(hours=2)
    for bad in ("60", "a day", "-1"):
        with pytest.raises(ConfigError, match="SCHEDULER_REPLICA_RETENTION_SECONDS"):
            Settings.from_env({"SCHEDULER_REPLICA_RETENTION_SECONDS": bad})


@pytest.mark.clause("OBS-1")
def test_the_heartbeat_counts_the_events_this_replicas_claims_ended_expired(
    service: SchedulerService, client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OBS-1: a row claimed after its expires_at ends expired; the replica's row counts it
    beside its dispatched and failed events, and /admin/replicas shows it."""
    window = {"expires_at": (T0 + timedelta(minutes=5)).isoformat()}
    client.post("/admin/scheduled-events", headers=INGEST, json={**event_body(user_id="anna"), **window})
    post_event(client, user_id="bob", trigger_at=T0 + timedelta(minutes=10))
    clock.advance(timedelta(minutes=10))
    loop_step(service)
    [row] = _replicas(engine)
    assert (row["polls"], row["dispatched"], row["failed"], row["expired"]) == (1, 1, 0, 1)
    [listed] = client.get("/admin/replicas", headers=ADMIN).json()
    assert (listed["dispatched"], listed["expired"]) == (1, 1)
