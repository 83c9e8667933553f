"""GET /metrics: Prometheus metrics with prometheus_client.

In our words: dispatched and failed counters by event type, polls and poll errors, a poll
duration histogram and a lateness histogram (dispatched_at - trigger_at) from this
process's polls; gauges for the backlog (due pending rows), the oldest overdue row's age,
failed rows and whether the loop runs, computed at scrape time and cached a few seconds;
no participant id in any label; open by default, admin with a setting.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.operations.heartbeat import Heartbeat
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import event_body, post_event, running
from tests.operations.support import loop_step, scrape

BAD_FACTS = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}


@pytest.mark.clause("OBS-3")
def test_counters_and_the_lateness_histogram_follow_the_polls(
    service: SchedulerService, client: TestClient, clock: ManualClock
) -> None:
    """OBS-3: two dispatched 90 s late and one failed, by event type; polls, errors and durations counted."""
    post_event(client, user_id="anna", trigger_at=T0)
    post_event(client, user_id="bob", trigger_at=T0, event_type="energy_tip")
    post_event(client, user_id="carl", trigger_at=T0, facts=BAD_FACTS)
    clock.advance(timedelta(seconds=90))
    loop_step(service)
    m = scrape(client)
    assert m["scheduler_events_dispatched_total{event_type=commitment_reminder}"] == 1
    assert m["scheduler_events_dispatched_total{event_type=energy_tip}"] == 1
    assert m["scheduler_events_failed_total{event_type=commitment_reminder}"] == 1
    assert (m["scheduler_polls_total"], m["scheduler_poll_errors_total"]) == (1, 0)
    assert m["scheduler_poll_duration_seconds_count"] == 1
    assert m["scheduler_event_lateness_seconds_count"] == 2
    assert m["scheduler_event_lateness_seconds_sum"] == 180
    assert (m["scheduler_event_lateness_seconds_bucket{le=60.0}"],
            m["scheduler_event_lateness_seconds_bucket{le=120.0}"]) == (0, 2)

    def broken_claim() -> None:
        raise RuntimeError("database said no")

    service.scheduler.claim = broken_claim  # type: ignore[assignment,method-assign]
    loop_step(service)
    m = scrape(client)
    assert (m["scheduler_polls_total"], m["scheduler_poll_errors_total"]) == (2, 1)
    assert m["scheduler_events_dispatched_total{event_type=commitment_reminder}"] == 1  # not counted twice


@pytest.mark.clause("OBS-3")
def test_no_label_carries_a_participant_id(service: SchedulerService, client: TestClient, clock: ManualClock) -> None:
    """OBS-3: after dispatching for participants, no sample's labels mention them."""
    for user in ("participant-alpha", "participant-beta"):
        post_event(client, user_id=user, trigger_at=T0)
    loop_step(service)
    text = client.get("/metrics").text
    assert "participant-alpha" not in text and "participant-beta" not in text
    assert "user_id" not in text


@pytest.mark.clause("OBS-4")
def test_the_gauges_read_the_table_at_scrape_time_and_are_cached_a_few_seconds(
    service: SchedulerService, client: TestClient, clock: ManualClock
) -> None:
    """OBS-4: backlog, oldest overdue and failed rows come from the table; a scrape within 5 s reuses them."""
    post_event(client, user_id="anna", trigger_at=T0 - timedelta(minutes=10))
    post_event(client, user_id="bob", trigger_at=T0 - timedelta(minutes=2))
    post_event(client, user_id="later", trigger_at=T0 + timedelta(hours=1))
    m = scrape(client)
    assert (m["scheduler_backlog_events"], m["scheduler_oldest_overdue_seconds"]) == (2, 600)
    assert (m["scheduler_failed_events"], m["scheduler_loop_running"], m["scheduler_database_up"]) == (0, 0, 1)
    post_event(client, user_id="carl", trigger_at=T0 - timedelta(minutes=1), facts=BAD_FACTS)
    clock.advance(timedelta(seconds=4))
    assert scrape(client)["scheduler_backlog_events"] == 2  # cached
    clock.advance(timedelta(seconds=1))
    m = scrape(client)
    assert (m["scheduler_backlog_events"], m["scheduler_oldest_overdue_seconds"]) == (3, 605)
    assert m["scheduler_replicas{state=ok}"] == 0  # no heartbeat yet
    loop_step(service)
    clock.advance(timedelta(seconds=5))
    m = scrape(client)
    assert (m["scheduler_backlog_events"], m["scheduler_oldest_overdue_seconds"],
            m["scheduler_failed_events"]) == (0, 0, 1)
    assert (m["scheduler_replicas{state=ok}"], m["scheduler_replicas{state=stale}"]) == (1, 0)
    clock.advance(timedelta(seconds=91))  # three 30 s intervals without a heartbeat
    m = scrape(client)
    assert (m["scheduler_replicas{state=ok}"], m["scheduler_replicas{state=stale}"]) == (0, 1)


