"""REL-12: one clock in production, the database's (DEC-10).

A replica whose host clock is minutes off still claims, records and judges time by the
database server's clock: production's ``DatabaseClock`` measures the server's time and
never reads the host's wall clock after that. The host's skew here is an ``OffsetClock``
(the wall clock shifted, as libfaketime shifts a real process in
``python -m reliability clock-skew``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from freezegun import freeze_time
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.config import Settings
from scheduler.core.clock import ClockNotReady, DatabaseClock, ManualClock, OffsetClock, SystemClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.database.engine import database_time
from scheduler.database.queries import load_queries
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.rules import load_catalogue
from scheduler.operations.metrics import parse_exposition
from scheduler.service import SchedulerService
from tests.conftest import TEST_SECRET
from tests.reliability.support import statuses, store_due

SKEW = timedelta(minutes=5)


def skewed_clock(engine: Engine, skew: timedelta) -> DatabaseClock:
    """Production's clock on a host whose wall clock is ``skew`` off."""
    return DatabaseClock(partial(database_time, engine), host=OffsetClock(SystemClock(), skew))


@pytest.mark.clause("DEC-10")
@pytest.mark.clause("REL-12")
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["host-ahead", "host-behind"])
def test_the_production_clock_tells_the_database_time_whatever_the_host_clock_says(
    engine: Engine, skew: timedelta,
) -> None:
    """REL-12, DEC-10: after one reading, now() lies between two readings of the server's clock taken
    around it (it lags by at most a round trip, never leads), and the measured offset is the
    host's skew, whichever way it goes."""
    clock = skewed_clock(engine, skew)
    assert clock.now() - database_time(engine) > skew - timedelta(seconds=5)  # unsynced: the host's time
    offset = clock.sync()
    assert abs(offset + skew.total_seconds()) < 5.0
    for _ in range(20):
        before = database_time(engine)
        now = clock.now()
        after = database_time(engine)
        assert now <= after, "the clock leads the database's"
        assert now >= before - timedelta(seconds=1)


@pytest.mark.clause("DEC-10")
@pytest.mark.clause("REL-12")
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["host-ahead", "host-behind"])
def test_a_replica_with_a_skewed_host_clock_claims_and_records_by_the_database_clock(
    engine: Engine, skew: timedelta,
) -> None:
    """REL-12, DEC-10: with the host five minutes ahead, a row due in a minute by the database's
    clock is not claimed; with it five minutes behind, a row due a second ago is; the row's
    dispatched_at and updated_at are the database's time."""
    clock = skewed_clock(engine, skew)
    clock.sync()
    db_now = database_time(engine)
    [later] = store_due(engine, ["anna"], db_now + timedelta(minutes=1, seconds=1))
    [due] = store_due(engine, ["ben"], db_now)
    scheduler = Scheduler(Database(engine), NudgingPlatform(load_catalogue()), clock)
    before = database_time(engine)
    report = scheduler.poll_once()
    after = database_time(engine)
    assert [o.id for o in report.outcomes] == [due]
    assert statuses(engine) == {later: "pending", due: "dispatched"}
    outcome = report.outcomes[0]
    assert outcome.finished_at is not None and before <= outcome.finished_at <= after
    with engine.connect() as conn:
        row = conn.execute(text("SELECT dispatched_at, updated_at FROM scheduled_events WHERE id = :id"),
                           {"id": due}).one()
    assert before <= row.dispatched_at <= after and row.updated_at == row.dispatched_at


@pytest.mark.clause("REL-12")
@pytest.mark.clause("DEC-10")
def test_no_claim_is_judged_by_the_host_clock_before_the_database_clock_was_read(engine: Engine) -> None:
    """REL-12, DEC-10: until production's clock has read the database's time once (the
    database unreachable at start), a claim refuses and the poll fails; after the reading
    the same scheduler claims by the database's clock."""
    clock = skewed_clock(engine, SKEW)  # the host five minutes ahead
    [later] = store_due(engine, ["anna"], database_time(engine) + timedelta(minutes=1, seconds=1))
    scheduler = Scheduler(Database(engine), NudgingPlatform(load_catalogue()), clock)
    with pytest.raises(ClockNotReady):
        scheduler.poll_once()
    assert scheduler.poll_guarded(lambda: False) is None
    assert "ClockNotReady" in (scheduler.health.last_error or "")
    clock.sync()
    assert scheduler.poll_once().claimed == 0  # not due by the database's clock
    assert statuses(engine) == {later: "pending"}


@pytest.fixture
def production_service(engine: Engine) -> Iterator[SchedulerService]:
    """A service whose clock is production's, on a host 300 s behind the database."""
    clock = skewed_clock(engine, -timedelta(seconds=300))
    clock.warn_seconds = 1.0
    yield SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=engine, clock=clock, run_scheduler=False)


