"""EXP — a reminder past its usefulness ends ``expired``, not late (specs/lifecycle.md).

In our words: a scheduled event may carry ``expires_at`` (after ``trigger_at``, in the same
range; else a 422 naming the field). A row claimed after it, by the service's clock, is not
dispatched: the claim ends it ``expired`` (no notification, no delivery, no dedup key), its
history says when and how late, and no claim takes it again; a cancel answers 409, a re-post
by key or a reset re-arms it. ``SCHEDULER_DEFAULT_EXPIRY_SECONDS`` stores a default
``expires_at`` (``trigger_at`` plus the window) on rows stored without one; unset (the
default), nothing expires. Expired rows take no batch slot (DEC-EXPIRY) and are kept as long
as dispatched ones.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.core.pacing import polls_again_at_once
from scheduler.service import SchedulerService
from scheduler.types import EventOutcome, PollReport, SchedulerMode
from tests.conftest import ADMIN, INGEST, T0, TEST_SECRET
from tests.helpers import event_body, event_row, later, post_event, rows, statuses
from tests.operations.support import loop_step, scrape, sign_in


def post(client: TestClient, **body: Any) -> Any:
    expires_at = body.pop("expires_at", None)
    payload = event_body(**body)
    if expires_at is not None:
        payload["expires_at"] = expires_at.isoformat() if hasattr(expires_at, "isoformat") else expires_at
    return client.post("/admin/scheduled-events", headers=INGEST, json=payload)


def stored(client: TestClient, **body: Any) -> dict[str, Any]:
    response = post(client, **body)
    assert response.status_code == 201, response.text
    row: dict[str, Any] = response.json()
    return row


def effects(engine: Engine, event_id: str) -> tuple[int, int, int]:
    """Notifications and deliveries of the row, and every dedup key there is."""
    notes = rows(engine, "SELECT id FROM notifications WHERE scheduled_event_id = :id", id=event_id)
    deliveries = rows(engine, "SELECT d.id FROM deliveries AS d JOIN notifications AS n ON n.id = d.notification_id "
                              "WHERE n.scheduled_event_id = :id", id=event_id)
    keys = rows(engine, "SELECT key FROM dedup_keys")
    return len(notes), len(deliveries), len(keys)


@pytest.mark.clause("EXP-1")
def test_an_expiry_is_stored_and_shown_with_the_row(client: TestClient, engine: Engine) -> None:
    """EXP-1: expires_at after trigger_at is stored and answered; without one the row has none."""
    row = stored(client, expires_at=T0 + timedelta(hours=3))
    assert row["expires_at"] == (T0 + timedelta(hours=3)).isoformat()
    assert event_row(engine, row["id"])["expires_at"] == T0 + timedelta(hours=3)
    assert stored(client, user_id="p-2")["expires_at"] is None


@pytest.mark.clause("EXP-1")
@pytest.mark.parametrize("expires_at", [T0, T0 - timedelta(seconds=1), "2026-11-30T12:00:00", "9999-06-01T00:00:00Z",
                                        1764500000, "soon"])
def test_an_expiry_not_after_the_trigger_or_out_of_range_is_a_422_naming_it(
        client: TestClient, engine: Engine, expires_at: Any) -> None:
    """EXP-1: at or before trigger_at, naive, past the storable range, a number, not a time: 422 on expires_at."""
    response = post(client, expires_at=expires_at)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["expires_at"]
    assert statuses(engine) == {}


@pytest.mark.clause("EXP-2")
def test_a_row_claimed_after_its_expiry_ends_expired_with_no_effect_and_its_history_says_how_late(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-2: claimed 2h 3m after expires_at: expired, no notification, delivery or dedup key;
    the history's entry is at the claim's time and last_error says how late."""
    row = stored(client, expires_at=T0 + timedelta(hours=1))
    clock.advance(timedelta(hours=3, minutes=3))
    report = service.scheduler.poll_once()
    assert (report.claimed, report.dispatched, [o.id for o in report.expired]) == (0, 0, [row["id"]])
    after = event_row(engine, row["id"])
    assert (after["status"], after["dispatched_at"], after["updated_at"]) == ("expired", None, clock.now())
    assert after["last_error"] == "expired: claimed 2h 3m after its expires_at 2026-11-30T10:00:00Z"
    assert effects(engine, row["id"]) == (0, 0, 0)
    history = client.get(f"/admin/scheduled-events/{row['id']}/history", headers=ADMIN).json()
    assert [(h["change"], h["status"]) for h in history] == [("stored", "pending"), ("expired", "expired")]
    assert history[-1]["at"] == clock.now().isoformat()
    assert history[-1]["changes"]["last_error"] == [None, after["last_error"]]
    clock.advance(timedelta(days=1))
    again = service.scheduler.poll_once()
    assert (again.claimed, again.expired) == (0, ())
    assert event_row(engine, row["id"])["updated_at"] == after["updated_at"]


