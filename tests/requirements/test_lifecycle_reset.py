"""LIFE-9 — the reset by hand of a *dispatched* row, through every adapter.

In our words: an operator who wants a reminder sent again resets its row, through the API
(``POST /admin/scheduled-events/{id}/reset``), the console's event page or the CLI
(``scheduler events reset ID``). Whatever the adapter, the row is then exactly a pending row:
no ``dispatched_at``, no ``last_error``; and the next poll dispatches it again, at that poll's
time. The reset of a failed row is proved elsewhere (REQ-0065.5, OPS-3); a failed row has no
``dispatched_at`` to clear, so only a dispatched one shows whether the reset clears it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN
from tests.helpers import event_row, post_event, rows
from tests.operations.support import sign_in


def dispatched_row(client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock) -> str:
    """A row dispatched at T0 and then left alone for an hour; its id."""
    row = post_event(client, user_id="reset-me")
    assert service.scheduler.poll_once().dispatched == 1
    stored = event_row(engine, row["id"])
    assert stored["status"] == "dispatched" and stored["dispatched_at"] == clock.now()
    clock.advance(timedelta(hours=1))
    return str(row["id"])


def assert_pending_then_dispatched_again(service: SchedulerService, engine: Engine, clock: ManualClock,
                                         event_id: str, actor: str) -> None:
    row = event_row(engine, event_id)
    assert (row["status"], row["dispatched_at"], row["last_error"]) == ("pending", None, None)
    last = rows(engine, "SELECT change, actor FROM scheduled_event_history WHERE event_id = :id "
                        "ORDER BY id DESC LIMIT 1", id=event_id)
    assert last == [{"change": "reset", "actor": actor}]
    report = service.scheduler.poll_once()
    assert (report.claimed, report.dispatched) == (1, 1)
    again = event_row(engine, event_id)
    assert (again["status"], again["dispatched_at"], again["last_error"]) == ("dispatched", clock.now(), None)


def reset_and_check(client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock,
                    reset: Callable[[str], Any], actor: str, source: str) -> None:
    event_id = dispatched_row(client, service, engine, clock)
    reset(event_id)
    trail = client.get("/admin/audit?limit=1", headers=ADMIN).json()  # CON-6: on record, whatever the adapter
    assert [(a["action"], a["event_id"], a["actor"], a["source"], a["count"]) for a in trail] == [
        ("reset", event_id, actor, source, 1)]
    assert_pending_then_dispatched_again(service, engine, clock, event_id, actor)


@pytest.mark.clause("LIFE-9")
@pytest.mark.clause("CON-6")
def test_a_dispatched_row_reset_through_the_api_is_pending_without_dispatched_at_then_dispatched_again(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """LIFE-9, CON-6: the API's reset of a dispatched row answers it pending, with neither
    dispatched_at nor last_error; the next poll dispatches it at that poll's time."""

    def reset(event_id: str) -> None:
        answer = client.post(f"/admin/scheduled-events/{event_id}/reset", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["status"], body["dispatched_at"], body["last_error"]) == ("pending", None, None)

    reset_and_check(client, service, engine, clock, reset, actor="local-operator", source="api")


@pytest.mark.clause("LIFE-9")
@pytest.mark.clause("CON-6")
def test_a_dispatched_row_reset_on_the_console_is_pending_without_dispatched_at_then_dispatched_again(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """LIFE-9, CON-6: the console's reset form on the event page does the same."""

    def reset(event_id: str) -> None:
        # signed in now, on the service's clock: a session idle for the hour the row waited has ended (CON-12)
        csrf = sign_in(client, subject="operator-ann")
        answer = client.post(f"/console/events/{event_id}/reset", data={"csrf": csrf, "reason": "send again"},
                             follow_redirects=False)
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == f"/console/events/{event_id}?done=reset"

    reset_and_check(client, service, engine, clock, reset, actor="operator-ann", source="console")


@pytest.mark.clause("LIFE-9")
@pytest.mark.clause("CON-6")
def test_a_dispatched_row_reset_by_the_cli_is_pending_without_dispatched_at_then_dispatched_again(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock, database_url: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """LIFE-9, CON-6: ``scheduler events reset ID`` does the same."""
    monkeypatch.setenv("DATABASE_URL", database_url)

    def reset(event_id: str) -> None:
        assert main(["events", "reset", event_id, "--actor", "ops-cli"]) == 0
        assert "pending again" in capsys.readouterr().out

    reset_and_check(client, service, engine, clock, reset, actor="ops-cli", source="cli")
