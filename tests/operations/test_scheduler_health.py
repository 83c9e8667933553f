"""HEALTH-1 to HEALTH-3: the open health route tells health in words, not secrets.

``GET /health/scheduler`` is open: it says whether the loop is healthy and why (``state``
running, stale, failing or stopped, and a ``reason`` in words), and never error text, which
for a database error names the host, the user and the database. ``GET
/admin/health/scheduler`` (admin) has the same and the last error.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, PARTICIPANT

SECRET_ERROR = ('OperationalError: (psycopg.OperationalError) connection to server at "db-7.internal.example" '
                '(10.1.2.3), port 5432 failed: FATAL: password authentication failed for user "svc_sched_prod" '
                'database "nudging_prod"')
SECRETS = ("db-7.internal.example", "10.1.2.3", "svc_sched_prod", "nudging_prod", "password", "FATAL")


def _running(service: SchedulerService, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the service report a live loop without running one (the loop is stepped by hand):
    a fake ``loop_alive``, the loop's own health as a started loop records it."""
    service.run_scheduler = True
    service.scheduler.health.started(service.clock.now())
    monkeypatch.setattr(SchedulerService, "loop_alive", property(lambda self: True))


@pytest.mark.clause("HEALTH-1")
def test_the_open_route_says_failing_and_why_in_words_without_the_error_text(
    client: TestClient, service: SchedulerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEALTH-1: a failing poll whose error names host, user and database: the open answer is 503
    'failing' with a reason an operator can act on, and none of the error's words."""
    _running(service, monkeypatch)
    service.scheduler.health.poll_failed(SECRET_ERROR, service.clock.now())
    service.listener.reason = f"connection lost: {SECRET_ERROR}"
    service.listener.available = False
    answer = client.get("/health/scheduler")
    assert answer.status_code == 503
    body = answer.json()
    assert (body["status"], body["state"], body["running"], body["consecutive_failures"]) == (
        "unhealthy", "failing", True, 1)
    assert "failed" in body["reason"] and "/admin/health/scheduler" in body["reason"]
    assert "last_error" not in body
    assert body["last_error_at"] == service.clock.now().isoformat()  # when, not what
    for secret in SECRETS:
        assert secret not in answer.text, secret


@pytest.mark.clause("HEALTH-1")
def test_the_open_route_names_running_stale_and_stopped(client: TestClient, service: SchedulerService,
                                                        clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """HEALTH-1: stopped (no loop), running (200, with the mode and interval), stale (503, three intervals)."""
    stopped = client.get("/health/scheduler")
    assert (stopped.status_code, stopped.json()["state"]) == (503, "stopped")
    assert "runs no polling loop" in stopped.json()["reason"]
    _running(service, monkeypatch)
    running = client.get("/health/scheduler")
    assert (running.status_code, running.json()["state"], running.json()["status"]) == (200, "running", "healthy")
    assert running.json()["reason"] == "polling every 30 s (literal mode)"
    clock.advance(timedelta(seconds=3 * 30 + 1))
    stale = client.get("/health/scheduler")
    assert (stale.status_code, stale.json()["state"], stale.json()["stale"]) == (503, "stale", True)
    assert "three intervals" in stale.json()["reason"]
    monkeypatch.setattr(SchedulerService, "loop_alive", property(lambda self: False))  # the task exited
    exited = client.get("/health/scheduler").json()
    assert (exited["state"], exited["running"]) == ("stopped", False) and "exited" in exited["reason"]


@pytest.mark.clause("HEALTH-2")
def test_admins_get_the_error_on_the_admin_route_and_nobody_else(
    client: TestClient, service: SchedulerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEALTH-2: /admin/health/scheduler carries last_error and the listener's reason in full; it needs admin."""
    _running(service, monkeypatch)
    service.scheduler.health.poll_failed(SECRET_ERROR, service.clock.now())
    answer = client.get("/admin/health/scheduler", headers=ADMIN)
    assert answer.status_code == 503
    assert answer.json()["last_error"] == SECRET_ERROR and answer.json()["state"] == "failing"
    assert client.get("/admin/health/scheduler").status_code == 401
    for caller in (INGEST, PARTICIPANT):
        assert client.get("/admin/health/scheduler", headers=caller).status_code == 403


@pytest.mark.clause("HEALTH-3")
def test_the_open_route_keeps_only_the_first_words_of_the_listeners_reason(
    client: TestClient, service: SchedulerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEALTH-3: in prompt mode with LISTEN lost, wakeups.reason says 'connection lost', not the error."""
    from scheduler.types import SchedulerMode

    _running(service, monkeypatch)
    service.scheduler.mode = SchedulerMode.PROMPT
    service.listener.available = False
    service.listener.reason = f"connection lost: {SECRET_ERROR}"
    body = client.get("/health/scheduler").json()
    assert body["wakeups"]["by"] == "timer"
    assert body["wakeups"]["reason"].startswith("connection lost (")
    assert not any(secret in json.dumps(body) for secret in SECRETS)
    detail = client.get("/admin/health/scheduler", headers=ADMIN).json()
    assert detail["wakeups"]["reason"] == f"connection lost: {SECRET_ERROR}"
