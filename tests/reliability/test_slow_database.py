"""REL-3, REL-4: an operator's lock delays a poll (and a POST) by the configured timeout at
most; the loop goes on, /health/scheduler shows why, and everything resumes after release."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine
from scheduler.database.events import participant_lock_key
from scheduler.service import SchedulerService, create_app
from tests.conftest import ADMIN, INGEST, T0, TEST_SECRET
from tests.helpers import bounded, running
from tests.reliability.support import (
    notifications_by_event,
    reminder,
    statuses,
    store_due,
    wait_until,
)


def _service(database_url: str, clock: ManualClock, **timeouts: int) -> SchedulerService:
    settings = Settings(jwt_secret=TEST_SECRET, poll_seconds=0.02, **timeouts)  # type: ignore[arg-type]
    return SchedulerService(settings, engine=make_engine(database_url, settings), clock=clock, run_scheduler=False)


@pytest.fixture
def operator(engine: Engine) -> Iterator[Connection]:
    """An operator's psql session: whatever it locks stays locked until the test releases it."""
    with engine.connect() as conn:
        yield conn
        conn.rollback()


def _post(client: TestClient) -> tuple[int, dict[str, object]]:
    body = {"event_type": "reminder", "user_id": "late-poster", "trigger_at": T0.isoformat(), "facts": reminder()}
    response = client.post("/admin/scheduled-events", headers=INGEST, json=body)
    return response.status_code, response.json()


@pytest.mark.clause("REL-3")
def test_a_table_lock_fails_polls_and_posts_within_the_lock_timeout_then_everything_resumes(
    database_url: str, engine: Engine, clock: ManualClock, operator: Connection
) -> None:
    """REL-3: with SCHEDULER_LOCK_TIMEOUT_MS=300 and the table locked, each poll fails with a lock
    timeout (health 503 naming it), a POST answers 503; after release the rows dispatch and health is 200."""
    ids = store_due(engine, [f"user-{i}" for i in range(5)], T0)
    operator.execute(text("LOCK TABLE scheduled_events IN ACCESS EXCLUSIVE MODE"))
    settings = Settings(jwt_secret=TEST_SECRET, poll_seconds=0.02, lock_timeout_ms=300, statement_timeout_ms=30_000)
    app = create_app(settings, engine=make_engine(database_url, settings), clock=clock)
    with running(app) as client:
        health = wait_until(lambda: (r := client.get("/admin/health/scheduler", headers=ADMIN)).status_code == 503
                            and "lock timeout" in (r.json()["last_error"] or "") and r.json(), "a failed poll")
        assert health["running"] is True and health["consecutive_failures"] >= 1
        status, body = bounded(lambda: _post(client), 30, "a POST against a locked table")
        assert (status, body) == (503, {"detail": "database unavailable; retry later"})
        operator.rollback()  # the operator lets go (the table cannot even be read before)
        wait_until(lambda: set(statuses(engine).values()) == {"dispatched"}, "the rows to dispatch")
        healthy = wait_until(lambda: (r := client.get("/health/scheduler")).status_code == 200 and r.json(),
                             "health to recover")
        assert healthy["consecutive_failures"] == 0 and healthy["polls"] >= 1
        assert _post(client)[0] == 201
    final = statuses(engine)
    assert {i: final[i] for i in ids} == dict.fromkeys(ids, "dispatched")
    assert notifications_by_event(engine).keys() >= set(ids)


@pytest.mark.clause("REL-3")
def test_a_participant_lock_held_by_an_operator_only_holds_back_that_participants_rows(
    database_url: str, engine: Engine, clock: ManualClock, operator: Connection
) -> None:
    """REL-3: a poll does not wait for (or fail on) a participant's advisory lock that an
    operator holds: it skips that participant's row, untouched and pending, and dispatches the
    others; after the release the held row dispatches too."""
    service = _service(database_url, clock, lock_timeout_ms=300, statement_timeout_ms=30_000)
    service.scheduler.batch_size = 1
    held, free = store_due(engine, ["held-participant", "free-participant"], T0)
    operator.execute(text("SELECT pg_advisory_lock(:k)"), {"k": participant_lock_key("held-participant")})

    def poll() -> None:
        service.scheduler.poll_guarded(lambda: False)

    bounded(poll, 30, "a poll whose oldest row belongs to the held participant")
    assert service.scheduler.health.consecutive_failures == 0
    assert service.scheduler.health.last_error is None
    assert statuses(engine) == {free: "dispatched", held: "pending"}
    assert notifications_by_event(engine) == {free: 1}
    operator.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": participant_lock_key("held-participant")})
    operator.commit()
    bounded(poll, 30, "a poll after the release")
    assert statuses(engine) == {free: "dispatched", held: "dispatched"}
    assert notifications_by_event(engine) == {free: 1, held: 1}
    assert service.scheduler.health.consecutive_failures == 0


@pytest.mark.clause("REL-4")
def test_statement_timeout_bounds_a_stuck_poll_and_post_when_lock_timeout_is_off(
    database_url: str, engine: Engine, clock: ManualClock, operator: Connection
) -> None:
    """REL-4: SCHEDULER_LOCK_TIMEOUT_MS=0 (off) and SCHEDULER_STATEMENT_TIMEOUT_MS=300: a statement
    stuck behind the operator is cancelled; the poll fails, the POST answers 503, the loop goes on."""
    service = _service(database_url, clock, lock_timeout_ms=0, statement_timeout_ms=300)
    (event_id,) = store_due(engine, ["user-1"], T0)
    operator.execute(text("LOCK TABLE scheduled_events IN ACCESS EXCLUSIVE MODE"))
    bounded(lambda: service.scheduler.poll_guarded(lambda: False), 30, "a poll against a locked table")
    assert "statement timeout" in (service.scheduler.health.last_error or "")
    with TestClient(service.app) as client:
        status, body = bounded(lambda: _post(client), 30, "a POST against a locked table")
    assert (status, body) == (503, {"detail": "database unavailable; retry later"})
    operator.rollback()
    bounded(lambda: service.scheduler.poll_guarded(lambda: False), 30, "a poll after the release")
    assert statuses(engine) == {event_id: "dispatched"}
    assert service.scheduler.health.consecutive_failures == 0