@pytest.mark.clause("EXP-2")
def test_a_row_claimed_at_or_before_its_expiry_is_dispatched_as_ever(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-2: "after" is strict: claimed exactly at expires_at, the row is dispatched and notifies."""
    row = stored(client, expires_at=T0 + timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    report = service.scheduler.poll_once()
    assert (report.dispatched, report.expired) == (1, ())
    assert event_row(engine, row["id"])["status"] == "dispatched"
    assert effects(engine, row["id"])[0] == 1


@pytest.mark.clause("EXP-2")
def test_days_late_reads_in_days_hours_minutes_and_seconds(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-2: the lateness text for 3 days 4 h 5 s, and for under a minute."""
    slow = stored(client, expires_at=T0 + timedelta(minutes=10))
    quick = stored(client, user_id="p-2", trigger_at=T0 + timedelta(days=3), expires_at=T0 + timedelta(days=3, hours=4))
    clock.advance(timedelta(days=3, hours=4, minutes=10, seconds=5))
    service.scheduler.poll_once()
    assert event_row(engine, slow["id"])["last_error"].startswith("expired: claimed 3d 4h 5s after")
    assert event_row(engine, quick["id"])["last_error"].startswith("expired: claimed 10m 5s after")


@pytest.mark.clause("EXP-3")
def test_cancelling_an_expired_row_is_a_409_and_it_stays_expired(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-3: as for dispatched: 409 with the row, which stays expired."""
    row = stored(client, external_key="k-1", expires_at=T0 + timedelta(minutes=5))
    clock.advance(later())
    service.scheduler.poll_once()
    for path in (f"/admin/scheduled-events/{row['id']}", "/admin/scheduled-events/by-key/k-1"):
        response = client.delete(path, headers=INGEST)
        assert response.status_code == 409, response.text
        assert response.json()["event"]["status"] == "expired"
        assert "expired" in response.json()["detail"]
    assert event_row(engine, row["id"])["status"] == "expired"


@pytest.mark.clause("EXP-4")
def test_a_repost_by_key_rearms_an_expired_row_with_its_new_expiry(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-4: the re-post's trigger_at and expires_at (or none) replace the old; the row is dispatched."""
    row = stored(client, external_key="k-1", expires_at=T0 + timedelta(minutes=5))
    clock.advance(later())
    service.scheduler.poll_once()
    again = stored(client, external_key="k-1", trigger_at=clock.now(), expires_at=clock.now() + timedelta(hours=1))
    assert (again["id"], again["status"], again["last_error"]) == (row["id"], "pending", None)
    assert service.scheduler.poll_once().dispatched == 1
    assert event_row(engine, row["id"])["status"] == "dispatched"


@pytest.mark.clause("EXP-4")
def test_a_reset_rearms_an_expired_row_and_its_expiry_still_holds(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-4: a reset makes it pending and clears last_error; the sender's expiry stays, so the
    next claim ends it expired again (an operator's reset never sends a useless reminder)."""
    row = stored(client, expires_at=T0 + timedelta(minutes=5))
    clock.advance(later())
    service.scheduler.poll_once()
    reset = client.post(f"/admin/scheduled-events/{row['id']}/reset", headers=ADMIN)
    assert reset.status_code == 200, reset.text
    assert (reset.json()["status"], reset.json()["last_error"]) == ("pending", None)
    clock.advance(timedelta(minutes=1))
    report = service.scheduler.poll_once()
    assert (report.dispatched, [o.id for o in report.expired]) == (0, [row["id"]])
    assert effects(engine, row["id"]) == (0, 0, 0)


@pytest.fixture
def windowed(engine: Engine, clock: ManualClock) -> SchedulerService:
    settings = Settings(jwt_secret=TEST_SECRET, batch_size=20, default_expiry_seconds=7200)
    return SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)


@pytest.mark.clause("EXP-5")
def test_the_default_window_is_stored_from_trigger_at_and_a_sender_expiry_wins(
        windowed: SchedulerService, engine: Engine) -> None:
    """EXP-5: trigger_at + SCHEDULER_DEFAULT_EXPIRY_SECONDS, measured from the trigger (not from now)."""
    with TestClient(windowed.app) as client:
        later_row = stored(client, trigger_at=T0 + timedelta(days=2))
        own = stored(client, user_id="p-2", expires_at=T0 + timedelta(minutes=1))
    assert event_row(engine, later_row["id"])["expires_at"] == T0 + timedelta(days=2, hours=2)
    assert event_row(engine, own["id"])["expires_at"] == T0 + timedelta(minutes=1)


@pytest.mark.clause("EXP-5")
def test_changing_the_window_rewrites_no_stored_row(
        windowed: SchedulerService, engine: Engine, clock: ManualClock) -> None:
    """EXP-5: a service with another window (or none) keeps the stored expiry and expires by it."""
    with TestClient(windowed.app) as client:
        row = stored(client)
    other = SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=engine, clock=clock, run_scheduler=False)
    clock.advance(timedelta(hours=3))
    assert [o.id for o in other.scheduler.poll_once().expired] == [row["id"]]


@pytest.mark.clause("EXP-5")
def test_a_default_window_past_the_range_is_a_422_naming_trigger_at(windowed: SchedulerService, engine: Engine) -> None:
    """EXP-5: the sum is bounded like trigger_at: 422 naming trigger_at, nothing stored."""
    with TestClient(windowed.app) as client:
        response = post(client, trigger_at="9998-12-31T23:00:00Z")
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["trigger_at"]
    assert statuses(engine) == {}


@pytest.mark.clause("EXP-5")
@pytest.mark.parametrize(("raw", "refusal"), [
    ("1e-7", "must be a whole number, got '1e-7'"),
    ("0.5", "must be a whole number, got '0.5'"),
    ("0", "must be at least 1, got 0"),
    ("3153600001", "must be at most 3153600000, got 3153600001"),
])
def test_a_default_window_below_a_second_or_not_whole_is_refused_when_the_settings_are_read(
        raw: str, refusal: str) -> None:
    """EXP-5: the window is whole seconds, at least 1 (and at most a century): a window that
    rounds to nothing would store ``expires_at`` equal to ``trigger_at``, which the table's
    check refuses, making every store without ``expires_at`` a 500."""
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SCHEDULER_DEFAULT_EXPIRY_SECONDS": raw})
    assert str(refused.value) == f"SCHEDULER_DEFAULT_EXPIRY_SECONDS {refusal}"


@pytest.mark.clause("EXP-5")
def test_the_smallest_default_window_one_second_is_stored(engine: Engine, clock: ManualClock) -> None:
    """EXP-5: ``SCHEDULER_DEFAULT_EXPIRY_SECONDS=1`` stores ``trigger_at`` plus one second."""
    settings = Settings.from_env({"SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_DEFAULT_EXPIRY_SECONDS": "1"})
    with TestClient(SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False).app) as client:
        row = stored(client)
    assert event_row(engine, row["id"])["expires_at"] == T0 + timedelta(seconds=1)


@pytest.mark.clause("EXP-5")
@pytest.mark.clause("DEC-EXPIRY")
def test_without_a_window_nothing_expires_however_late(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-5: off by default: REQ-0065's literal behaviour, a row a year late is dispatched."""
    assert Settings().default_expiry_seconds is None
    row = post_event(client)
    clock.advance(timedelta(days=365))
    assert service.scheduler.poll_once().dispatched == 1
    assert event_row(engine, row["id"])["status"] == "dispatched"


@pytest.mark.clause("EXP-6")
@pytest.mark.clause("DEC-EXPIRY")
def test_expired_rows_take_no_batch_slot(
        engine: Engine, clock: ManualClock) -> None:
    """EXP-6, DEC-EXPIRY: with batch size 3, one poll dispatches the 3 rows still worth sending and
    ends the 3 older expired rows expired."""
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET, batch_size=3), engine=engine, clock=clock,
                               run_scheduler=False)
    with TestClient(service.app) as client:
        doomed = [stored(client, user_id=f"old-{i}", expires_at=T0 + timedelta(minutes=1))["id"] for i in range(3)]
        fresh = [stored(client, user_id=f"new-{i}", trigger_at=T0 + timedelta(minutes=30))["id"] for i in range(3)]
    clock.advance(later())
    report = service.scheduler.poll_once()
    assert sorted(o.id for o in report.expired) == sorted(doomed)
    assert sorted(o.id for o in report.outcomes if o.status == "dispatched") == sorted(fresh)


