"""REL-13, REL-14, REL-16: the partition and clock-skew scenarios pass end to end, small,
and the partition scenario's freeze detection reads the frozen backend's own state.

The full runs (and their figures) are ``python -m reliability partition`` and
``python -m reliability clock-skew``; docs/reliability.md has them. Here CI runs each with
real ``scheduler serve`` processes on the suite's embedded PostgreSQL: the partition with
both variants (a SIGSTOPped proxy, a SIGSTOPped replica) and a shortened idle timeout, the
clock skew with a few reminders per phase.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psycopg
import pytest
from reliability.clock_skew import faketime_library
from reliability.frozen_backend import (
    backend_state,
    frozen_batch,
    frozen_in_transaction,
    unread_bytes,
)
from sqlalchemy import Engine, text

from scheduler.database.events import participant_lock_key
from tests.conftest import T0
from tests.reliability.scenarios import run_small_scenario
from tests.reliability.support import store_due, wait_until


@pytest.mark.clause("REL-13")
@pytest.mark.clause("REL-16")
def test_a_small_partition_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-13, REL-16: a replica frozen mid-batch (inside its batch's open transaction, as its
    backend's state shows) behind a SIGSTOPped proxy, then one SIGSTOPped itself: the database
    ends each frozen session, its batch's rows go out through the other replica well within
    30 s, the victim's health showed the stall, it is healthy again within 30 s of the heal,
    and the audit finds nothing lost or twice."""
    figures = run_small_scenario("partition", ["--events", "300", "--replicas", "2", "--freeze-seconds", "4",
                                               "--idle-timeout-ms", "1500", "--seed", "21"],
                                 tmp_path, timeout=400).figures
    for variant in ("proxy", "process"):
        assert figures[f"{variant}_batch_rows_held"] > 0
        assert figures[f"{variant}_session_ended_by_database_seconds"] is not None
        assert 0 < figures[f"{variant}_batch_rows_out_seconds"] <= 30
        assert figures[f"{variant}_healthy_again_seconds"] <= 30
        assert figures[f"{variant}_frozen_batch_failed_on_resume"] is True
        assert any(status != 200 for status in figures[f"{variant}_health_during_freeze"])


@pytest.mark.clause("REL-14")
def test_a_small_clock_skew_run_passes_end_to_end(tmp_path: Path) -> None:
    """REL-14: replicas under libfaketime, five minutes ahead and behind, alone and
    together: no reminder leaves before its trigger by the database's clock, each leaves
    within 2 s of it, recorded times are the database's, each offset is measured and
    warned about; nothing lost or twice."""
    if faketime_library() is None:
        pytest.skip("libfaketime is missing: bash scripts/system-packages installs Debian's faketime")
    figures = run_small_scenario("clock-skew", ["--reminders", "3", "--seed", "22"], tmp_path, timeout=300).figures
    assert figures["early"] == 0 and figures["reminders"] == 9
    assert figures["ahead_clock_offset_seconds"] == pytest.approx(-300, abs=5)
    assert figures["behind_clock_offset_seconds"] == pytest.approx(300, abs=5)


@pytest.mark.clause("REL-16")
def test_a_freeze_counts_only_what_the_frozen_backend_holds_inside_its_open_transaction(engine: Engine) -> None:
    """REL-16: the partition scenario's freeze detection reads the victim backend's own state.
    A batch that committed leaves its xid in the xmax of the rows it left pending (a busy
    participant's), in a session that is merely idle: that is no frozen batch. A session idle
    in its transaction is: its batch is the pending rows it locks, its participants' rows the
    other pending rows of the users whose advisory locks it holds (pg_locks)."""
    a_first, a_second, b_only = store_due(engine, ["user-a", "user-a", "user-b"], T0)
    with engine.connect() as victim, engine.connect() as other:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        victim.commit()
        lock_row = text("SELECT id FROM scheduled_events WHERE id = :id FOR UPDATE")
        victim.execute(lock_row, {"id": a_first})
        xid = victim.execute(text("SELECT pg_current_xact_id()::text")).scalar_one()
        victim.commit()  # the batch committed and left the row pending: its xmax stays
        with engine.connect() as conn:
            assert conn.execute(text("SELECT xmax::text FROM scheduled_events WHERE id = :id"),
                                {"id": a_first}).scalar_one() == xid
        assert not frozen_in_transaction(engine, pid)
        assert frozen_batch(engine, pid) is None

        other.execute(lock_row, {"id": b_only})  # another replica's batch: not the victim's
        victim.execute(lock_row, {"id": a_first})
        victim.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": participant_lock_key("user-a")})
        assert frozen_in_transaction(engine, pid)
        assert frozen_batch(engine, pid) == ([a_first], [a_second])

        victim.rollback()  # the database ended the session's transaction: nothing held now
        assert not frozen_in_transaction(engine, pid)
        assert frozen_batch(engine, pid) is None
        other.rollback()


@pytest.mark.clause("REL-16")
def test_a_backend_with_its_clients_last_message_still_unread_is_not_frozen(engine: Engine) -> None:
    """REL-16: a client frozen just after it sent its batch's last round trip (the COMMIT) left
    that message in the backend's socket, and until the backend reads it pg_stat_activity
    still says `idle in transaction`, waiting on ClientRead: the detection sees the unread
    bytes and does not take that for a freeze. Made deterministic by stopping the backend
    itself while the message arrives."""
    store_due(engine, ["user-a"], T0)
    with engine.connect() as victim:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        victim.execute(text("SELECT id FROM scheduled_events FOR UPDATE"))
        assert frozen_in_transaction(engine, pid) and unread_bytes(pid) == 0
        driver = victim.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        os.kill(pid, signal.SIGSTOP)
        results = []
        try:
            driver.pgconn.send_query(b"COMMIT")  # on its way: in the backend's socket, unread
            assert wait_until(lambda: unread_bytes(pid), "the kernel to show the unread message", timeout=10)
            assert backend_state(engine, pid)["state"] == "idle in transaction"  # type: ignore[index]
            assert not frozen_in_transaction(engine, pid)
        finally:
            os.kill(pid, signal.SIGCONT)
            while (result := driver.pgconn.get_result()) is not None:
                results.append(result.status)
            victim.invalidate()  # its driver was driven by hand: not given back to the pool
        assert results == [psycopg.pq.ExecStatus.COMMAND_OK]
