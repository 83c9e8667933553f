"""FAILOVER-1 to FAILOVER-3, DBURL-2, REL-17: a primary that crashes and a standby promoted in its place.

The pair is real streaming replication from the embedded server's own binaries
(``reliability.replication``: ``pg_basebackup -R``, a synchronous standby, both on loopback
ports). CI runs the failover scenario small; the full runs and their figures, the
asynchronous case included, are ``python -m reliability failover`` in docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no stubs; the embedded server's own dependency
import psycopg
import pytest
from psycopg import errors
from reliability.failover import URL_FORMS, _dispatches
from reliability.replication import ReplicatedPostgres
from sqlalchemy import Engine, text
from sqlalchemy.exc import InternalError

from scheduler.config import Settings
from scheduler.database.engine import make_engine
from scheduler.database.listener import Listener, conninfo_of
from tests.reliability.scenarios import run_small_scenario
from tests.reliability.support import wait_until

DEADLINE_SECONDS = 30.0


@pytest.mark.clause("FAILOVER-1")
@pytest.mark.clause("REL-17")
@pytest.mark.clause("INBOX-15")
def test_a_small_failover_run_loses_nothing_pushes_nothing_twice_and_heals_with_listen_back(tmp_path: Path) -> None:
    """FAILOVER-1, REL-17: `python -m reliability failover` (a synchronous standby, 2 prompt
    replicas each with another spelling of the two servers, 3 clients for 8 s, 300 backlog
    events, the primary SIGKILLed at 3 s and the standby promoted 1 s later): every POST that
    answered 201 is on the new primary, none pushed twice, nothing stuck, both replicas healthy
    with LISTEN back within 15 s of the promotion without a restart, only 201s and 503s with
    Retry-After; lost: 0. INBOX-15: a stream opened on a replica after the drain gets every
    sent notification its stream number (whatever numbering the failover broke)."""
    run = run_small_scenario("failover", ["--replicas", "2", "--clients", "3", "--seconds", "8", "--kill-at", "3",
                                          "--promote-after", "1", "--events", "300", "--seed", "17"],
                             tmp_path, timeout=300)
    figures = run.figures
    assert figures["standby"] == "sync" and len(set(figures["url_forms"].values())) == 2, run.output()
    assert figures["acknowledged_missing"] == 0 and figures["dispatched_twice"] == 0, run.output()
    assert 0 < figures["acknowledged_before_kill"] < figures["acknowledged_201"], run.output()
    assert figures["answered_503"] > 0 and figures["max_recovery_seconds"] <= 15, run.output()
    assert figures["stream_unnumbered_after_drain"] >= 0, run.output()


@pytest.mark.clause("FAILOVER-1")
def test_the_failover_audit_counts_an_event_pushed_from_both_primaries_and_a_sent_one_never_pushed() -> None:
    """FAILOVER-1: the scenario's check can fail: an event whose dispatch was pushed from the
    old primary (its notification only there) and again from the new one counts as pushed
    twice; a notification sent on the new primary that no replica pushed counts as never
    pushed; a notification of the old primary the new one lacks is counted too."""
    at = datetime(2026, 11, 30, tzinfo=UTC)
    published = {"n-old": [("replica-1", at)], "n-new": [("replica-2", at)], "n-once": [("replica-1", at)]}
    new: dict[str, tuple[str | None, str]] = {"n-new": ("event-1", "sent"), "n-once": ("event-2", "sent"),
                                             "n-silent": ("event-3", "sent")}
    old: dict[str, tuple[str | None, str]] = {"n-old": ("event-1", "sent"), "n-once": ("event-2", "sent")}
    twice, unpublished, old_only = _dispatches(published, new, old)
    assert (twice, unpublished, old_only) == ({"event-1"}, {"event-3"}, {"n-old"})
    assert _dispatches({"n-once": [("replica-1", at)]}, {"n-once": ("event-2", "sent")}, {}) == (set(), set(), set())


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedPostgres]:
    with ReplicatedPostgres(synchronous=True, log_dir=tmp_path / "logs") as running:
        yield running


def _port(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT inet_server_port()")).scalar_one())


@pytest.mark.clause("FAILOVER-2")
@pytest.mark.clause("DBURL-2")
def test_read_write_skips_the_standby_then_follows_the_promotion_in_every_form_listen_connection_included(
    pair: ReplicatedPostgres,
) -> None:
    """FAILOVER-2, DBURL-2: with the standby written first, an engine built from each spelling of the
    two servers with target_session_attrs=read-write lands on the primary, and its LISTEN
    connection too; after the primary is SIGKILLed and the standby promoted, the same engine
    (no restart) lands on the new primary and each listener reconnects there with
    notifications working. The control: target_session_attrs=any lands on the standby, where
    a write is refused (read-only)."""
    primary, standby = pair.primary.port, pair.standby.port
    engines = {form: make_engine(url.format(p1=standby, p2=primary, db="postgres"), Settings(), pool_size=1)
               for form, url in URL_FORMS.items()}
    listeners = {form: Listener(conninfo_of(engine), name=f"failover-{form}", probe_engine=engine, retry_seconds=0.2,
                                probe_seconds=DEADLINE_SECONDS) for form, engine in engines.items()}
    anywhere = make_engine(f"postgresql://postgres@127.0.0.1:{standby},127.0.0.1:{primary}/postgres"
                           "?target_session_attrs=any", Settings(), pool_size=1)
    try:
        assert {form: _port(engine) for form, engine in engines.items()} == dict.fromkeys(URL_FORMS, primary)
        for listener in listeners.values():
            listener.start(wait_seconds=DEADLINE_SECONDS)
            assert listener.available, listener.reason
        assert _port(anywhere) == standby
        with pytest.raises(InternalError) as refused, anywhere.begin() as conn:
            conn.execute(text("CREATE TABLE written_on_a_standby (x int)"))
        assert isinstance(refused.value.orig, errors.ReadOnlySqlTransaction)

        pair.kill_primary()
        pair.promote()
        assert {form: _port(engine) for form, engine in engines.items()} == dict.fromkeys(URL_FORMS, standby)
        for form, listener in listeners.items():
            wait_until(lambda listener=listener: listener.available and listener.connects >= 2,  # type: ignore[misc]
                       f"the {form} listener to reconnect to the new primary", timeout=DEADLINE_SECONDS)
    finally:
        for listener in listeners.values():
            listener.stop()
        for engine in [*engines.values(), anywhere]:
            engine.dispose()


@pytest.mark.clause("FAILOVER-3")
def test_the_pair_ends_every_process_it_started_a_stopped_one_included_when_the_run_fails(tmp_path: Path) -> None:
    """FAILOVER-3: a run that fails with the standby's postmaster stopped (SIGSTOP) still ends
    every process of both servers (SIGCONT, then stop or kill) and removes their directory."""
    pids: list[int] = []
    root: Path | None = None
    with (pytest.raises(RuntimeError, match="the run failed"),
          ReplicatedPostgres(synchronous=True, log_dir=tmp_path / "logs") as started):
        root = started.root
        assert started.replication_state() == ("streaming", "sync")
        pids = [p.pid for node in (started.primary, started.standby) for p in node.processes()]
        standby = started.standby.postmaster_pid()
        assert standby is not None and len(pids) >= 6
        os.kill(standby, signal.SIGSTOP)
        raise RuntimeError("the run failed")
    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == []
    assert root is not None and not root.exists()
    assert (tmp_path / "logs" / "postgres-standby.log").exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(started.standby.conninfo(), connect_timeout=2)
