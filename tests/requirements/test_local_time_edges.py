"""A participant's own time at its edges (QUIET-8 to QUIET-10): a stored zone that no longer
loads on the live path, a held live event whose default expiry would pass the storable
range, and a fuzz of both event routes over zones and clocks near the range's ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.trigger_range import EARLIEST_TRIGGER, LATEST_TRIGGER
from scheduler.web.app import SchedulerService
from tests.conftest import ADMIN, INGEST, TEST_SECRET
from tests.helpers import event_row, reminder_facts, rows

CENTURY = 100 * 365 * 86400  # the largest SCHEDULER_DEFAULT_EXPIRY_SECONDS (config.py)
ODD_ZONES = ("UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu", "Australia/Lord_Howe",
             "Europe/Berlin", "America/New_York", "America/St_Johns", "Antarctica/Troll", "Pacific/Apia")


def live_body(user_id: str, day: str) -> dict[str, Any]:
    return {"event_type": "t", "user_id": user_id, "facts": reminder_facts(day)}


@pytest.fixture
def century_clock() -> ManualClock:
    return ManualClock(datetime(9950, 6, 1, 12, 0, tzinfo=UTC))


@pytest.fixture
def century_client(engine: Engine, century_clock: ManualClock) -> Iterator[TestClient]:
    """A service whose default expiry window is the largest allowed (a century)."""
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET, default_expiry_seconds=CENTURY),
                               engine=engine, clock=century_clock, run_scheduler=False)
    with TestClient(service.app, raise_server_exceptions=True) as client:
        yield client


# -- QUIET-8: a stored zone that no longer loads, on the live path -----------------------------


@pytest.mark.clause("QUIET-8")
def test_a_live_event_for_a_participant_whose_stored_zone_no_longer_loads_is_a_409_naming_it(
        client: TestClient, engine: Engine) -> None:
    """QUIET-8: the zone was valid when stored; a tz database upgrade dropped the name (written
    here straight to the row). The live answer is a 409 naming the zone, nothing is written,
    and another participant's event is decided as before."""
    assert client.put("/admin/participants/p1/preferences", headers=ADMIN,
                      json={"max_per_day": 3, "time_zone": "Europe/Berlin"}).status_code == 200
    with engine.begin() as conn:
        conn.execute(text("UPDATE participant_preferences SET time_zone = 'Gone/Away' WHERE user_id = 'p1'"))
    response = client.post("/admin/ingest-event", headers=INGEST, json=live_body("p1", "2026-11-30"))
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "time_zone" in detail and "Gone/Away" in detail and "'p1'" in detail
    assert rows(engine, "SELECT id FROM notifications") == []
    assert rows(engine, "SELECT id FROM scheduled_events") == []
    assert client.post("/admin/ingest-event", headers=INGEST, json=live_body("p2", "2026-11-30")).status_code == 200


# -- QUIET-9: a held live event's default expiry near the end of the range --------------------


@pytest.mark.clause("QUIET-9")
def test_a_held_live_event_whose_default_expiry_passes_the_range_expires_at_its_last_instant(
        century_client: TestClient, engine: Engine) -> None:
    """QUIET-9: in 9950 a century's window ends past 9999-01-01; the live event is still
    deferred (202), its row expiring at the range's last instant, not refused and not a 500."""
    assert century_client.put("/admin/participants/p1/preferences", headers=ADMIN,
                              json={"max_per_day": 3, "quiet_hours": {"start": "00:00", "end": "23:59"}}
                              ).status_code == 200
    response = century_client.post("/admin/ingest-event", headers=INGEST, json=live_body("p1", "9950-06-01"))
    assert response.status_code == 202, response.text
    row = event_row(engine, response.json()["scheduled_event_id"])
    assert row["expires_at"] == LATEST_TRIGGER - timedelta(microseconds=1)
    assert row["not_before"] == datetime(9950, 6, 1, 23, 59, tzinfo=UTC)


