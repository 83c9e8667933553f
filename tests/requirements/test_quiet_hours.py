"""A participant's own time, wired (QUIET-*, DEC-LOCAL-TIME): the zone and quiet hours in the
preferences, a reminder held in quiet hours (``not_before``), the claim's ``due_at``, the
cap's local day, a live event deferred into a scheduled row.

Europe/Berlin is UTC+1 in winter: at T0 (2026-11-30 09:00 UTC) its clock reads 10:00, so
quiet hours 09:00 to 12:00 hold T0 and end at 11:00 UTC.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, DispatchResult
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import event_row, post_event, reminder_facts, rows
from tests.operations.support import loop_step, scrape, sign_in

BERLIN_QUIET = {"time_zone": "Europe/Berlin", "quiet_hours": {"start": "09:00", "end": "12:00"}}
QUIET_ENDS = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)  # 12:00 in Berlin


def put_preferences(client: TestClient, user_id: str, **body: Any) -> dict[str, Any]:
    response = client.put(f"/admin/participants/{user_id}/preferences", headers=ADMIN, json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def live(client: TestClient, day: str, user_id: str = "p1") -> Any:
    body = {"event_type": "t", "user_id": user_id, "facts": reminder_facts(day)}
    return client.post("/admin/ingest-event", headers=INGEST, json=body)


def history(engine: Engine, event_id: str) -> list[str]:
    return [r["change"] for r in rows(engine, "SELECT change FROM scheduled_event_history WHERE event_id = :e "
                                              "ORDER BY id", e=event_id)]


# -- QUIET-1: the preferences ------------------------------------------------------------


@pytest.mark.clause("QUIET-1")
def test_preferences_carry_a_time_zone_and_quiet_hours_and_get_shows_them(client: TestClient) -> None:
    """QUIET-1: PUT stores the zone and the quiet hours, GET shows them; a participant never
    set has the defaults (UTC, none) and an omitted field is its default."""
    fresh = client.get("/admin/participants/nobody/preferences", headers=ADMIN)
    assert fresh.status_code == 200
    assert fresh.json() == {"user_id": "nobody", "enabled_kinds": None, "max_per_day": 3, "time_zone": "UTC",
                            "quiet_hours": None, "updated_at": None}
    stored = put_preferences(client, "p1", max_per_day=2, time_zone="Europe/Berlin",
                             quiet_hours={"start": "22:00", "end": "07:00"})
    assert (stored["time_zone"], stored["quiet_hours"]) == ("Europe/Berlin", {"start": "22:00", "end": "07:00"})
    shown = client.get("/admin/participants/p1/preferences", headers=ADMIN).json()
    assert shown == stored
    assert put_preferences(client, "p1", max_per_day=2)["time_zone"] == "UTC"
    assert client.get("/admin/participants/p1/preferences", headers=ADMIN).json()["quiet_hours"] is None


@pytest.mark.clause("QUIET-1")
@pytest.mark.parametrize(("body", "fields"), [
    ({"time_zone": "Mars/Olympus_Mons"}, ["time_zone"]),
    ({"time_zone": "../etc/passwd"}, ["time_zone"]),
    ({"time_zone": 3}, ["time_zone"]),
    ({"time_zone": "europe/berlin"}, ["time_zone"]),
    ({"quiet_hours": {"start": "7:00", "end": "24:00"}}, ["quiet_hours.start", "quiet_hours.end"]),
    ({"quiet_hours": {"start": "22:00", "end": "22:00"}}, ["quiet_hours"]),
    ({"quiet_hours": "22:00-07:00"}, ["quiet_hours"]),
    ({"time_zone": "Nowhere", "quiet_hours": {"start": "22:00"}}, ["time_zone", "quiet_hours.end"]),
])
def test_a_zone_or_quiet_hours_that_are_not_valid_are_a_422_naming_the_field(
        client: TestClient, body: dict[str, Any], fields: list[str]) -> None:
    """QUIET-1: an unknown zone or malformed quiet hours are a 422 in the shape of every 422,
    each problem naming its field; nothing is stored."""
    response = client.put("/admin/participants/p1/preferences", headers=ADMIN, json={"max_per_day": 3, **body})
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == fields
    assert client.get("/admin/participants/p1/preferences", headers=ADMIN).json()["updated_at"] is None


@pytest.mark.clause("QUIET-1")
def test_the_cli_shows_a_participants_zone_and_quiet_hours(
        client: TestClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        database_url: str) -> None:
    """QUIET-1: ``scheduler participants preferences USER`` prints them (the defaults for one
    never set), as text and as the API's JSON."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["participants", "preferences", "p1"]) == 0
    out = capsys.readouterr().out
    assert "Europe/Berlin" in out and "09:00 to 12:00 local" in out
    assert main(["participants", "preferences", "p1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == client.get("/admin/participants/p1/preferences", headers=ADMIN).json()
    assert main(["participants", "preferences", "nobody"]) == 0
    out = capsys.readouterr().out
    assert "UTC" in out and "never set" in out


@pytest.mark.clause("QUIET-1")
@pytest.mark.clause("QUIET-2")
def test_the_console_event_page_shows_not_before_and_the_participants_zone_and_quiet_hours(
        client: TestClient, service: SchedulerService) -> None:
    """QUIET-1, QUIET-2: a held row's page says until when, and why (the participant's zone and
    quiet hours, their cap's local day)."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    row = post_event(client, user_id="p1", trigger_at=T0 - timedelta(minutes=1))
    service.scheduler.poll_once()
    sign_in(client)
    page = client.get(f"/console/events/{row['id']}").text
    assert f'data-col="not_before">{QUIET_ENDS.isoformat()}<' in page, page
    assert 'data-col="time_zone">Europe/Berlin<' in page
    assert 'data-col="quiet_hours">09:00 to 12:00 local<' in page


# -- QUIET-2, QUIET-3: held, then dispatched or expired ------------------------------------


def _per_event(service: SchedulerService, clock: ManualClock) -> Scheduler:
    """A scheduler whose dispatcher is a plain function: the per-event path (DEC-1.4)."""
    def dispatcher(session: Any, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return service.dispatcher(session, event, now)
    return Scheduler(service.database, dispatcher, clock, name="per-event")


@pytest.mark.clause("QUIET-2")
@pytest.mark.parametrize("path", ["set-based", "per-event"])
def test_a_reminder_due_in_quiet_hours_is_held_pending_until_they_end_then_dispatched(
        client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock, path: str) -> None:
    """QUIET-2: claimed in its participant's quiet hours, the row stays pending with not_before
    the UTC instant they end (on the row and in the API), no notification and no key written,
    history says held; it is not claimed again before not_before and is dispatched then,
    keeping its not_before."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    row = post_event(client, user_id="p1", trigger_at=T0 - timedelta(minutes=1))
    scheduler = service.scheduler if path == "set-based" else _per_event(service, clock)
    report = scheduler.poll_once()
    assert (report.claimed, report.dispatched, report.held) == (1, 0, 1)
    held = event_row(engine, row["id"])
    assert (held["status"], held["not_before"], held["last_error"]) == ("pending", QUIET_ENDS, None)
    assert held["due_at"] == QUIET_ENDS
    shown = client.get(f"/admin/scheduled-events/{row['id']}", headers=ADMIN).json()
    assert shown["not_before"] == QUIET_ENDS.isoformat()
    assert rows(engine, "SELECT id FROM notifications") == rows(engine, "SELECT key FROM dedup_keys") == []
    assert history(engine, row["id"]) == ["stored", "held"]
    clock.set(QUIET_ENDS - timedelta(microseconds=1))
    assert scheduler.poll_once().claimed == 0
    clock.set(QUIET_ENDS)
    assert scheduler.poll_once().dispatched == 1
    done = event_row(engine, row["id"])
    assert (done["status"], done["not_before"], done["dispatched_at"]) == ("dispatched", QUIET_ENDS, QUIET_ENDS)
    assert [r["status"] for r in rows(engine, "SELECT status FROM notifications")] == ["sent"]


@pytest.mark.clause("QUIET-2")
def test_a_reminder_claimed_after_the_quiet_hours_it_fell_due_in_is_sent(
        client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock) -> None:
    """QUIET-2: the hold is decided at the instant it would be sent, not at trigger_at."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    row = post_event(client, user_id="p1", trigger_at=T0)
    clock.set(QUIET_ENDS + timedelta(minutes=5))
    assert service.scheduler.poll_once().dispatched == 1
    assert event_row(engine, row["id"])["not_before"] is None


@pytest.mark.clause("QUIET-3")
def test_a_held_row_counts_neither_failed_nor_dispatched_and_its_lateness_runs_from_not_before(
        client: TestClient, service: SchedulerService, clock: ManualClock) -> None:
    """QUIET-3: /metrics counts a hold as nothing; dispatched 90 s after its not_before, the
    lateness observed is 90 s, not the hours since its trigger_at."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    post_event(client, user_id="p1", trigger_at=T0 - timedelta(hours=1))
    loop_step(service)
    m = scrape(client)
    assert m.get("scheduler_events_failed_total{event_type=commitment_reminder}", 0) == 0
    assert m.get("scheduler_events_dispatched_total{event_type=commitment_reminder}", 0) == 0
    clock.set(QUIET_ENDS + timedelta(seconds=90))
    loop_step(service)
    m = scrape(client)
    assert m["scheduler_events_dispatched_total{event_type=commitment_reminder}"] == 1
    assert m["scheduler_event_lateness_seconds_sum"] == 90


@pytest.mark.clause("QUIET-3")
def test_a_held_row_whose_expiry_comes_first_ends_expired_never_sent(
        client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock) -> None:
    """QUIET-3: expires_at before not_before: the first claim after expires_at ends it expired."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    body = {"event_type": "commitment_reminder", "user_id": "p1", "trigger_at": (T0 - timedelta(minutes=1)).isoformat(),
            "expires_at": (T0 + timedelta(minutes=30)).isoformat(), "facts": reminder_facts()}
    row = client.post("/admin/scheduled-events", headers=INGEST, json=body).json()
    assert service.scheduler.poll_once().held == 1
    clock.set(QUIET_ENDS)
    report = service.scheduler.poll_once()
    assert [o.id for o in report.expired] == [row["id"]]
    assert event_row(engine, row["id"])["status"] == "expired"
    assert rows(engine, "SELECT id FROM notifications") == []


@pytest.mark.clause("DEC-LOCAL-TIME")
@pytest.mark.clause("QUIET-3")
def test_the_claim_takes_rows_by_due_at_so_a_held_row_waits_behind_rows_due_before_its_end(
        client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock) -> None:
    """QUIET-3: the claim orders by (due_at, id): a held row sits at its not_before; without
    holds due_at is trigger_at, REQ-0065's order."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    held = post_event(client, user_id="p1", trigger_at=T0 - timedelta(hours=1))
    service.scheduler.poll_once()
    later = post_event(client, user_id="p2", trigger_at=QUIET_ENDS - timedelta(minutes=10))
    clock.set(QUIET_ENDS)
    one = Scheduler(service.database, service.dispatcher, clock, batch_size=1, name="one")
    assert [o.id for o in one.poll_once().outcomes] == [later["id"]]
    assert [o.id for o in one.poll_once().outcomes] == [held["id"]]


# -- QUIET-5: what releases a hold -----------------------------------------------------------


@pytest.mark.clause("QUIET-5")
def test_a_change_of_zone_or_quiet_hours_a_repost_by_key_and_a_reset_clear_not_before(
        client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock) -> None:
    """QUIET-5: each re-arms the row: decided afresh at the next claim. A PUT that leaves the
    zone and quiet hours as they were keeps the hold."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    keyed = post_event(client, user_id="p1", trigger_at=T0 - timedelta(minutes=2), external_key="k")
    plain = post_event(client, user_id="p1", trigger_at=T0 - timedelta(minutes=1))
    service.scheduler.poll_once()
    assert [event_row(engine, r["id"])["not_before"] for r in (keyed, plain)] == [QUIET_ENDS, QUIET_ENDS]
    put_preferences(client, "p1", max_per_day=5, **BERLIN_QUIET)
    assert event_row(engine, plain["id"])["not_before"] == QUIET_ENDS
    post_event(client, user_id="p1", trigger_at=T0 - timedelta(minutes=2), external_key="k")
    assert event_row(engine, keyed["id"])["not_before"] is None
    put_preferences(client, "p1", time_zone="Europe/Berlin", quiet_hours={"start": "09:00", "end": "11:00"})
    assert event_row(engine, plain["id"])["not_before"] is None
    assert service.scheduler.poll_once().held == 2  # decided again: 11:00 Berlin is 10:00 UTC
    assert event_row(engine, plain["id"])["not_before"] == QUIET_ENDS - timedelta(hours=1)
    clock.set(QUIET_ENDS)
    assert service.scheduler.poll_once().dispatched == 2
    reset = client.post(f"/admin/scheduled-events/{plain['id']}/reset", headers=ADMIN)
    assert reset.status_code == 200, reset.text
    assert reset.json()["not_before"] is None


# -- QUIET-6: a zone that no longer loads ----------------------------------------------------


@pytest.mark.clause("QUIET-6")
def test_a_stored_zone_that_no_longer_loads_fails_that_participants_events_alone(
        client: TestClient, service: SchedulerService, engine: Engine) -> None:
    """QUIET-6: the message in last_error; the batch's other participants are decided."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    with engine.begin() as conn:  # as a tz database upgrade that dropped the name would leave it
        conn.execute(text("UPDATE participant_preferences SET time_zone = 'Gone/Away' WHERE user_id = 'p1'"))
    broken = post_event(client, user_id="p1", trigger_at=T0 - timedelta(minutes=1))
    fine = post_event(client, user_id="p2", trigger_at=T0 - timedelta(minutes=1))
    service.scheduler.poll_once()
    failed = event_row(engine, broken["id"])
    assert failed["status"] == "failed" and "Gone/Away" in failed["last_error"]
    assert event_row(engine, fine["id"])["status"] == "dispatched"


# -- QUIET-4: the cap's day --------------------------------------------------------------------


@pytest.mark.clause("DEC-LOCAL-TIME")
@pytest.mark.clause("QUIET-4")
def test_the_cap_counts_the_participants_local_day_not_the_utc_day(client: TestClient, clock: ManualClock) -> None:
    """QUIET-4: at 23:30 UTC it is 00:30 the next day in Berlin: a new day, a new cap."""
    put_preferences(client, "p1", max_per_day=1, time_zone="Europe/Berlin")
    clock.set(datetime(2026, 11, 30, 22, 30, tzinfo=UTC))  # 23:30 on the 30th in Berlin
    assert live(client, "2026-10-01").status_code == 200
    clock.set(datetime(2026, 11, 30, 23, 30, tzinfo=UTC))  # 00:30 on the 1st: the same UTC day
    assert live(client, "2026-10-02").status_code == 200
    clock.set(datetime(2026, 12, 1, 22, 59, tzinfo=UTC))  # 23:59 on the 1st
    assert live(client, "2026-10-03").status_code == 202


@pytest.mark.clause("QUIET-4")
def test_the_cap_day_of_a_fall_back_has_25_hours(client: TestClient, engine: Engine, clock: ManualClock) -> None:
    """QUIET-4: Berlin's 2026-10-25 runs from 22:00 UTC on the 24th to 23:00 UTC on the 25th."""
    put_preferences(client, "p1", max_per_day=1, time_zone="Europe/Berlin")
    clock.set(datetime(2026, 10, 24, 22, 0, tzinfo=UTC))  # 00:00 CEST on the 25th
    assert live(client, "2026-10-01").status_code == 200
    clock.set(datetime(2026, 10, 25, 22, 59, tzinfo=UTC))  # 23:59 CET, 24 h 59 min later: the same day
    assert live(client, "2026-10-02").status_code == 202
    clock.set(datetime(2026, 10, 25, 23, 0, tzinfo=UTC))  # 00:00 on the 26th
    assert live(client, "2026-10-03").status_code == 200
    reasons = [r["reason"] for r in rows(engine, "SELECT reason FROM notifications ORDER BY created_at")]
    assert reasons == [None, "rate_limited", None]


# -- QUIET-7: a live event in quiet hours --------------------------------------------------------


@pytest.mark.clause("QUIET-7")
def test_a_live_event_in_quiet_hours_is_deferred_into_a_scheduled_row_dispatched_when_they_end(
        client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock) -> None:
    """QUIET-7: 202 deferred with the row's id and not_before; the row (trigger_at the arrival,
    the same facts) is the one path's (REQ-0066): dispatched at not_before as a scheduled one."""
    put_preferences(client, "p1", **BERLIN_QUIET)
    response = live(client, "2026-11-30")
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["outcome"] == "deferred" and answer["not_before"] == QUIET_ENDS.isoformat()
    row = event_row(engine, answer["scheduled_event_id"])
    assert (row["status"], row["trigger_at"], row["not_before"]) == ("pending", T0, QUIET_ENDS)
    assert row["facts"] == reminder_facts("2026-11-30") and row["user_id"] == "p1"
    assert rows(engine, "SELECT id FROM notifications") == []
    assert service.scheduler.poll_once().claimed == 0
    clock.set(QUIET_ENDS)
    assert service.scheduler.poll_once().dispatched == 1
    [note] = rows(engine, "SELECT status, source, scheduled_event_id FROM notifications")
    assert note == {"status": "sent", "source": "scheduled", "scheduled_event_id": row["id"]}
