"""REL-9, REL-10: behind a real PgBouncer in transaction mode (Debian's ``pgbouncer``).

Each test that needs it starts its own PgBouncer (``pool_mode = transaction``) in front of the suite's
PostgreSQL and reaches the test's database only through it. Those are skipped, with the
reason, only where the pgbouncer package is not installed (``scripts/system-packages`` installs it in CI).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from reliability.pooler import PgBouncer, pgbouncer_binary
from sqlalchemy import Connection, Engine, make_url, text
from sqlalchemy.exc import OperationalError

from scheduler.cli import main
from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Batch
from scheduler.database.engine import make_engine
from scheduler.database.listener import Listener
from scheduler.service import SchedulerService
from scheduler.types import SchedulerMode
from tests.conftest import TEST_SECRET, PgServer
from tests.helpers import bounded
from tests.reliability.scenarios import run_small_scenario
from tests.reliability.support import statuses, store_due

needs_pgbouncer = pytest.mark.skipif(
    pgbouncer_binary() is None,
    reason="pgbouncer is not installed (Debian package pgbouncer; scripts/system-packages installs it)",
)


@pytest.fixture
def bouncer(pg_server: PgServer, tmp_path: Path) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode with two server connections, in front of the suite's server."""
    with PgBouncer(pg_server.host, tmp_path, server_port=pg_server.port, pool_size=2, user=pg_server.user,
                   password=pg_server.password) as running:
        yield running


def _through(bouncer: PgBouncer, database_url: str, settings: Settings, **kwargs: object) -> Engine:
    database = make_url(database_url).database
    assert database is not None
    return make_engine(bouncer.url(database), settings, **kwargs)


@pytest.mark.clause("REL-10")
def test_transaction_pooling_is_off_by_default_and_read_from_its_variable() -> None:
    """REL-10: SCHEDULER_TRANSACTION_POOLING is false unless set; a value that is not a boolean
    is refused naming the variable."""
    assert Settings.from_env({}).transaction_pooling is False
    assert Settings.from_env({"SCHEDULER_TRANSACTION_POOLING": "true"}).transaction_pooling is True
    with pytest.raises(ConfigError, match="SCHEDULER_TRANSACTION_POOLING"):
        Settings.from_env({"SCHEDULER_TRANSACTION_POOLING": "pgbouncer"})


@needs_pgbouncer
@pytest.mark.clause("REL-10")
def test_with_transaction_pooling_set_statements_repeat_across_server_sessions_and_the_timeouts_hold(
    bouncer: PgBouncer, database_url: str
) -> None:
    """REL-10: with SCHEDULER_TRANSACTION_POOLING two pooled connections take turns on PgBouncer's
    server sessions, each running the same statement far past psycopg's prepare threshold, and
    every transaction carries the configured statement and lock timeouts."""
    settings = Settings(transaction_pooling=True, statement_timeout_ms=4321, lock_timeout_ms=321)
    engine = _through(bouncer, database_url, settings, pool_size=2, max_overflow=0)
    try:
        with engine.connect() as first, engine.connect() as second:
            for n in range(12):
                for conn in (first, second):
                    row = conn.execute(text("SELECT current_setting('statement_timeout'), "
                                            "current_setting('lock_timeout'), CAST(:n AS int)"), {"n": n}).one()
                    conn.commit()
                    assert tuple(row) == ("4321ms", "321ms", n)
    finally:
        engine.dispose()


@needs_pgbouncer
@pytest.mark.clause("REL-10")
def test_behind_transaction_pooling_a_lock_wait_still_ends_at_the_lock_timeout(
    bouncer: PgBouncer, database_url: str, engine: Engine
) -> None:
    """REL-10: the per-transaction lock timeout really bounds a wait: with the table locked by an
    operator (directly on PostgreSQL), a claim-like read through PgBouncer fails with a lock
    timeout instead of waiting."""
    through = _through(bouncer, database_url, Settings(transaction_pooling=True, lock_timeout_ms=200))
    operator: Connection = engine.connect()
    try:
        operator.execute(text("LOCK TABLE scheduled_events IN ACCESS EXCLUSIVE MODE"))

        def read() -> str:
            try:
                with through.begin() as conn:
                    conn.execute(text("SELECT count(*) FROM scheduled_events"))
            except OperationalError as exc:
                return str(exc.orig)
            return "no error"

        assert "lock timeout" in bounded(read, 30, "a read behind a locked table")
    finally:
        operator.rollback()
        operator.close()
        through.dispose()


