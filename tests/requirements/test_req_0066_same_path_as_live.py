"""REQ-0066 — a dispatched event runs the same path as an ingested one.

In our words: the stored facts become a DigitalTwinEvent and go, unchanged, through the
same engine and orchestrator as a live event, so a scheduled reminder is deduplicated,
rate-limited and preference-filtered exactly like a live one. "Dispatched" means the
engine ran, not that a message went out: a declined rule or a suppressed notification
ends ``dispatched`` just like one that reached a browser.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST
from tests.helpers import FakeDispatcher, event_row, post_event, reminder_facts


def notifications(client: TestClient, user_id: str | None = None) -> list[dict[str, object]]:
    query = f"?user_id={user_id}" if user_id else ""
    result: list[dict[str, object]] = client.get(f"/admin/notifications{query}", headers=ADMIN).json()
    return result


def live(client: TestClient, facts: dict[str, object], user_id: str = "participant-1") -> int:
    body = {"event_type": "commitment_reminder", "user_id": user_id, "community_id": "community-1", "facts": facts}
    return int(client.post("/admin/ingest-event", headers=INGEST, json=body).status_code)


@pytest.mark.clause("REQ-0066.1")
def test_the_stored_facts_reach_the_engine_as_a_digital_twin_event_unchanged(
    client: TestClient, service: SchedulerService, publisher: RecordingPublisher, engine: Engine
) -> None:
    """REQ-0066.1: the dispatcher receives the stored row's type, participant, community and facts."""
    facts = reminder_facts(extra={"nested": [1, {"deep": True}]}, note="é ✓")
    stored = post_event(client, facts=facts, user_id="participant-7", community_id="community-3")
    spy = FakeDispatcher(service.dispatcher)
    service.scheduler.dispatcher = spy
    service.scheduler.poll_once()
    [event] = spy.seen
    assert (event.event_type, event.user_id, event.community_id, dict(event.facts)) == (
        "commitment_reminder", "participant-7", "community-3", facts)
    assert event.scheduled_event_id == stored["id"]
    [note] = notifications(client)
    assert (note["source"], note["scheduled_event_id"], note["status"]) == ("scheduled", stored["id"], "sent")
    assert [m.notification_id for m in publisher.messages] == [note["id"]]


