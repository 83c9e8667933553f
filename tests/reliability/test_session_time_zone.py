"""DEC-UTC — every session of the service runs in UTC, whatever the database's default zone.

A database set to another zone (``ALTER DATABASE ... SET TimeZone``, a server's
``timezone`` in postgresql.conf) hands times back in that zone: production's clock
(``SELECT clock_timestamp()``) came back as ``+14:00`` or ``-08:00``, the daily cap then
counted that zone's calendar day, and a row near the ends of the storable range could not
be read back. These tests run on a database whose default zone is the furthest east
(Pacific/Kiritimati, UTC+14) or a western one (America/Los_Angeles), directly and behind
``SCHEDULER_TRANSACTION_POOLING``, with production's clock reading the real database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial

import psycopg
import pytest
from sqlalchemy import Engine, make_url, text

from scheduler.config import Settings
from scheduler.core.clock import DatabaseClock
from scheduler.core.store import set_preferences, store_event
from scheduler.database.engine import database_time, make_engine
from scheduler.nudging.orchestrator import utc_day
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent
from tests.conftest import TEST_SECRET
from tests.helpers import reminder_facts, rows

ZONES = ["Pacific/Kiritimati", "America/Los_Angeles"]


def libpq(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(params=ZONES)
def zoned_database(request: pytest.FixtureRequest, database_url: str) -> Iterator[tuple[str, str]]:
    """This test's database with its default TimeZone set to a zone that is not UTC."""
    zone: str = request.param
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        assert name is not None
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET TimeZone = {}").format(
            psycopg.sql.Identifier(name[0]), psycopg.sql.Literal(zone)))
    with psycopg.connect(libpq(database_url)) as conn:  # control: a plain session is in that zone
        shown = conn.execute("SHOW TimeZone").fetchone()
        assert shown == (zone,)
    yield database_url, zone


def settings_for(pooling: bool) -> Settings:
    return Settings(jwt_secret=TEST_SECRET, transaction_pooling=pooling, lock_timeout_ms=0)


@pytest.mark.clause("DEC-UTC")
@pytest.mark.parametrize("pooling", [False, True], ids=["direct", "transaction-pooling"])
def test_every_service_session_runs_in_utc_and_the_database_clock_tells_utc(
    zoned_database: tuple[str, str], pooling: bool
) -> None:
    """DEC-UTC: on a database whose default zone is not UTC, the service's connections show
    TimeZone UTC (in a transaction and out of one), and production's clock tells aware UTC."""
    url, _ = zoned_database
    engine = make_engine(url, settings_for(pooling))
    try:
        with engine.begin() as conn:
            assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"
        server = database_time(engine)
        assert server.utcoffset() == timedelta(0)
        clock = DatabaseClock(partial(database_time, engine))
        clock.sync()
        assert clock.now().utcoffset() == timedelta(0)
    finally:
        engine.dispose()


@pytest.mark.clause("DEC-UTC")
def test_the_database_clock_tells_utc_whatever_zone_its_reading_came_in() -> None:
    """DEC-UTC: a reading in another zone (a connection not made by the service) is turned to UTC."""
    from zoneinfo import ZoneInfo

    reading = datetime(2026, 11, 30, 23, 30, tzinfo=ZoneInfo("Pacific/Kiritimati"))
    clock = DatabaseClock(lambda: reading, monotonic=lambda: 0.0)
    clock.sync()
    assert clock.now() == reading and clock.now().tzinfo is UTC
    assert utc_day(reading)[0] == datetime(2026, 11, 30, tzinfo=UTC)  # its UTC day, not Kiritimati's


def count_sent(engine: Engine, user: str) -> int:
    return len(rows(engine, "SELECT 1 FROM deliveries WHERE user_id = :u AND status = 'sent'", u=user))


@pytest.mark.clause("DEC-UTC")
@pytest.mark.clause("DEC-4")
@pytest.mark.parametrize("pooling", [False, True], ids=["direct", "transaction-pooling"])
def test_the_daily_cap_and_the_claim_count_the_utc_day_on_a_database_set_to_another_zone(
    zoned_database: tuple[str, str], pooling: bool
) -> None:
    """DEC-UTC, DEC-4: production's clock reads the real database (frozen at that reading). An
    earlier delivery is placed where the UTC day and the zone's day disagree; the cap (one a
    day) counts it exactly when it is in the UTC day. The same poll claims a row stored in
    year 1 (before the storable range existed), which a western session cannot even read."""
    url, zone = zoned_database
    engine = make_engine(url, settings_for(pooling))
    try:
        clock = DatabaseClock(partial(database_time, engine), monotonic=lambda: 0.0)
        service = SchedulerService(settings_for(pooling), engine=engine, clock=clock, run_scheduler=False)
        clock.sync()
        now = clock.now()
        utc_start = datetime.combine(now.astimezone(UTC).date(), datetime.min.time(), tzinfo=UTC)
        from zoneinfo import ZoneInfo

        local = now.astimezone(ZoneInfo(zone))
        zone_start = datetime.combine(local.date(), datetime.min.time(), tzinfo=ZoneInfo(zone)).astimezone(UTC)
        # an instant before now in exactly one of the two days
        earlier, in_utc_day = (utc_start, True) if utc_start < zone_start else (utc_start - timedelta(seconds=1), False)
        set_preferences(service.database, "capped", enabled_kinds=None, max_per_day=1, now=now)
        with service.sessions() as session:
            event = DigitalTwinEvent("commitment_reminder", "capped", "c-1", reminder_facts(day="2026-01-01"))
            service.dispatcher(session, event, earlier)
            session.commit()
        assert count_sent(engine, "capped") == 1
        stored = store_event(service.database, event_type="commitment_reminder", user_id="capped",
                             community_id="c-1", external_key=None, trigger_at=now - timedelta(minutes=1),
                             facts=reminder_facts(day="2026-01-02"), now=now)
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO scheduled_events (id, event_type, user_id, trigger_at, facts, status, created_at,"
                " updated_at) VALUES ('year-1', 'commitment_reminder', 'legacy', '0001-01-01T00:00:00Z',"
                " CAST(:facts AS jsonb), 'pending', :now, :now)"), {"facts": json.dumps(reminder_facts()), "now": now})
        report = service.scheduler.poll_once()
        assert sorted((o.id, o.status) for o in report.outcomes) == sorted(
            [(stored["id"], "dispatched"), ("year-1", "dispatched")])
        # capped: the second is suppressed exactly when the first was sent the same UTC day
        assert count_sent(engine, "capped") == (1 if in_utc_day else 2)
    finally:
        engine.dispose()
