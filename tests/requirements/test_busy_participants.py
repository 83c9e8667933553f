"""BUSY — a claim never waits on a busy participant (DEC-2).

In our words: the daily cap and deduplication serialise each participant on an advisory
lock. A claim only *tries* those locks: the rows of a participant whose lock is held
elsewhere (another batch, a live event, an operator's session) stay exactly as they were —
pending, no ``last_error``, no notification — while the rest of the batch goes ahead, and
a later poll takes them once the lock is free. So a held lock can neither stall a replica
nor starve the participant.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import DUE_CHANNEL
from scheduler.core.poll import Batch
from scheduler.database.engine import make_engine
from scheduler.database.events import participant_lock_key
from scheduler.service import SchedulerService
from scheduler.types import PollReport
from tests.conftest import T0, TEST_SECRET
from tests.helpers import post_event, reminder_facts, rows

DEADLINE = 20.0


@contextmanager
def held(engine: Engine, user_id: str) -> Iterator[None]:
    """Hold ``user_id``'s participant lock from another session, as a long transaction would."""
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": participant_lock_key(user_id)})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": participant_lock_key(user_id)})
            conn.commit()


def snapshot(engine: Engine, user_id: str) -> list[dict[str, object]]:
    return rows(engine, "SELECT id, status, last_error, updated_at, dispatched_at FROM scheduled_events "
                        "WHERE user_id = :u ORDER BY id", u=user_id)


def exact_rows(engine: Engine, user_id: str) -> list[dict[str, object]]:
    """Every column of ``user_id``'s rows as PostgreSQL prints the whole row, and the row
    version (``xmin``): any write, even one that stores the same values, changes one of them."""
    return rows(engine, "SELECT e.id, e.xmin::text AS version, e::text AS whole FROM scheduled_events e "
                        "WHERE e.user_id = :u ORDER BY e.id", u=user_id)


def history_of(engine: Engine, user_id: str) -> list[dict[str, object]]:
    return rows(engine, "SELECT h.* FROM scheduled_event_history h JOIN scheduled_events e ON e.id = h.event_id "
                        "WHERE e.user_id = :u ORDER BY h.id", u=user_id)


SENTINEL = "busy_test_sentinel"