@pytest.mark.clause("REQ-0066.2")
def test_a_scheduled_reminder_is_deduplicated_against_a_live_event_of_the_same_period(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0066.2: live first, then the scheduled one for the same period: suppressed_dedup, row dispatched."""
    assert live(client, reminder_facts()) == 200
    stored = post_event(client)
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "dispatched"
    assert sorted((n["source"], n["status"], n["reason"]) for n in notifications(client)) == [
        ("live", "sent", None), ("scheduled", "suppressed", "suppressed_dedup")]
    assert live(client, reminder_facts()) == 409


@pytest.mark.clause("REQ-0066.3")
def test_a_scheduled_reminder_is_rate_limited_like_a_live_one(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0066.3: after three sent today (the default cap), the fourth is suppressed rate_limited."""
    for day in ("2026-11-27", "2026-11-28", "2026-11-29"):
        assert live(client, reminder_facts(day)) == 200
    stored = post_event(client, facts=reminder_facts("2026-11-30"))
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "dispatched"
    scheduled = [n for n in notifications(client) if n["source"] == "scheduled"]
    assert [(n["status"], n["reason"]) for n in scheduled] == [("suppressed", "rate_limited")]
    assert live(client, reminder_facts("2026-11-26")) == 202


@pytest.mark.clause("REQ-0066.4")
def test_a_scheduled_reminder_is_filtered_by_the_participants_preferences(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0066.4: a participant who disabled reminders gets none: suppressed kind_disabled."""
    response = client.put("/admin/participants/participant-1/preferences", headers=ADMIN,
                          json={"enabled_kinds": ["insight", "summary"], "max_per_day": 3})
    assert response.status_code == 200
    stored = post_event(client)
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "dispatched"
    assert [(n["status"], n["reason"]) for n in notifications(client)] == [("suppressed", "kind_disabled")]
    assert live(client, reminder_facts("2026-12-01")) == 202


@pytest.mark.clause("REQ-0066.5")
def test_dispatched_means_the_engine_ran_even_when_no_rule_fired(
    client: TestClient, service: SchedulerService, engine: Engine, publisher: RecordingPublisher
) -> None:
    """REQ-0066.5: a declining rule (live: 204) still ends dispatched, with no notification."""
    facts = {"facts_version": "1", "scenario": "self_consumption", "week": "2026-W48", "self_consumption_pct": 80}
    assert live(client, facts) == 204
    stored = post_event(client, facts=facts)
    service.scheduler.poll_once()
    row = event_row(engine, stored["id"])
    assert (row["status"], row["last_error"]) == ("dispatched", None)
    assert row["dispatched_at"] is not None
    assert notifications(client) == []
    assert publisher.messages == []


@pytest.mark.clause("REQ-0066.5")
def test_a_suppressed_notification_ends_dispatched_like_a_delivered_one(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0066.5: delivered, suppressed and duplicate outcomes all leave the row dispatched."""
    client.put("/admin/participants/p-capped/preferences", headers=ADMIN, json={"max_per_day": 0})
    delivered = post_event(client, user_id="p-free")
    capped = post_event(client, user_id="p-capped")
    duplicate = post_event(client, user_id="p-free")
    service.scheduler.poll_once()
    assert {event_row(engine, r["id"])["status"] for r in (delivered, capped, duplicate)} == {"dispatched"}


@pytest.mark.clause("DEC-8")
@pytest.mark.clause("REQ-0066.6")
@pytest.mark.parametrize(
    ("facts", "live_status", "reason"),
    [
        ({"facts_version": "1", "scenario": "unknown_scenario", "date": "2026-11-30"}, 400, "no_rule_for_scenario"),
        ({"facts_version": "1", "scenario": "commitment_reminder", "week": "2026-W48"}, 400, "no_rule_for_scenario"),
        ({"facts_version": "1", "scenario": "commitment_reminder", "date": "2026-11-30"}, 422,
         "missing_required_facts"),
        ({"facts_version": "1", "scenario": "commitment_reminder", "time": "soon", "commitment": "x"}, 422,
         "missing_or_invalid_time_scope"),
    ],
    ids=["unknown-scenario", "wrong-frequency", "missing-rule-fact", "bad-time"],
)
def test_a_scheduled_event_fails_exactly_when_the_live_event_would_be_refused(
    client: TestClient, service: SchedulerService, engine: Engine, facts: dict[str, object], live_status: int,
    reason: str,
) -> None:
    """REQ-0066.6: live 400/422 (the sender's error) is a failed row with the reason in last_error."""
    assert live(client, facts) == live_status
    stored = post_event(client, facts=facts)
    service.scheduler.poll_once()
    row = event_row(engine, stored["id"])
    assert (row["status"], row["dispatched_at"]) == ("failed", None)
    assert row["last_error"].startswith(reason)
    assert notifications(client) == []


@pytest.mark.clause("REQ-0066.6")
def test_a_scheduled_event_is_dispatched_exactly_when_live_ingest_would_answer_2xx_or_409(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0066.6: the same facts sent live and scheduled agree: 200/202/204/409 means dispatched."""
    cases = {
        "delivered": reminder_facts("2026-11-01"),
        "duplicate": reminder_facts("2026-11-01"),
        "declined": {"facts_version": "1", "scenario": "self_consumption", "week": "2026-W48",
                     "self_consumption_pct": 99},
    }
    live_answers = [live(client, f, user_id="live-twin") for f in cases.values()]
    assert live_answers == [200, 409, 204]
    stored = [post_event(client, facts=f, user_id="scheduled-twin") for f in cases.values()]
    service.scheduler.poll_once()
    assert [event_row(engine, r["id"])["status"] for r in stored] == ["dispatched"] * 3
