"""REL-11: a replica frozen inside its batch's transaction holds nothing for long.

PostgreSQL ends a session that sits idle inside a transaction for longer than
``SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS`` (here 300 ms instead of the default 10 s); its
row and participant locks go with it, so another replica dispatches the rows at once. When
the frozen replica goes on, its batch fails cleanly: nothing it did commits, nothing is
published, and its next poll works. ``python -m reliability partition`` does the same with
real processes (a frozen TCP proxy, a SIGSTOPped replica).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.nudging.rules import load_catalogue
from tests.conftest import T0
from tests.reliability.support import notifications_by_event, statuses, store_due, wait_until

FROZEN_MS = 300


def _backend_alive(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid})
        return bool(found.scalar_one())


@pytest.mark.clause("DEC-11")
@pytest.mark.clause("REL-11")
def test_a_batch_left_idle_past_the_timeout_is_ended_by_the_database_and_another_replica_takes_its_rows(
    database_url: str, engine: Engine,
) -> None:
    """REL-11, DEC-11: the frozen replica's session is ended by the server (its transaction rolled
    back, its locks released); the other replica dispatches every row the frozen one held;
    the frozen one's batch then fails as a whole, publishes nothing, and its loop goes on."""
    ids = store_due(engine, ["anna", "ben", "cleo"], T0)
    catalogue = load_catalogue()
    clock = ManualClock(T0)
    frozen_engine = make_engine(database_url, Settings(idle_in_transaction_timeout_ms=FROZEN_MS),
                                pool_size=1, max_overflow=0)
    healthy_engine = make_engine(database_url, Settings(), pool_size=1, max_overflow=0)
    frozen_pub, healthy_pub = RecordingPublisher(), RecordingPublisher()
    frozen = Scheduler(Database(frozen_engine), NudgingPlatform(catalogue), clock,
                       publisher=frozen_pub, name="frozen")
    healthy = Scheduler(Database(healthy_engine), NudgingPlatform(catalogue), clock,
                        publisher=healthy_pub, name="healthy")
    try:
        batch = frozen.claim()
        assert [e.id for e in batch.events] == ids
        frozen.dispatch_next(batch)  # one event's effects are written, uncommitted
        pid = batch.session.connection().connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        # The replica now freezes; the database ends its session after the timeout.
        wait_until(lambda: not _backend_alive(engine, pid), "the server ends the idle-in-transaction session")

        report = healthy.poll_once()
        assert sorted(o.id for o in report.outcomes) == sorted(ids)
        assert report.dispatched == 3

        # The frozen replica resumes mid-batch: its next statement finds the session gone.
        with pytest.raises(DBAPIError):
            frozen.dispatch_next(batch)
            frozen.finish(batch)
        frozen.abort(batch)
        assert frozen_pub.messages == []  # nothing of the rolled-back batch left the process
        assert len(healthy_pub.messages) == 3
        assert statuses(engine) == dict.fromkeys(ids, "dispatched")
        assert notifications_by_event(engine) == dict.fromkeys(ids, 1)  # none twice
        # Its loop goes on: the next poll runs on a fresh connection and finds nothing due.
        assert frozen.poll_once().claimed == 0
    finally:
        frozen_engine.dispose()
        healthy_engine.dispose()


@pytest.mark.clause("DEC-11")
@pytest.mark.clause("REL-11")
def test_the_idle_timeout_is_set_inside_every_transaction_behind_a_transaction_pooler(database_url: str) -> None:
    """REL-11, DEC-11: with SCHEDULER_TRANSACTION_POOLING the bound travels with each transaction
    (SET LOCAL), so it holds on whichever server session PgBouncer lends; outside a
    transaction nothing of it is left on the session."""
    pooled = make_engine(database_url, Settings(transaction_pooling=True, idle_in_transaction_timeout_ms=4321),
                         pool_size=1, max_overflow=0)
    try:
        with pooled.begin() as conn:
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "4321ms"
        with pooled.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # outside a transaction block SET LOCAL changes nothing: the session keeps 0
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "0"
    finally:
        pooled.dispose()