@pytest.mark.clause("QUIET-9")
def test_a_held_live_events_window_inside_the_range_is_its_arrival_plus_the_window(
        century_client: TestClient, century_clock: ManualClock, engine: Engine) -> None:
    """QUIET-9: a century before the range's end the window is kept whole."""
    century_clock.set(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    century_client.put("/admin/participants/p1/preferences", headers=ADMIN,
                       json={"max_per_day": 3, "quiet_hours": {"start": "00:00", "end": "23:59"}})
    response = century_client.post("/admin/ingest-event", headers=INGEST, json=live_body("p1", "2026-11-30"))
    assert response.status_code == 202, response.text
    row = event_row(engine, response.json()["scheduled_event_id"])
    assert row["expires_at"] == century_clock.now() + timedelta(seconds=CENTURY)


# -- QUIET-10: no 500 over zones and clocks near the range's ends ---------------------------------

NEAR_ENDS = st.one_of(
    st.datetimes(min_value=EARLIEST_TRIGGER.replace(tzinfo=None),
                 max_value=(EARLIEST_TRIGGER + timedelta(days=3)).replace(tzinfo=None)),
    st.datetimes(min_value=(LATEST_TRIGGER - timedelta(days=3)).replace(tzinfo=None),
                 max_value=(LATEST_TRIGGER - timedelta(microseconds=1)).replace(tzinfo=None)),
).map(lambda naive: naive.replace(tzinfo=UTC))
QUIET_HOURS = st.none() | st.tuples(st.integers(0, 23 * 60 + 59), st.integers(0, 23 * 60 + 59)).filter(
    lambda ends: ends[0] != ends[1]).map(lambda ends: {"start": f"{ends[0] // 60:02}:{ends[0] % 60:02}",
                                                      "end": f"{ends[1] // 60:02}:{ends[1] % 60:02}"})
# every answer the two routes document (docs/api.md); a 500 is none of them
LIVE_ANSWERS = {200, 202, 204, 400, 409, 422}
STORE_ANSWERS = {201, 422}


@pytest.fixture
def fuzz_clients(engine: Engine) -> Iterator[dict[int | None, tuple[TestClient, ManualClock]]]:
    """One service per default expiry window (none, a second, a day, a century), each on its clock."""
    made: dict[int | None, tuple[TestClient, ManualClock]] = {}
    opened: list[TestClient] = []
    try:
        for window in (None, 1, 86400, CENTURY):
            clock = ManualClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
            service = SchedulerService(Settings(jwt_secret=TEST_SECRET, default_expiry_seconds=window),
                                       engine=engine, clock=clock, run_scheduler=False)
            client = TestClient(service.app, raise_server_exceptions=True)
            client.__enter__()
            opened.append(client)
            made[window] = (client, clock)
        yield made
    finally:
        for client in opened:
            client.__exit__(None, None, None)


@pytest.mark.clause("QUIET-10")
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(zone=st.sampled_from(ODD_ZONES), quiet=QUIET_HOURS, now=NEAR_ENDS, trigger=NEAR_ENDS,
       window=st.sampled_from((None, 1, 86400, CENTURY)), offset_hours=st.integers(-12, 14))
@example(zone="Pacific/Kiritimati", quiet={"start": "00:00", "end": "23:59"},
         now=LATEST_TRIGGER - timedelta(minutes=1), trigger=LATEST_TRIGGER - timedelta(minutes=1),
         window=CENTURY, offset_hours=14)
@example(zone="Pacific/Pago_Pago", quiet={"start": "23:00", "end": "22:59"}, now=EARLIEST_TRIGGER,
         trigger=EARLIEST_TRIGGER, window=1, offset_hours=-11)
def test_no_zone_quiet_hours_or_instant_near_the_ends_of_the_range_makes_either_event_route_answer_500(
        fuzz_clients: dict[int | None, tuple[TestClient, ManualClock]], zone: str, quiet: dict[str, str] | None,
        now: datetime, trigger: datetime, window: int | None, offset_hours: int) -> None:
    """QUIET-10: whatever the participant's zone and quiet hours, the service's clock and the
    sender's trigger_at (in any offset) near either end of the storable range and the default
    expiry window, the live and the scheduled route answer one of their documented statuses."""
    client, clock = fuzz_clients[window]
    clock.set(now)
    put = client.put("/admin/participants/fuzz/preferences", headers=ADMIN,
                     json={"max_per_day": 3, "time_zone": zone, "quiet_hours": quiet})
    assert put.status_code == 200, put.text
    day = now.date().isoformat()
    live = client.post("/admin/ingest-event", headers=INGEST, json=live_body("fuzz", day))
    assert live.status_code in LIVE_ANSWERS, live.text
    sent_at = trigger.astimezone(UTC).astimezone(_fixed(offset_hours)) if _fits(trigger, offset_hours) else trigger
    stored = client.post("/admin/scheduled-events", headers=INGEST,
                         json={"event_type": "t", "user_id": "fuzz", "trigger_at": sent_at.isoformat(),
                               "facts": reminder_facts(day)})
    assert stored.status_code in STORE_ANSWERS, stored.text


def _fixed(hours: int) -> Any:
    from datetime import timezone

    return timezone(timedelta(hours=hours))


def _fits(instant: datetime, hours: int) -> bool:
    """Whether ``instant`` is representable in the fixed offset (year 1 to 9999 locally)."""
    try:
        instant.astimezone(_fixed(hours))
    except OverflowError:
        return False
    return True