@contextmanager
def listening(postgresql: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A connection LISTENing on the loop's wake-up channel (and a sentinel channel)."""
    info = postgresql.info
    with psycopg.connect(host=info.host, port=info.port, user=info.user, password=info.password or None,
                         dbname=info.dbname, autocommit=True) as conn:
        conn.execute(f"LISTEN {DUE_CHANNEL}")
        conn.execute(f"LISTEN {SENTINEL}")
        yield conn


def due_notifications_until_sentinel(conn: psycopg.Connection[Any], engine: Engine) -> list[str]:
    """Every wake-up NOTIFY sent before now. A sentinel NOTIFY is committed last; PostgreSQL
    delivers notifications in commit order, so whatever came before it is all there was.
    The wait has a deadline: a sentinel that never comes fails the test in seconds."""
    with engine.begin() as sender:
        sender.execute(text("SELECT pg_notify(:c, 'end')"), {"c": SENTINEL})
    seen: list[str] = []
    for note in conn.notifies(timeout=DEADLINE):
        if note.channel == SENTINEL:
            return seen
        seen.append(note.payload)
    raise AssertionError(f"the sentinel NOTIFY did not arrive within {DEADLINE:g} s")


def post_for(client: TestClient, user_id: str, n: int, *, oldest: int) -> None:
    for i in range(n):
        post_event(client, user_id=user_id, trigger_at=T0 - timedelta(minutes=oldest - i),
                   facts=reminder_facts(f"2026-11-{10 + i:02d}"))


@pytest.mark.clause("BUSY-1")
def test_a_poll_does_not_wait_for_a_held_participant_and_leaves_its_rows_untouched(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """BUSY-1: with busy's lock held elsewhere, a poll returns without waiting, dispatches the
    others, and leaves busy's rows exactly as they were (no status, no error, no effect)."""
    post_for(client, "busy", 2, oldest=30)
    post_for(client, "free", 2, oldest=20)
    before = snapshot(engine, "busy")
    with held(engine, "busy"), ThreadPoolExecutor(max_workers=1) as pool:
        report = pool.submit(service.scheduler.poll_once).result(timeout=DEADLINE)
        assert (report.claimed, report.skipped, report.dispatched) == (2, 2, 2)
        assert snapshot(engine, "busy") == before
        assert rows(engine, "SELECT count(*) AS n FROM notifications WHERE user_id = 'busy'") == [{"n": 0}]
    after = service.scheduler.poll_once()
    assert (after.dispatched, after.skipped) == (2, 0)
    assert {r["status"] for r in snapshot(engine, "busy")} == {"dispatched"}


@pytest.mark.clause("BUSY-1")
def test_a_busy_participant_at_the_head_of_the_queue_does_not_empty_the_batch(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """BUSY-1: busy's 25 oldest rows fill more than a batch of 20; the claim's first round
    finds only them, so it takes a further round past busy, and the other participants'
    rows still go ahead in the same poll."""
    post_for(client, "busy", 25, oldest=100)
    for i in range(5):
        post_event(client, user_id=f"other-{i}", trigger_at=T0 - timedelta(minutes=1))
    with held(engine, "busy"):
        report = service.scheduler.poll_once()
    assert report.dispatched == 5
    assert report.skipped == 20  # the first round's rows; the second round excluded busy
    assert {r["status"] for r in snapshot(engine, "busy")} == {"pending"}


@pytest.mark.clause("BUSY-1")
def test_however_many_participants_are_busy_at_the_head_of_the_queue_the_rest_still_goes_ahead(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """BUSY-1: five busy participants, each with a batch's worth (20) of the oldest due rows,
    ahead of a free participant's row: one poll still dispatches the free row (the claim goes
    on past every busy participant it meets), and every busy row stays pending."""
    for n in range(5):
        post_for(client, f"busy-{n}", 20, oldest=1000 - n * 100)
    post_event(client, user_id="free", trigger_at=T0 - timedelta(minutes=1))
    with contextlib.ExitStack() as stack:
        for n in range(5):
            stack.enter_context(held(engine, f"busy-{n}"))
        report = service.scheduler.poll_once()
    assert report.dispatched == 1
    assert report.skipped == 100  # one round per busy participant, then the free row
    for n in range(5):
        assert {r["status"] for r in snapshot(engine, f"busy-{n}")} == {"pending"}
    assert [r["status"] for r in snapshot(engine, "free")] == ["dispatched"]


def replica(database_url: str, clock: ManualClock) -> SchedulerService:
    """A replica like a served one whose engine bounds lock waits (SCHEDULER_LOCK_TIMEOUT_MS):
    a claim that waited on a participant's lock would fail within a second, not hang."""
    settings = Settings(jwt_secret=TEST_SECRET, lock_timeout_ms=1000, statement_timeout_ms=60_000)
    return SchedulerService(settings, engine=make_engine(database_url, settings), clock=clock, run_scheduler=False)


def run_claimed(service: SchedulerService, batch: Batch) -> PollReport:
    """Dispatch a claimed batch's events and commit it, as the rest of its poll would."""
    scheduler = service.scheduler
    try:
        while batch.remaining:
            scheduler.dispatch_next(batch)
        return scheduler.finish(batch)
    finally:
        scheduler.abort(batch)


@pytest.mark.clause("BUSY-1")
def test_two_replicas_claiming_at_once_both_go_past_a_busy_participant_whose_rows_fill_both_batches(
    client: TestClient, engine: Engine, clock: ManualClock, database_url: str
) -> None:
    """BUSY-1: busy's 45 rows are the oldest due, more than two batches of 20, and its lock is
    held elsewhere. Replica A claims, then replica B while A's batch is still open (two replicas
    polling at once): each claim's first round finds only busy's rows (B's, those A has not
    locked), leaves them untouched and goes on, so A takes the other participants' 20 oldest
    rows and B the 10 left. Neither waits: a claim that waited on busy's lock would fail here
    within its lock timeout, and a claim that stopped at busy would take nothing."""
    busy = [post_event(client, user_id="busy", trigger_at=T0 - timedelta(minutes=100 - i))["id"] for i in range(45)]
    free = [post_event(client, user_id=f"free-{i:02d}", trigger_at=T0 - timedelta(minutes=30, seconds=-i))["id"]
            for i in range(30)]
    before = exact_rows(engine, "busy")
    a, b = replica(database_url, clock), replica(database_url, clock)
    try:
        with held(engine, "busy"):
            batch_a = a.scheduler.claim()
            batch_b = b.scheduler.claim()
            assert ([e.id for e in batch_a.events], batch_a.skipped) == (free[:20], busy[:20])
            assert ([e.id for e in batch_b.events], batch_b.skipped) == (free[20:], busy[20:40])
            report_a, report_b = run_claimed(a, batch_a), run_claimed(b, batch_b)
            assert (report_a.dispatched, report_b.dispatched) == (20, 10)
            assert exact_rows(engine, "busy") == before  # every column and row version as stored
        assert a.scheduler.health.consecutive_failures == b.scheduler.health.consecutive_failures == 0
        assert a.scheduler.poll_once().dispatched == 20  # the lock is free: busy's rows go, oldest first
    finally:
        a.engine.dispose()
        b.engine.dispose()


@pytest.mark.clause("BUSY-2")
def test_a_participant_whose_lock_is_taken_briefly_and_repeatedly_still_gets_its_rows(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """BUSY-2: no starvation: each poll that finds the lock free takes the participant's rows,
    so however often the lock is taken in between, all of them are dispatched."""
    post_for(client, "flaky", 5, oldest=10)
    service.scheduler.batch_size = 2
    dispatched = 0
    for poll in range(10):
        if poll % 2 == 0:
            with held(engine, "flaky"):
                assert service.scheduler.poll_once().dispatched == 0
        else:
            dispatched += service.scheduler.poll_once().dispatched
    assert dispatched == 5
    assert {r["status"] for r in snapshot(engine, "flaky")} == {"dispatched"}


@pytest.mark.clause("BUSY-2")
def test_the_prompt_loop_dispatches_a_participant_whose_lock_flickers(
    engine: Engine, clock: ManualClock, client: TestClient
) -> None:
    """BUSY-2: a real prompt-mode loop (one-hour interval) against a session that takes and
    releases the participant's lock over and over: every row is dispatched, none failed."""
    from tests.requirements.test_prompt_mode import LoopThread, make_service

    post_for(client, "flicker", 6, oldest=10)
    service = make_service(engine, clock)
    stop = threading.Event()

    def flicker() -> None:
        while not stop.is_set():
            with held(engine, "flicker"):
                stop.wait(0.05)
            stop.wait(0.05)

    holder = threading.Thread(target=flicker, daemon=True)
    holder.start()
    loop = LoopThread(service).start()
    try:
        assert service.scheduler.wait_for(lambda: service.scheduler.health.dispatched == 6, DEADLINE)
    finally:
        stop.set()
        holder.join(DEADLINE)
        assert loop.stop()
    assert {r["status"] for r in snapshot(engine, "flicker")} == {"dispatched"}
    assert service.scheduler.health.failed == 0


@pytest.mark.clause("BUSY-1")
def test_a_busy_participants_rows_stay_byte_for_byte_as_they_were_with_no_history_and_no_wakeup(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock,
    postgresql: psycopg.Connection[Any],
) -> None:
    """BUSY-1: the clock moves on between the store and the poll, so a write of any kind would
    show: after a poll that skips busy's rows, every column of them is as before and no row
    version changed, busy's history has no new entry, and no wake-up NOTIFY was sent (rows
    written back as ``pending`` would announce themselves on the due channel)."""
    post_for(client, "busy", 3, oldest=30)
    post_for(client, "free", 2, oldest=20)
    clock.advance(timedelta(minutes=7))
    before, history = exact_rows(engine, "busy"), history_of(engine, "busy")
    assert len(before) == 3 and len(history) == 3  # stored, once each
    with listening(postgresql) as listener:
        assert due_notifications_until_sentinel(listener, engine) == []  # the listener works; nothing yet
        with held(engine, "busy"), ThreadPoolExecutor(max_workers=1) as pool:
            report = pool.submit(service.scheduler.poll_once).result(timeout=DEADLINE)
        assert (report.skipped, report.dispatched) == (3, 2)
        assert exact_rows(engine, "busy") == before
        assert history_of(engine, "busy") == history
        assert due_notifications_until_sentinel(listener, engine) == []
    assert service.scheduler.poll_once().dispatched == 3  # the lock is free: a later poll takes them


def advisory_keys(engine: Engine, pid: int) -> set[int]:
    """The bigint advisory-lock keys a backend holds (pg_locks splits each in two halves)."""
    found = rows(engine, "SELECT (classid::bigint << 32) | objid::bigint AS k FROM pg_locks "
                         "WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = :pid", pid=pid)
    unsigned = [int(r["k"]) for r in found]
    return {k - (1 << 64) if k >= 1 << 63 else k for k in unsigned}


@pytest.mark.clause("BUSY-3")
def test_the_claim_try_locks_exactly_the_participants_of_the_rows_it_returns(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """BUSY-3: the claim's one statement try-locks the participants of the rows it returns and
    no other: not those of rows past its LIMIT, nor of a row another transaction holds."""
    for i in range(5):
        post_event(client, user_id=f"p{i}", trigger_at=T0 - timedelta(minutes=10 - i))
    service.scheduler.batch_size = 2
    with engine.connect() as other:
        # the oldest row is locked elsewhere (another replica's batch): SKIP LOCKED passes it
        other.execute(text("SELECT id FROM scheduled_events WHERE user_id = 'p0' FOR UPDATE"))
        batch = service.scheduler.claim()
        try:
            assert [e.user_id for e in batch.events] == ["p1", "p2"]
            pid = batch.session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            assert advisory_keys(engine, pid) == {participant_lock_key("p1"), participant_lock_key("p2")}
        finally:
            service.scheduler.abort(batch)
        other.rollback()


@pytest.mark.clause("BUSY-3")
def test_the_claims_sql_lock_key_is_the_key_live_ingest_and_operators_use(engine: Engine) -> None:
    """BUSY-3: the key the claim computes in SQL equals ``participant_lock_key`` (what live
    ingest waits on and an operator takes) for any user id, non-ASCII and quotes included."""
    from scheduler.database.queries import load_queries

    fragment = load_queries()["participant_lock_key"].sql
    users = ["u-1", "", "Zoë", "名前", "o'brien", "x" * 300, "user-\U0001F600"]
    for user in users:
        found = rows(engine, f"SELECT {fragment} AS k FROM (SELECT CAST(:u AS text) AS user_id) AS p", u=user)
        assert found == [{"k": participant_lock_key(user)}], user


_ROUND_BOUND = re.compile(r"(?:up to|at most) (?:\w+ )(?:more |further )?rounds", re.IGNORECASE)


@pytest.mark.clause("BUSY-1")
def test_the_docs_describe_the_claims_rounds_as_the_code_runs_them() -> None:
    """BUSY-1: the claim takes rounds until the batch is full (core/claim.py); no page of the
    README or specs/ promises a fixed number of rounds past busy participants."""
    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted((root / "specs").glob("*.md"))]
    claims = [(page.name, match[0]) for page in pages for match in _ROUND_BOUND.finditer(page.read_text())]
    assert claims == [], claims
    assert "until the batch is full" in (root / "README.md").read_text()