def one_expired(client: TestClient, service: SchedulerService, clock: ManualClock) -> str:
    """One row ended expired (and one dispatched beside it); the expired row's id."""
    row = stored(client, expires_at=T0 + timedelta(minutes=5))
    stored(client, user_id="p-fine")
    clock.advance(later())
    loop_step(service)
    return str(row["id"])


@pytest.mark.clause("EXP-7")
def test_expired_shows_in_the_api_filter_the_console_and_the_cli(
        client: TestClient, service: SchedulerService, clock: ManualClock, database_url: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """EXP-7: ?status=expired lists it; the console's overview counts it, its filter offers it and
    its event page shows expires_at; `scheduler events list --status expired` lists it."""
    expired_id = one_expired(client, service, clock)
    listed = client.get("/admin/scheduled-events?status=expired", headers=ADMIN)
    assert [r["id"] for r in listed.json()] == [expired_id], listed.text
    sign_in(client)
    overview = client.get("/console").text
    assert re.search(r'data-field="counts.expired">1<', overview), overview
    events_page = client.get("/console/events?status=expired").text
    assert '<option value="expired" selected>' in events_page and expired_id in events_page
    assert "expires_at" in client.get(f"/console/events/{expired_id}").text
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["events", "list", "--status", "expired", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [expired_id]


@pytest.mark.clause("EXP-7")
def test_expired_is_counted_by_event_type_in_the_metrics_and_the_health(
        client: TestClient, service: SchedulerService, clock: ManualClock) -> None:
    """EXP-7: scheduler_events_expired_total{event_type}, and the loop's health counts it; no lateness observed."""
    one_expired(client, service, clock)
    m = scrape(client)
    assert m["scheduler_events_expired_total{event_type=commitment_reminder}"] == 1
    assert m["scheduler_events_dispatched_total{event_type=commitment_reminder}"] == 1
    assert m["scheduler_event_lateness_seconds_count"] == 1
    assert client.get("/health/scheduler").json()["expired"] == 1


@pytest.mark.clause("EXP-8")
def test_expired_rows_are_kept_as_long_as_dispatched_ones(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine) -> None:
    """EXP-8: 29 days on both stay; 31 days on both go, with their history."""
    expired_id = one_expired(client, service, clock)
    clock.advance(timedelta(days=29))
    report = service.retention.run_if_due()
    assert report is not None and report.deleted == 0
    clock.advance(timedelta(days=2))
    report = service.retention.run_if_due()
    assert report is not None and report.deleted == 2
    assert statuses(engine) == {}
    assert rows(engine, "SELECT id FROM scheduled_event_history WHERE event_id = :id", id=expired_id) == []


@pytest.mark.clause("EXP-2")
@pytest.mark.clause("EXP-6")
def test_expired_rows_beyond_one_claims_bound_are_never_dispatched_and_the_next_claim_ends_them(
        engine: Engine, clock: ManualClock) -> None:
    """EXP-2, EXP-6: batch size 2 and three expired rows: the first claim ends two expired and
    dispatches none (the third waits, still pending), the next ends the third."""
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET, batch_size=2), engine=engine, clock=clock,
                               run_scheduler=False)
    with TestClient(service.app) as client:
        doomed = [stored(client, user_id=f"old-{i}", expires_at=T0 + timedelta(minutes=i + 1))["id"] for i in range(3)]
    clock.advance(later())
    first = service.scheduler.poll_once()
    # the two that expired first (the claim ends them in expiry order; the report lists them by trigger)
    assert (first.claimed, sorted(o.id for o in first.expired)) == (0, sorted(doomed[:2]))
    assert statuses(engine)[doomed[2]] == "pending"
    second = service.scheduler.poll_once()
    assert (second.claimed, [o.id for o in second.expired]) == (0, doomed[2:])
    assert effects(engine, doomed[2]) == (0, 0, 0)


