"""Context: the facts contract (REQ-0012) and the time scope (REQ-0020, REQ-0021).

In our words: an event's facts are a non-empty object carrying ``facts_version`` and
``scenario`` as non-empty strings; one implementation serves both routes and the engine.
Its time scope is the first non-empty of ``time``, ``date``, ``week``, ``period``
(trimmed), whose shape gives the frequency: ``YYYY-MM-DD`` daily, ``YYYY-Www`` weekly,
``YYYY-MM`` monthly, ``YYYY`` yearly. Anything else is the refusal
``missing_or_invalid_time_scope``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.nudging.facts import TimeScope, TimeScopeError, parse_time_scope
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0
from tests.helpers import event_row, reminder_facts


def ingest(client: TestClient, facts: Any) -> Any:
    body: dict[str, Any] = {"event_type": "t", "user_id": "p1", "community_id": None}
    if facts is not None:
        body["facts"] = facts
    return client.post("/admin/ingest-event", headers=INGEST, json=body)


@pytest.mark.clause("CTX-FACTS.1")
def test_live_ingest_holds_events_to_the_same_facts_contract(client: TestClient, engine: Engine) -> None:
    """CTX-FACTS.1: the live route answers the same 422s as the scheduled route, and writes nothing."""
    assert ingest(client, None).json() == {"detail": "Missing facts in event"}
    assert ingest(client, {}).status_code == 422
    broken = ingest(client, {"facts_version": "", "date": "2026-11-30"})
    assert broken.status_code == 422
    assert broken.json()["detail"]["error"] == "invalid_facts_contract"
    assert [e["field"] for e in broken.json()["detail"]["errors"]] == ["facts.facts_version", "facts.scenario"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM notifications")).scalar() == 0


@pytest.mark.clause("CTX-FACTS.2")
def test_the_engine_applies_the_contract_to_rows_that_bypassed_the_route(
    service: SchedulerService, engine: Engine
) -> None:
    """CTX-FACTS.2: one implementation: a row written around the API still meets the contract at dispatch."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO scheduled_events (id, event_type, user_id, trigger_at, facts, created_at, updated_at)"
                 " VALUES ('raw', 't', 'p1', :t, CAST(:f AS jsonb), :t, :t)"),
            {"t": T0, "f": json.dumps({"scenario": "commitment_reminder", "date": "2026-11-30"})},
        )
    service.scheduler.poll_once()
    row = event_row(engine, "raw")
    assert row["status"] == "failed"
    assert row["last_error"].startswith("invalid_facts_contract")


@pytest.mark.clause("CTX-TIME.1")
@pytest.mark.parametrize(
    ("value", "frequency"),
    [("2026-11-30", "daily"), ("2026-W48", "weekly"), ("2026-11", "monthly"), ("2026", "yearly"),
     ("  2026-02-28 ", "daily"), ("2026-W53", "weekly")],
)
def test_the_shape_of_the_time_scope_gives_the_frequency(value: str, frequency: str) -> None:
    """CTX-TIME.1: YYYY-MM-DD daily, YYYY-Www weekly, YYYY-MM monthly, YYYY yearly (trimmed)."""
    assert parse_time_scope({"time": value}) == TimeScope(frequency, value.strip())  # type: ignore[arg-type]


@pytest.mark.clause("CTX-TIME.2")
def test_the_first_non_empty_of_time_date_week_period_decides() -> None:
    """CTX-TIME.2: the fields are read in order; empty or blank ones are skipped, later ones ignored."""
    assert parse_time_scope({"time": " ", "date": "", "week": "2026-W01", "period": "2026"}).value == "2026-W01"
    assert parse_time_scope({"period": "2026-12", "date": "2026-12-01"}).value == "2026-12-01"
    assert parse_time_scope({"period": "2027"}).frequency == "yearly"


@pytest.mark.clause("CTX-TIME.3")
@pytest.mark.parametrize(
    "facts",
    [{}, {"date": "  "}, {"date": "2026-02-30"}, {"week": "2026-W54"}, {"week": "2025-W53"}, {"period": "2026-13"},
     {"time": "30/11/2026"}, {"time": "2026-11-30T09:00"}, {"date": 20261130}, {"date": "next week", "period": "2026"}],
    ids=["none", "blank", "no-feb-30", "week-54", "2025-has-52-weeks", "month-13", "slashes", "datetime",
         "number", "first-field-wins-even-if-bad"],
)
def test_anything_else_is_refused_as_missing_or_invalid_time_scope(facts: dict[str, Any]) -> None:
    """CTX-TIME.3: every other value is a refusal named missing_or_invalid_time_scope."""
    with pytest.raises(TimeScopeError) as refused:
        parse_time_scope(facts)
    assert str(refused.value).startswith("missing_or_invalid_time_scope")


@pytest.mark.clause("CTX-TIME.3")
def test_live_ingest_answers_an_unusable_time_scope_with_a_422(client: TestClient) -> None:
    """CTX-TIME.3: live, the same refusal is the sender's 422 with the reason."""
    answer = ingest(client, {**reminder_facts(), "date": "2026-02-30"})
    assert answer.status_code == 422
    assert answer.json()["detail"]["error"] == "missing_or_invalid_time_scope"