@needs_pgbouncer
@pytest.mark.clause("REL-10")
def test_without_the_setting_a_pgbouncer_refusal_is_a_configuration_error_naming_it(
    bouncer: PgBouncer, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """REL-10: `scheduler migrate` pointed at PgBouncer without SCHEDULER_TRANSACTION_POOLING exits 2
    with an error that names the setting (PgBouncer refuses the `options` startup parameter)."""
    database = make_url(database_url).database
    assert database is not None
    for name in [n for n in os.environ if n.startswith("SCHEDULER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", bouncer.conninfo(database))
    assert main(["migrate"]) == 2
    error = capsys.readouterr().err
    assert "unsupported startup parameter" in error and "SCHEDULER_TRANSACTION_POOLING=true" in error


@needs_pgbouncer
@pytest.mark.clause("REL-9")
def test_the_listener_probe_finds_listen_unusable_behind_transaction_pooling(
    bouncer: PgBouncer, database_url: str
) -> None:
    """REL-9: through PgBouncer in transaction mode the listener's probe NOTIFY never comes back,
    so it reports LISTEN unavailable with the reason (timed wake-ups follow)."""
    engine = _through(bouncer, database_url, Settings(transaction_pooling=True))
    database = make_url(database_url).database
    assert database is not None
    listener = Listener(bouncer.conninfo(database), name="behind-pgbouncer", probe_engine=engine, probe_seconds=0.5)
    listener.subscribe("scheduler_due", lambda payload: None)
    try:
        listener.start(wait_seconds=10)
        assert listener.connects >= 1
        assert listener.available is False
        assert listener.reason is not None and (
            "did not come back" in listener.reason or "changes backend" in listener.reason)
    finally:
        listener.stop()
        engine.dispose()


@pytest.mark.clause("REL-9")
def test_without_listen_a_row_falling_due_during_a_poll_is_polled_for_at_once(
    engine: Engine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REL-9: on timed wake-ups the next wake comes from the pending index, read after the poll.
    A row that falls due after the poll's claim but before that read (the clock moves on while
    the poll runs) is polled for at once, not one whole interval later (found by the scenario:
    a reminder about one in ten arrived SCHEDULER_POLL_SECONDS late)."""
    settings = Settings(jwt_secret=TEST_SECRET, poll_seconds=30.0, mode=SchedulerMode.PROMPT, listen=False)
    scheduler = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False).scheduler
    due = clock.now() + timedelta(milliseconds=5)
    (event_id,) = store_due(engine, ["falls-due-mid-poll"], due + timedelta(seconds=1))
    claim = scheduler.claim

    def claim_while_time_passes() -> Batch:
        batch = claim()
        clock.advance(timedelta(milliseconds=10))  # the poll takes 10 ms: the row falls due meanwhile
        return batch

    monkeypatch.setattr(scheduler, "claim", claim_while_time_passes)
    report = scheduler.poll_guarded(lambda: False)
    assert report is not None and report.claimed == 0
    assert scheduler.next_due == due
    assert scheduler.wait_seconds(time.monotonic() + settings.poll_seconds) == 0
    monkeypatch.undo()
    scheduler.poll_guarded(lambda: False)
    assert statuses(engine) == {event_id: "dispatched"}


@needs_pgbouncer
@pytest.mark.clause("REL-9")
def test_a_small_pgbouncer_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-9: `python -m reliability pgbouncer` (300 events, 2 prompt-mode replicas behind a real
    PgBouncer in transaction mode, 2 POSTing clients) exits 0 with lost: 0, both replicas on timed
    wake-ups with a reason, the fallback logged once each; full-size figures in docs/reliability.md."""
    run = run_small_scenario("pgbouncer", ["--events", "300", "--clients", "2", "--timed", "2",
                                           "--poll-seconds", "0.5", "--timeout", "60", "--seed", "12"],
                             tmp_path, timeout=180)
    assert "  wakeups: {'replica-1': 'timer', 'replica-2': 'timer'}" in run.stdout, run.output()