@pytest.mark.clause("OBS-4")
def test_the_loop_running_gauge_follows_the_loop_task(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """OBS-4: scheduler_loop_running is 0 before the lifespan starts the loop, 1 while it runs, 0 after."""
    service = SchedulerService(settings.with_(poll_seconds=3600.0), engine=engine, clock=clock,
                               publisher=publisher, run_scheduler=True)
    assert service.metrics.loop_alive() is False
    with running(service.app) as client:
        assert scrape(client)["scheduler_loop_running"] == 1
    assert service.loop_alive is False
    assert service.metrics.loop_alive() is False
    idle = SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False)
    with running(idle.app) as client:
        assert scrape(client)["scheduler_loop_running"] == 0  # SCHEDULER_ENABLED=false: API only


@pytest.mark.clause("OBS-5")
def test_metrics_are_open_by_default_and_need_admin_with_the_setting(
    settings: Settings, engine: Engine, clock: ManualClock, client: TestClient
) -> None:
    """OBS-5: /metrics answers without a token; with SCHEDULER_METRICS_REQUIRE_ADMIN it is 401/403/200."""
    assert client.get("/metrics").status_code == 200
    assert Settings.from_env({"SCHEDULER_METRICS_REQUIRE_ADMIN": "true"}).metrics_require_admin
    guarded = SchedulerService(settings.with_(metrics_require_admin=True), engine=engine, clock=clock,
                               run_scheduler=False)
    with TestClient(guarded.app) as locked:
        assert locked.get("/metrics").status_code == 401
        assert locked.get("/metrics", headers=INGEST).status_code == 403
        assert locked.get("/metrics", headers=ADMIN).status_code == 200


@pytest.mark.clause("OBS-4")
def test_a_scrape_while_the_database_is_unreachable_says_so_and_still_answers(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """OBS-4: with nothing listening where the database should be, /metrics-style exposition still
    works: scheduler_database_up is 0 and the table gauges are absent; a heartbeat is skipped with one warning."""
    from scheduler.core.loop import Scheduler
    from scheduler.database.engine import make_engine
    from scheduler.operations.heartbeat import Heartbeat
    from scheduler.operations.metrics import Metrics, parse_exposition
    from tests.operations.browser import free_port

    nowhere = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none",
                          Settings(pool_timeout_seconds=1.0))
    try:
        sessions = Database(nowhere)
        metrics = Metrics(sessions, clock, lambda: True)
        samples = parse_exposition(metrics.exposition().decode())
        assert (samples["scheduler_database_up"], samples["scheduler_loop_running"]) == (0, 1)
        assert "scheduler_backlog_events" not in samples
        beat = Heartbeat(sessions, clock)
        loop = Scheduler(sessions, lambda *a: None, clock)  # type: ignore[arg-type]
        beat(loop)
        clock.advance(timedelta(seconds=2))
        beat(loop)
        assert [r.getMessage() for r in caplog.records if "heartbeat not recorded" in r.getMessage()] == [
            "scheduler: heartbeat not recorded (OperationalError)"]
    finally:
        nowhere.dispose()


@pytest.mark.clause("OBS-3")
def test_event_type_labels_stop_at_a_hundred_values_and_hostile_ones_keep_the_exposition_valid(
    service: SchedulerService, client: TestClient
) -> None:
    """OBS-3: senders choose event_type: 105 distinct ones, the oldest six holding quotes, a
    backslash, a newline, braces and commas, are all counted; the exposition still parses, each
    hostile value comes back exactly as a label, and past 100 values the rest count as `other`."""
    from prometheus_client.parser import text_string_to_metric_families

    hostile = ['say "hi"', "back\\slash", "new\nline", "brace}{x", "a=b,c=d", "quote' #"]
    types = hostile + [f"type-{n:03d}" for n in range(105 - len(hostile))]
    for n, event_type in enumerate(types):
        post_event(client, user_id=f"user-{n:03d}", event_type=event_type,
                   trigger_at=T0 - timedelta(minutes=200 - n))
    for _ in range(10):  # 105 rows, 20 a poll, as the loop runs them (the poll hooks count)
        loop_step(service)
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            # (the catalogue's own event types are there too, at zero: OBS-6)
            if sample.name in ("scheduler_events_dispatched_total", "scheduler_events_failed_total") and sample.value:
                label = sample.labels["event_type"]
                counted[label] = counted.get(label, 0) + sample.value
    assert sum(counted.values()) == 105
    assert set(hostile) <= set(counted)
    assert len(counted) == 101 and counted["other"] == 5


