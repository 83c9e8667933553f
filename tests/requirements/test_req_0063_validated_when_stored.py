"""REQ-0063 — a scheduled event is validated when it is stored, not when it fires.

In our words: ``POST /admin/scheduled-events`` needs the ingest permission and holds the
event to the same facts contract as a live event (REQ-0012): facts must be present and
non-empty and carry ``facts_version`` and ``scenario``, else the sender gets a 422 now,
while somebody is there to read it. The time scope (REQ-0020) is deliberately not
checked here: an event with an unusable time is stored and fails when it fires.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, PARTICIPANT, bearer
from tests.helpers import event_body, event_row, later, post_event, reminder_facts, rows

URL = "/admin/scheduled-events"


def count(engine: Engine) -> int:
    return len(rows(engine, "SELECT id FROM scheduled_events"))


@pytest.mark.clause("REQ-0063.1")
def test_storing_an_event_requires_the_ingest_permission(client: TestClient, engine: Engine) -> None:
    """REQ-0063.1: no token is 401, a participant is 403, ingest and admin may store."""
    assert client.post(URL, json=event_body()).status_code == 401
    forbidden = client.post(URL, headers=PARTICIPANT, json=event_body())
    assert forbidden.status_code == 403
    assert "nudging.ingest" in forbidden.json()["detail"]
    assert count(engine) == 0
    assert client.post(URL, headers=INGEST, json=event_body()).status_code == 201
    assert client.post(URL, headers=ADMIN, json=event_body()).status_code == 201
    assert count(engine) == 2


@pytest.mark.clause("REQ-0063.2")
@pytest.mark.parametrize("facts", [None, {}], ids=["absent", "empty"])
def test_missing_or_empty_facts_are_refused_with_a_422_at_once(
    client: TestClient, engine: Engine, facts: dict[str, Any] | None
) -> None:
    """REQ-0063.2: facts absent or empty answer 422 "Missing facts in scheduled event"."""
    body = event_body()
    if facts is None:
        del body["facts"]
    else:
        body["facts"] = facts
    response = client.post(URL, headers=INGEST, json=body)
    assert response.status_code == 422
    assert response.json() == {"detail": "Missing facts in scheduled event"}
    assert count(engine) == 0


@pytest.mark.clause("REQ-0063.3")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"facts_version": None}, "facts.facts_version"),
        ({"scenario": None}, "facts.scenario"),
        ({"facts_version": ""}, "facts.facts_version"),
        ({"scenario": "   "}, "facts.scenario"),
        ({"facts_version": 1}, "facts.facts_version"),
        ({"scenario": ["commitment_reminder"]}, "facts.scenario"),
    ],
    ids=["no-version", "no-scenario", "empty-version", "blank-scenario", "numeric-version", "list-scenario"],
)
def test_facts_without_a_version_or_scenario_string_break_the_contract(
    client: TestClient, engine: Engine, change: dict[str, Any], field: str
) -> None:
    """REQ-0063.3: facts_version and scenario absent, empty or not strings answer 422 invalid_facts_contract."""
    facts = {k: v for k, v in {**reminder_facts(), **change}.items() if v is not None}
    response = client.post(URL, headers=INGEST, json=event_body(facts=facts))
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail["error"] == "invalid_facts_contract"
    assert [e["field"] for e in detail["errors"]] == [field]
    assert count(engine) == 0


@pytest.mark.clause("REQ-0063.3")
def test_both_contract_fields_missing_are_both_reported(client: TestClient) -> None:
    """REQ-0063.3: every contract violation is listed, not only the first."""
    response = client.post(URL, headers=INGEST, json=event_body(facts={"date": "2026-11-30"}))
    assert response.status_code == 422
    fields = [e["field"] for e in response.json()["detail"]["errors"]]
    assert fields == ["facts.facts_version", "facts.scenario"]


@pytest.mark.clause("REQ-0063.4")
def test_a_contract_violation_is_never_discovered_by_the_scheduler(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0063.4: a refused post leaves nothing behind to fail unseen at trigger time."""
    client.post(URL, headers=INGEST, json=event_body(facts={"scenario": "commitment_reminder"}))
    clock.advance(later(24))
    assert service.scheduler.poll_once().claimed == 0
    assert count(engine) == 0


