"""SEC-15: facts rendered into a message cannot execute anything; the Jinja sandbox holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.nudging.rules import load_catalogue
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0, TEST_SECRET

# Facts a hostile sender controls: Jinja syntax, dunder walks and a format-string attack.
HOSTILE_FACTS = {
    "expression": "{{ 7 * 7 }}",
    "statement": "{% for c in ().__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "lookup": "{{ self.__init__.__globals__ }}",
    "format_attack": "{0.__class__.__mro__}",
}

RULES = [
    {   # an honest rule that renders sender-controlled facts
        "id": "echo", "scenarios": ["echo"], "frequency": "daily", "kind": "reminder",
        "title": "{{ expression }}", "body": "{{ statement }}|{{ lookup }}",
    },
    {   # a template (a compromised catalogue) that tries to leave the sandbox
        "id": "escape-class", "scenarios": ["escape_class"], "frequency": "daily", "kind": "reminder",
        "title": "t", "body": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    },
    {   # facts as a format string applied to an object: str.format is sandboxed too
        "id": "escape-format", "scenarios": ["escape_format"], "frequency": "daily", "kind": "reminder",
        "title": "t", "body": "{{ format_attack.format(expression) }}",
    },
    {   # the globals of a function the template can see
        "id": "escape-globals", "scenarios": ["escape_globals"], "frequency": "daily", "kind": "reminder",
        "title": "t", "body": "{{ range.__init__.__globals__ }}{{ cycler.__init__.__globals__.os }}",
    },
]


@pytest.fixture
def hostile_service(
    tmp_path: Path, engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> SchedulerService:
    (tmp_path / "rules.json").write_text(json.dumps(RULES))
    settings = Settings(jwt_secret=TEST_SECRET, rules_dir=tmp_path)
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher,
                            catalogue=load_catalogue(tmp_path), run_scheduler=False)


@pytest.fixture
def hostile_client(hostile_service: SchedulerService) -> Iterator[TestClient]:
    with TestClient(hostile_service.app, raise_server_exceptions=False) as client:
        yield client


def live(scenario: str) -> dict[str, Any]:
    return {"event_type": "t", "user_id": "participant-1",
            "facts": {"facts_version": "1", "scenario": scenario, "date": "2026-11-30", **HOSTILE_FACTS}}


@pytest.mark.clause("SEC-15")
def test_jinja_syntax_in_facts_is_rendered_as_text_not_run(
    hostile_client: TestClient, publisher: RecordingPublisher
) -> None:
    """SEC-15: facts are data: '{{ 7 * 7 }}' arrives as those characters, never as 49."""
    response = hostile_client.post("/admin/ingest-event", headers=INGEST, json=live("echo"))
    assert response.status_code == 200, response.text
    notification = response.json()["notifications"][0]
    assert notification["title"] == "{{ 7 * 7 }}"
    assert notification["body"] == f"{HOSTILE_FACTS['statement']}|{HOSTILE_FACTS['lookup']}"
    assert [m.title for m in publisher.messages] == ["{{ 7 * 7 }}"]


@pytest.mark.clause("SEC-15")
@pytest.mark.parametrize("scenario", ["escape_class", "escape_format", "escape_globals"])
def test_a_template_that_reaches_for_python_internals_is_refused_live(
    hostile_client: TestClient, engine: Engine, scenario: str
) -> None:
    """SEC-15: the sandbox refuses __class__, __globals__ and format-string walks: a 422, nothing sent."""
    response = hostile_client.post("/admin/ingest-event", headers=INGEST, json=live(scenario))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail["error"] in {"template_error", "template_variable_missing"}
    assert "unsafe" in detail["detail"] or "undefined" in detail["detail"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM notifications")).scalar_one() == 0


@pytest.mark.clause("SEC-15")
def test_a_scheduled_event_whose_template_escapes_fails_with_the_reason(
    hostile_client: TestClient, hostile_service: SchedulerService, engine: Engine
) -> None:
    """SEC-15: at trigger time the same refusal marks the row failed; the poll and the other rows go on."""
    ids = {}
    for scenario in ("escape_class", "echo"):
        body = {**live(scenario), "trigger_at": T0.isoformat(), "user_id": f"user-{scenario}"}
        created = hostile_client.post("/admin/scheduled-events", headers=INGEST, json=body)
        assert created.status_code == 201, created.text
        ids[scenario] = created.json()["id"]
    report = hostile_service.scheduler.poll_once()
    assert (report.claimed, report.dispatched, report.failed) == (2, 1, 1)
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(text("SELECT id, status, last_error FROM scheduled_events"))}
    assert rows[ids["echo"]].status == "dispatched"
    assert rows[ids["escape_class"]].status == "failed"
    assert rows[ids["escape_class"]].last_error.startswith("template_error")
    assert "unsafe" in rows[ids["escape_class"]].last_error
