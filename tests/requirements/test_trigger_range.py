"""REQ-0063, REQ-0065 — every storable ``trigger_at`` is claimable when due.

In our words: a ``trigger_at`` is an ISO 8601 instant with its offset, given as a string,
from 2000-01-01T00:00:00Z up to (not including) 9999-01-01T00:00:00Z (DEC-TRIGGER); anything
else (a number read as Unix time, the zero time a sender sends when it forgot the time, a
time near the ends of what can be read back) is a 422 naming the field, through the API and
through ``store_event``. Every instant in that range, given in any offset, is stored, read
back in any session zone, and claimed at the moment it falls due.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.core.store import EARLIEST_TRIGGER, LATEST_TRIGGER, TriggerOutOfRange, store_event
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.conftest import INGEST, T0
from tests.helpers import event_body, rows

URL = "/admin/scheduled-events"
LAST_STORABLE = LATEST_TRIGGER - timedelta(microseconds=1)


def refused_naming_trigger_at(client: TestClient, trigger_at: Any) -> str:
    response = client.post(URL, headers=INGEST, json={**event_body(), "trigger_at": trigger_at})
    assert response.status_code == 422, response.text
    detail = json.dumps(response.json())
    assert "trigger_at" in detail, detail
    return detail


@pytest.mark.clause("REQ-0063.7")
@pytest.mark.parametrize("trigger_at", [1_795_000_000, 1_795_000_000.5, 0, True, "1795000000", "1795000000.5"],
                         ids=["int", "float", "zero", "bool", "numeric-string", "numeric-string-float"])
def test_a_trigger_time_given_as_a_number_is_422(client: TestClient, engine: Engine, trigger_at: Any) -> None:
    """REQ-0063.7: Unix time, as a JSON number or a numeric string, is not an ISO 8601 instant."""
    assert "ISO 8601" in refused_naming_trigger_at(client, trigger_at)
    assert rows(engine, "SELECT id FROM scheduled_events") == []


@pytest.mark.clause("DEC-TRIGGER")
@pytest.mark.clause("REQ-0063.7")
@pytest.mark.parametrize("trigger_at", [
    "0001-01-01T00:00:00Z",  # Go's zero time: a sender that forgot to set the time
    "0001-01-01T12:00Z",
    "1970-01-01T00:00:00Z",  # Unix time 0
    "1999-12-31T23:59:59.999999Z",
    "2000-01-01T00:59:59+01:00",
    "9999-01-01T00:00:00Z",
    "9998-12-31T23:00:00-01:00",
    "9999-12-31T23:59:59Z",
])
def test_a_trigger_time_outside_the_storable_range_is_422_naming_the_range(
    client: TestClient, engine: Engine, trigger_at: str
) -> None:
    """REQ-0063.7: outside 2000-01-01T00:00:00Z..9999-01-01T00:00:00Z (excluded) is refused, saying the range."""
    assert "2000-01-01T00:00:00Z" in refused_naming_trigger_at(client, trigger_at)
    assert rows(engine, "SELECT id FROM scheduled_events") == []


@pytest.mark.clause("REQ-0063.7")
def test_store_event_keeps_to_the_same_range(service: SchedulerService, engine: Engine) -> None:
    """REQ-0063.7: the path the simulation and an embedding host store through refuses the same times."""
    for trigger_at in (datetime(1, 1, 1, tzinfo=UTC), EARLIEST_TRIGGER - timedelta(microseconds=1), LATEST_TRIGGER,
                       datetime(2026, 11, 30, 9)):
        with pytest.raises(TriggerOutOfRange):
            store_event(service.database, event_type="t", user_id="u", community_id=None, external_key=None,
                        trigger_at=trigger_at, facts={"facts_version": "1", "scenario": "s"}, now=T0)
    assert rows(engine, "SELECT id FROM scheduled_events") == []


class NoRuleDispatcher:
    """A fake at the dispatcher edge: every event runs through and triggers no rule."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


@pytest.fixture
def quick(service: SchedulerService) -> Iterator[SchedulerService]:
    service.scheduler.dispatcher = NoRuleDispatcher()
    yield service