@pytest.mark.clause("OBS-6")
def test_a_fresh_service_exposes_every_known_event_types_counters_at_zero(
    service: SchedulerService, client: TestClient
) -> None:
    """OBS-6: before any poll, each of the catalogue's event types has its dispatched and
    failed series at 0 (a dashboard's failure panels show 0, not "No data"), as have the
    unlabelled poll counters; a sender's own event type appears when first counted."""
    m = scrape(client)
    known = service.catalogue.scenarios()
    assert len(known) >= 3 and "commitment_reminder" in known
    for event_type in known:
        assert m[f"scheduler_events_failed_total{{event_type={event_type}}}"] == 0
        assert m[f"scheduler_events_dispatched_total{{event_type={event_type}}}"] == 0
    assert (m["scheduler_polls_total"], m["scheduler_poll_errors_total"]) == (0, 0)
    labels = {key for key in m if key.startswith("scheduler_events_failed_total{")}
    assert labels == {f"scheduler_events_failed_total{{event_type={t}}}" for t in known}


@pytest.mark.clause("OBS-7")
def test_the_replicas_route_and_the_metrics_report_the_same_figures(
    service: SchedulerService, client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OBS-7: with a replica ok, one failing and one stale, ``scheduler_replicas{state}`` counts
    the states /admin/replicas lists; and this replica's row (after a failed poll, a dispatched,
    a failed and an expired event) holds what its /metrics counters count: dispatched, failed
    and expired events, and its completed polls (every poll less the failed ones)."""
    sessions = Database(engine)
    Heartbeat(sessions, clock)(Scheduler(sessions, service.dispatcher, clock, name="replica-stale"))
    window = {"expires_at": (T0 + timedelta(minutes=5)).isoformat()}
    client.post("/admin/scheduled-events", headers=INGEST, json={**event_body(user_id="anna"), **window})
    post_event(client, user_id="bob", trigger_at=T0 + timedelta(minutes=10))
    post_event(client, user_id="carl", trigger_at=T0 + timedelta(minutes=10), facts=BAD_FACTS)
    clock.advance(timedelta(minutes=10))
    loop_step(service)
    claim = service.scheduler.claim

    def broken_claim() -> None:
        raise RuntimeError("database said no")

    service.scheduler.claim = broken_claim  # type: ignore[assignment,method-assign]
    clock.advance(timedelta(seconds=1))
    loop_step(service)
    service.scheduler.claim = claim  # type: ignore[method-assign]
    clock.advance(timedelta(seconds=1))
    loop_step(service)  # the heartbeat of a good poll again
    failing = Scheduler(sessions, service.dispatcher, clock, name="replica-failing")
    failing.health.consecutive_failures = 2
    Heartbeat(sessions, clock)(failing)
    listed = {r["name"]: r for r in client.get("/admin/replicas", headers=ADMIN).json()}
    m = scrape(client)
    states = {state: sum(r["state"] == state for r in listed.values()) for state in ("ok", "failing", "stale")}
    assert states == {"ok": 1, "failing": 1, "stale": 1}
    assert {state: m[f"scheduler_replicas{{state={state}}}"] for state in states} == states

    def total(name: str) -> float:
        return float(sum(v for k, v in m.items() if k.startswith(f"{name}{{")))

    this = listed["scheduler"]
    assert (this["dispatched"], this["failed"], this["expired"]) == (1, 1, 1)
    assert (this["dispatched"], this["failed"], this["expired"]) == (
        total("scheduler_events_dispatched_total"), total("scheduler_events_failed_total"),
        total("scheduler_events_expired_total"))
    assert this["polls"] == m["scheduler_polls_total"] - m["scheduler_poll_errors_total"] == 2
