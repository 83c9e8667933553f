"""REL-1, REL-2: the database goes away (unreachable, or every backend terminated mid-batch
and mid-request): requests answer 503 promptly, the loop survives and shows the outage on
/health/scheduler, nothing is half-done, and the pool heals without a restart."""

from __future__ import annotations

import functools
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine, ping_when_idle, polling
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.rules import load_catalogue
from scheduler.service import SchedulerService, create_app
from scheduler.types import DigitalTwinEvent, DispatchResult
from tests.conftest import ADMIN, INGEST, T0, TEST_SECRET
from tests.helpers import bounded, running
from tests.reliability.support import (
    notifications_by_event,
    reminder,
    statuses,
    store_due,
    wait_until,
)

UNAVAILABLE = {"detail": "database unavailable; retry later"}
DATABASE_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/admin/scheduled-events",
     {"event_type": "t", "user_id": "u", "trigger_at": T0.isoformat(), "facts": reminder()}),
    ("POST", "/admin/ingest-event", {"event_type": "t", "user_id": "u", "facts": reminder()}),
    ("GET", "/admin/scheduled-events", None),
    ("GET", "/admin/scheduled-events/some-id", None),
    ("POST", "/admin/scheduled-events/some-id/reset", None),
    ("GET", "/admin/notifications", None),
    ("PUT", "/admin/participants/u/preferences", {"max_per_day": 2}),
]


