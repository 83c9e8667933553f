"""``/health/scheduler`` is degraded when the outbox does not keep up (HEALTH-4, HEALTH-5).

The rows are real (a sent notification queued on a host channel, on real PostgreSQL); the loop
is stepped by hand and its liveness reported as a started loop's, as the other health tests do.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.types import Retry
from tests.conftest import ADMIN
from tests.helpers import drain, post_event
from tests.operations.support import loop_step
from tests.requirements.test_outbox import ScriptedSender, worker

STALE = 120


@pytest.fixture
def outbox_service(settings: Settings, engine: Engine, clock: ManualClock,
                   publisher: RecordingPublisher) -> SchedulerService:
    return SchedulerService(settings.model_copy(update={"delivery_stale_seconds": STALE}), engine=engine,
                            clock=clock, publisher=publisher, run_scheduler=False, senders={"sms": ScriptedSender()})


def live(service: SchedulerService, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the app has started (without a loop or a worker): report a live loop, stepped by hand."""
    service.run_scheduler = True
    service.scheduler.health.started(service.clock.now())
    monkeypatch.setattr(SchedulerService, "loop_alive", property(lambda self: True))


def health(client: TestClient, service: SchedulerService, clock: ManualClock,
           seconds: float) -> tuple[int, dict[str, Any]]:
    """The open answer ``seconds`` later, the loop having polled just now (never stale)."""
    clock.advance(timedelta(seconds=seconds))
    loop_step(service)
    answer = client.get("/health/scheduler")
    return answer.status_code, answer.json()


@pytest.mark.clause("HEALTH-4")
def test_a_delivery_due_and_unsent_past_the_threshold_makes_the_health_degraded_but_still_200(
    outbox_service: SchedulerService, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEALTH-4: a queued delivery younger than SCHEDULER_DELIVERY_STALE_SECONDS leaves the state
    running; older, the open and the admin route say ``degraded`` (200) and why, with the wait; once
    the worker delivered it, running again."""
    with TestClient(outbox_service.app) as client:
        live(outbox_service, monkeypatch)
        post_event(client)
        drain(outbox_service)
        status, body = health(client, outbox_service, clock, STALE - 10)
        assert (status, body["state"], body["status"]) == (200, "running", "healthy")
        assert body["oldest_due_delivery_seconds"] == STALE - 10
        status, body = health(client, outbox_service, clock, 20)
        assert (status, body["state"], body["status"]) == (200, "degraded", "degraded")
        assert f"due and unsent for {STALE + 10} s" in body["reason"]
        assert "SCHEDULER_DELIVERY_STALE_SECONDS (120 s)" in body["reason"]
        admin = client.get("/admin/health/scheduler", headers=ADMIN)
        assert (admin.status_code, admin.json()["state"]) == (200, "degraded")
        asyncio.run(worker(outbox_service, ScriptedSender(), clock).run_once())
        status, body = health(client, outbox_service, clock, 10)
        assert (status, body["state"], body["oldest_due_delivery_seconds"]) == (200, "running", 0.0)


@pytest.mark.clause("HEALTH-4")
def test_a_retrying_delivery_counts_from_its_next_attempt_and_a_stopped_loop_still_wins(
    outbox_service: SchedulerService, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEALTH-4: a retrying row waiting for its backoff is not late; past its ``next_attempt_at``
    it counts from then; a loop that is stale or stopped keeps its own 503 whatever the outbox says."""
    with TestClient(outbox_service.app) as client:
        live(outbox_service, monkeypatch)
        post_event(client)
        drain(outbox_service)
        [recorded] = asyncio.run(worker(outbox_service, ScriptedSender(Retry(reason="http 503", retry_after=600.0)),
                                        clock).run_once())
        due = recorded.record.next_attempt_at
        assert due is not None
        status, body = health(client, outbox_service, clock, 500)  # waiting for its backoff
        assert (body["state"], body["oldest_due_delivery_seconds"]) == ("running", 0.0)
        clock.set(due)
        status, body = health(client, outbox_service, clock, STALE + 1)
        assert (status, body["state"], body["oldest_due_delivery_seconds"]) == (200, "degraded", STALE + 1)
        clock.advance(timedelta(seconds=3 * 30 + 1))  # no poll in three intervals
        stale = client.get("/health/scheduler")
        assert (stale.status_code, stale.json()["state"]) == (503, "stale")
        monkeypatch.setattr(SchedulerService, "loop_alive", property(lambda self: False))
        assert client.get("/health/scheduler").json()["state"] == "stopped"


@pytest.mark.clause("HEALTH-5")
def test_the_stale_delivery_threshold_is_a_bounded_setting_named_when_refused() -> None:
    """HEALTH-5: SCHEDULER_DELIVERY_STALE_SECONDS defaults to 600 and takes 10 s to a week; anything
    else is refused naming the variable."""
    assert Settings.from_env({"SCHEDULER_JWT_SECRET": "x" * 40}).delivery_stale_seconds == 600
    assert Settings.from_env({"SCHEDULER_DELIVERY_STALE_SECONDS": "45"}).delivery_stale_seconds == 45
    for bad in ("9", str(7 * 86400 + 1), "soon", "1.5"):
        with pytest.raises(ConfigError, match="SCHEDULER_DELIVERY_STALE_SECONDS"):
            Settings.from_env({"SCHEDULER_DELIVERY_STALE_SECONDS": bad})