@pytest.mark.clause("REQ-0063.5")
@pytest.mark.parametrize("bad_time", [{"date": "next tuesday"}, {"date": ""}, {"week": "2026-W60"}],
                         ids=["prose", "empty", "week-60"])
def test_an_unusable_time_scope_is_accepted_and_fails_at_dispatch(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine, bad_time: dict[str, str]
) -> None:
    """REQ-0063.5: the time scope is not checked on storage; the row fails when it fires, reason in last_error."""
    facts = {**reminder_facts(), **bad_time}
    if bad_time.get("date") is not None:
        facts["date"] = bad_time["date"]
    if "week" in bad_time:
        del facts["date"]
    stored = post_event(client, facts=facts)
    assert stored["status"] == "pending"
    clock.advance(later())
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["failed"]
    row = event_row(engine, stored["id"])
    assert row["status"] == "failed"
    assert row["dispatched_at"] is None
    assert row["last_error"].startswith("missing_or_invalid_time_scope")


@pytest.mark.clause("REQ-0063.6")
@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(trigger_at="2026-11-30T09:00:00"), "trigger_at"),
        (lambda b: b.update(trigger_at="tomorrow"), "trigger_at"),
        (lambda b: b.pop("trigger_at"), "trigger_at"),
        (lambda b: b.update(user_id=42), "user_id"),
        (lambda b: b.update(user_id=""), "user_id"),
        (lambda b: b.update(event_type=None), "event_type"),
        (lambda b: b.update(facts=["facts_version", "scenario"]), "facts"),
        (lambda b: b.update(external_key=""), "external_key"),
        (lambda b: b.update(status="dispatched"), "status"),
    ],
    ids=["naive-time", "prose-time", "no-time", "numeric-user", "empty-user", "null-type",
         "facts-list", "empty-key", "unknown-field"],
)
def test_a_malformed_body_is_a_422_that_names_the_field(
    client: TestClient, engine: Engine, mutate: Any, field: str
) -> None:
    """REQ-0063.6: any other malformed body answers 422 with a message naming the field; nothing is stored."""
    body = event_body()
    mutate(body)
    response = client.post(URL, headers=INGEST, json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    assert count(engine) == 0


@pytest.mark.clause("DEC-6")
@pytest.mark.clause("REQ-0063.6")
def test_a_body_that_is_not_json_or_too_large_is_refused_clearly(client: TestClient, engine: Engine) -> None:
    """REQ-0063.6: not JSON is a 422 saying so; an oversized body is a 413; neither stores anything."""
    not_json = client.post(URL, headers={**INGEST, "content-type": "application/json"}, content=b"{not json")
    assert not_json.status_code == 422
    assert "not valid JSON" in not_json.json()["detail"]
    huge = event_body(facts=reminder_facts(padding="x" * 100_000))
    too_large = client.post(URL, headers=INGEST, json=huge)
    assert too_large.status_code == 413
    assert "larger than" in too_large.json()["detail"]
    assert count(engine) == 0


@pytest.mark.clause("REQ-0063.1")
def test_an_invalid_or_expired_token_cannot_store(client: TestClient, engine: Engine) -> None:
    """REQ-0063.1: a token signed with another secret, or expired, is a 401 with a Bearer challenge."""
    wrong = client.post(URL, headers=bearer("nudging.ingest", secret="another-secret-entirely-0123456789"),
                        json=event_body())
    expired = client.post(URL, headers=bearer("nudging.ingest", ttl_seconds=-3600), json=event_body())
    for response in (wrong, expired):
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert count(engine) == 0