def terminate_other_backends(engine: Engine) -> int:
    """pg_terminate_backend on every other connection to this test's database."""
    with engine.connect() as conn:
        killed = conn.execute(text(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one()
        conn.commit()
    return int(killed)


class BackendKillingDispatcher:
    """A fault injector at the dispatcher edge: on its first event it terminates every backend
    of the database (the batch's own included), then hands the event to the real platform."""

    def __init__(self, real: NudgingPlatform, admin: Engine) -> None:
        self.real = real
        self.admin = admin
        self.killed = 0

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if not self.killed:
            self.killed = terminate_other_backends(self.admin)
        return self.real(session, event, now)


@pytest.mark.clause("REL-1")
@pytest.mark.clause("HEALTH-1")
def test_an_unreachable_database_answers_503_on_every_route_and_the_loop_shows_it(
    tmp_path: Path, clock: ManualClock
) -> None:
    """REL-1: no server behind the socket: every database route answers 503 with a JSON detail and
    Retry-After (no traceback, no hang); the loop keeps polling and /health/scheduler is 503 (the error for admins)."""
    settings = Settings(jwt_secret=TEST_SECRET, poll_seconds=0.02, pool_timeout_seconds=1)
    nowhere = make_engine(f"postgresql+psycopg://postgres@/scheduler?host={tmp_path}", settings)
    app = create_app(settings, engine=nowhere, clock=clock, catalogue=load_catalogue())
    with running(app) as client:
        health = wait_until(lambda: (r := client.get("/admin/health/scheduler", headers=ADMIN)).json()[
            "consecutive_failures"] >= 3 and r, "three failed polls")
        assert health.status_code == 503
        assert health.json()["running"] is True
        assert health.json()["last_error"].startswith("OperationalError: (psycopg.OperationalError) connection")
        # the open route says the same in words, without the error (it names the socket's path)
        open_health = client.get("/health/scheduler")
        assert open_health.status_code == 503 and open_health.json()["state"] == "failing"
        assert "last_error" not in open_health.json() and str(tmp_path) not in open_health.text
        for method, path, body in DATABASE_ROUTES:
            ingest = path in {"/admin/scheduled-events", "/admin/ingest-event"} and method == "POST"
            headers = INGEST if ingest else ADMIN
            response = bounded(functools.partial(client.request, method, path, headers=headers, json=body),
                               30, f"{method} {path} during the outage")
            assert (response.status_code, response.json()) == (503, UNAVAILABLE), f"{method} {path}"
            assert response.headers["retry-after"] == "5"
        assert client.get("/health").status_code == 200  # the process itself is fine


@pytest.mark.clause("REL-2")
def test_backends_terminated_mid_batch_fail_the_poll_whole_and_the_next_poll_heals(
    database_url: str, engine: Engine, clock: ManualClock
) -> None:
    """REL-2: the batch's connection dies mid-batch: the poll fails as a whole (every claimed row
    pending again, no notification kept), health shows it, and the next poll reconnects and
    dispatches each event exactly once."""
    settings = Settings(jwt_secret=TEST_SECRET)
    catalogue = load_catalogue()
    fault = BackendKillingDispatcher(NudgingPlatform(catalogue), engine)
    service = SchedulerService(settings, engine=make_engine(database_url, settings), clock=clock,
                               catalogue=catalogue, dispatcher=fault, run_scheduler=False)
    ids = store_due(engine, [f"user-{i}" for i in range(5)], T0)

    def poll() -> None:
        service.scheduler.poll_guarded(lambda: False)

    bounded(poll, 30, "the poll whose connection is terminated")
    assert fault.killed >= 1
    health = service.scheduler.health
    assert health.consecutive_failures == 1 and health.polls == 0
    assert "terminat" in (health.last_error or "") or "closed" in (health.last_error or "")
    assert statuses(engine) == dict.fromkeys(ids, "pending")
    assert notifications_by_event(engine) == {}
    bounded(poll, 30, "the poll after the outage")
    assert statuses(engine) == dict.fromkeys(ids, "dispatched")
    assert notifications_by_event(engine) == dict.fromkeys(ids, 1)
    assert health.consecutive_failures == 0 and health.polls == 1


@pytest.mark.clause("REL-2")
def test_the_pool_heals_after_every_backend_is_terminated_between_requests(
    database_url: str, engine: Engine, clock: ManualClock
) -> None:
    """REL-2: pooled connections killed while idle are noticed at checkout (pre-ping) and replaced:
    the next requests succeed without a restart and every 201 is in the table."""
    settings = Settings(jwt_secret=TEST_SECRET)
    service = SchedulerService(settings, engine=make_engine(database_url, settings), clock=clock, run_scheduler=False)
    created = []
    with TestClient(service.app) as client:
        for round_ in range(3):
            for i in range(3):
                body = {"event_type": "t", "user_id": f"u{round_}-{i}", "trigger_at": T0.isoformat(),
                        "facts": reminder()}
                response = client.post("/admin/scheduled-events", headers=INGEST, json=body)
                assert response.status_code == 201, response.text
                created.append(response.json()["id"])
            assert terminate_other_backends(engine) >= 1
        assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 200
    assert sorted(statuses(engine)) == sorted(created)


@pytest.mark.clause("REL-2")
def test_a_connection_terminated_mid_request_answers_503_and_the_retry_succeeds(
    database_url: str, engine: Engine, clock: ManualClock
) -> None:
    """REL-2: the backend dies while the INSERT is on its way: a 503 with a JSON detail, not a 500;
    the same POST retried (same external_key) is a 201, and the table holds that one row."""
    settings = Settings(jwt_secret=TEST_SECRET)
    service_engine = make_engine(database_url, settings)
    armed = {"insert": True}

    @event.listens_for(service_engine, "before_cursor_execute")
    def kill_before_insert(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # A fault injector at the database edge: terminate this very backend just before the insert.
        if armed["insert"] and "INSERT INTO scheduler.scheduled_events" in statement:
            armed["insert"] = False
            with engine.connect() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": cursor.connection.info.backend_pid})
                admin.commit()

    service = SchedulerService(settings, engine=service_engine, clock=clock, run_scheduler=False)
    body = {"event_type": "t", "user_id": "u", "external_key": "retry-me", "trigger_at": T0.isoformat(),
            "facts": reminder()}
    with TestClient(service.app, raise_server_exceptions=False) as client:
        first = client.post("/admin/scheduled-events", headers=INGEST, json=body)
        assert (first.status_code, first.json()) == (503, UNAVAILABLE)
        second = client.post("/admin/scheduled-events", headers=INGEST, json=body)
        assert second.status_code == 201, second.text
    assert statuses(engine) == {second.json()["id"]: "pending"}


@pytest.mark.clause("REL-2")
def test_a_polls_connection_used_a_moment_ago_is_not_pinged_and_a_requests_always_is(database_url: str) -> None:
    """REL-2: a poll's pooled connection used less than a second ago is taken without a ping (the
    round trip a burst's polls saved); one idle longer is pinged, and so is every
    request's; a connection killed while idle is replaced at a pinged checkout, unseen."""
    now = [100.0]
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    pings: list[int] = []
    real_ping = engine.dialect.do_ping

    def counting_ping(dbapi_connection: Any) -> bool:
        pings.append(1)
        return real_ping(dbapi_connection)

    engine.dialect.do_ping = counting_ping  # type: ignore[method-assign]
    ping_when_idle(engine, 1.0, monotonic=lambda: now[0])

    def use(poll: bool) -> int:
        with Session(engine) as session:
            if poll:
                with polling():
                    session.connection()
            return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())

    try:
        first = use(poll=True)
        assert pings == []  # connected a moment ago
        now[0] += 0.5
        assert use(poll=True) == first and pings == []
        assert use(poll=False) == first and len(pings) == 1  # a request: pinged whatever the time
        now[0] += 1.5
        assert use(poll=True) == first and len(pings) == 2  # idle past the second: pinged
        killer = create_engine(database_url, poolclass=NullPool)
        try:
            assert terminate_other_backends(killer) >= 1  # the pooled connection, idle
        finally:
            killer.dispose()
        now[0] += 1.5
        replaced = use(poll=True)  # the ping fails, the pool connects afresh: the poll sees nothing
        assert replaced != first and len(pings) == 3
    finally:
        engine.dispose()