@pytest.mark.clause("EXP-6")
@pytest.mark.clause("DEC-EXPIRY")
def test_a_prompt_mode_claim_that_ended_a_full_batch_of_expired_rows_polls_again_at_once() -> None:
    """EXP-6, DEC-EXPIRY: a backlog of expired rows drains without an interval between claims in
    prompt mode; literal mode keeps REQ-0065's interval."""
    ended = tuple(EventOutcome.expired(f"e{i}", "reminder", T0, "expired: claimed 1s after its expires_at", T0)
                  for i in range(3))
    report = PollReport(claimed=0, outcomes=(), expired=ended)
    assert polls_again_at_once(SchedulerMode.PROMPT, 3, report)
    assert not polls_again_at_once(SchedulerMode.PROMPT, 4, report)
    assert not polls_again_at_once(SchedulerMode.LITERAL, 3, report)


@pytest.mark.clause("EXP-3")
@pytest.mark.clause("EXP-7")
def test_the_console_and_the_cli_refuse_to_cancel_an_expired_row(
        client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine, database_url: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """EXP-3, EXP-7: the console's cancel answers 409 saying why; `scheduler events cancel` exits 1."""
    expired_id = one_expired(client, service, clock)
    csrf = sign_in(client)
    response = client.post(f"/console/events/{expired_id}/cancel", data={"csrf": csrf, "reason": "too late"})
    assert response.status_code == 409 and "already expired" in response.text, response.text
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["events", "cancel", expired_id]) == 1
    assert "already expired" in capsys.readouterr().err
    assert event_row(engine, expired_id)["status"] == "expired"