# Session zones at the ends of what PostgreSQL and the world use: UTC+14 and UTC-12.
READ_BACK_ZONES = ("Pacific/Kiritimati", "Etc/GMT+12", "UTC")


@pytest.mark.clause("DEC-TRIGGER")
@pytest.mark.clause("REQ-0065.8")
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(instant=st.datetimes(min_value=EARLIEST_TRIGGER.replace(tzinfo=None),
                            max_value=LAST_STORABLE.replace(tzinfo=None), timezones=st.just(UTC)),
       offset_minutes=st.integers(min_value=-(15 * 60 + 59), max_value=15 * 60 + 59))
@example(instant=EARLIEST_TRIGGER, offset_minutes=-(15 * 60 + 59))
@example(instant=EARLIEST_TRIGGER, offset_minutes=15 * 60 + 59)
@example(instant=LAST_STORABLE, offset_minutes=-(15 * 60 + 59))
@example(instant=LAST_STORABLE, offset_minutes=15 * 60 + 59)
def test_every_storable_trigger_time_is_stored_read_back_in_any_zone_and_claimed_when_due(
    client: TestClient, quick: SchedulerService, engine: Engine, clock: ManualClock,
    instant: datetime, offset_minutes: int,
) -> None:
    """REQ-0065.8: any instant of the storable range, sent in any offset, is a 201; it reads back
    unchanged in the session zones furthest east and west; it is not claimed a microsecond
    before it is due and is claimed, and dispatched, at that instant."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM scheduled_events"))
    sent = instant.astimezone(timezone(timedelta(minutes=offset_minutes)))
    response = client.post(URL, headers=INGEST, json=event_body(trigger_at=sent.isoformat()))
    assert response.status_code == 201, response.text
    stored_id = response.json()["id"]
    with engine.connect() as conn:
        for zone in READ_BACK_ZONES:
            conn.execute(text("SELECT set_config('TimeZone', :zone, true)"), {"zone": zone})  # this transaction only
            read = conn.execute(text("SELECT trigger_at FROM scheduled_events WHERE id = :id"), {"id": stored_id})
            assert read.scalar_one() == instant, zone
        conn.rollback()
    scheduler = quick.scheduler
    if instant > EARLIEST_TRIGGER:
        clock.set(instant - timedelta(microseconds=1))
        assert scheduler.poll_once().claimed == 0  # not yet due
    clock.set(instant)
    report = scheduler.poll_once()
    assert [(o.id, o.status) for o in report.outcomes] == [(stored_id, "dispatched")]


@pytest.mark.clause("DEC-TRIGGER")
@pytest.mark.clause("REQ-0065.8")
def test_rows_stored_before_the_range_existed_are_claimed_when_due_however_early(
    client: TestClient, quick: SchedulerService, engine: Engine
) -> None:
    """REQ-0065.8: rows a database already holds from before the bound (Go's zero time, noon of
    year 1) are not left pending for ever: the claim's keyset starts before every readable row,
    so they go out first, oldest first, with the rows due now."""
    with engine.begin() as conn:
        for event_id, trigger_at in (("year-1-noon", "0001-01-01T12:00Z"), ("year-1", "0001-01-01T00:00:00Z")):
            conn.execute(text(
                "INSERT INTO scheduled_events"
                " (id, event_type, user_id, trigger_at, facts, status, created_at, updated_at)"
                " VALUES (:id, 't', :id, CAST(:at AS timestamptz), CAST(:facts AS jsonb), 'pending', :now, :now)"),
                {"id": event_id, "at": trigger_at, "facts": json.dumps({"facts_version": "1", "scenario": "s"}),
                 "now": T0})
    current = client.post(URL, headers=INGEST, json=event_body(trigger_at=T0)).json()["id"]
    report = quick.scheduler.poll_once()
    assert [(o.id, o.status) for o in report.outcomes] == [
        ("year-1", "dispatched"), ("year-1-noon", "dispatched"), (current, "dispatched")]