@pytest.mark.clause("REL-12")
def test_the_measured_offset_is_a_metric_and_in_the_health_details_and_warned_about_once(
    production_service: SchedulerService, caplog: pytest.LogCaptureFixture,
) -> None:
    """REL-12: scheduler_clock_offset_seconds and /health/scheduler's clock show the offset
    (the database minus the host: +300 s here); the log warns once, not at every reading."""
    caplog.set_level(logging.WARNING, logger="scheduler.core.clock")
    with TestClient(production_service.app) as client:  # the lifespan takes the first reading
        clock = production_service.clock
        assert isinstance(clock, DatabaseClock) and clock.synced
        clock.sync()
        samples = parse_exposition(client.get("/metrics").text)
        assert abs(samples["scheduler_clock_offset_seconds"] - 300.0) < 5.0
        details = client.get("/health/scheduler").json()["clock"]
        assert details["source"] == "database" and details["synced"] is True
        assert abs(details["offset_seconds"] - 300.0) < 5.0
    warnings = [r for r in caplog.records if "clock is" in r.getMessage()]
    assert len(warnings) == 1 and "behind the database's" in warnings[0].getMessage()


@pytest.mark.clause("DEC-10")
@pytest.mark.clause("REL-12")
def test_an_injected_clock_is_used_as_it_is_and_has_no_offset(service: SchedulerService, clock: ManualClock) -> None:
    """REL-12, DEC-10: tests and the simulation keep their injected clock: the service never
    replaces it, reports it as injected, and exports no offset for it."""
    assert service.clock is clock
    with TestClient(service.app) as client:
        assert client.get("/health/scheduler").json()["clock"]["source"] == "injected"
        assert "scheduler_clock_offset_seconds" not in client.get("/metrics").text


DATABASE_CLOCK_FUNCTIONS = re.compile(
    r"\b(now|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday)\s*\(|"
    r"\b(current_timestamp|current_date|current_time|localtimestamp|localtime)\b", re.IGNORECASE)
MIGRATIONS = Path(__file__).resolve().parents[2] / "src" / "scheduler" / "database" / "migrations"


@pytest.mark.clause("REL-12")
@pytest.mark.clause("DEC-10")
def test_no_scheduler_statement_reads_the_database_clock_but_the_clocks_own_reading() -> None:
    """REL-12, DEC-10: every statement binds :now from the injected clock, so a frozen clock
    controls every decision in the tests and the simulation; only ``database_clock``, which
    production's clock measures with, reads the server's time (nor do the migrations'
    triggers and defaults)."""
    readers = sorted(name for name, query in load_queries().items() if DATABASE_CLOCK_FUNCTIONS.search(query.sql))
    assert readers == ["database_clock"]
    for migration in sorted(MIGRATIONS.rglob("*.py")):
        assert not DATABASE_CLOCK_FUNCTIONS.search(migration.read_text()), migration.name


@pytest.mark.clause("REL-12")
def test_a_database_clock_needs_an_aware_server_time() -> None:
    """REL-12: a naive reading is refused rather than taken for UTC."""
    clock = DatabaseClock(lambda: datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.sync()


@pytest.mark.clause("DEC-10")
def test_the_cli_reset_and_cancel_record_the_database_time_whatever_the_host_clock_says(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
) -> None:
    """DEC-10: ``scheduler events reset`` and ``cancel`` run the application's audited commands
    with the database's time (``synced_database_clock``), not the host's: on a host three
    days ahead, the rows' ``updated_at`` and the audit trail's ``at`` are the server's now."""
    server_now = database_time(engine)
    reset_id, cancel_id = store_due(engine, ["ann", "bob"], server_now - timedelta(minutes=1))
    with engine.begin() as conn:
        conn.execute(text("UPDATE scheduled_events SET status = 'failed' WHERE id = :id"), {"id": reset_id})
    monkeypatch.setenv("DATABASE_URL", database_url)
    host = freeze_time(server_now + timedelta(days=3))
    host.start()
    request.addfinalizer(host.stop)
    assert main(["events", "reset", reset_id, "--reason", "retry"]) == 0
    assert main(["events", "cancel", cancel_id]) == 0
    after = database_time(engine)
    with engine.connect() as conn:
        rows = {r.id: r.updated_at for r in conn.execute(text("SELECT id, updated_at FROM scheduled_events"))}
        audited = conn.execute(text("SELECT at FROM operator_actions ORDER BY id")).scalars().all()
    assert len(audited) == 2
    for recorded in [rows[reset_id], rows[cancel_id], *audited]:
        assert server_now <= recorded <= after, (recorded, server_now, after)
