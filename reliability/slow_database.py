"""Slow database: an operator's session holds locks while replicas poll and clients POST.

Replica 1 bounds waits with ``lock_timeout`` (SCHEDULER_LOCK_TIMEOUT_MS=500), replica 2
with ``statement_timeout`` only (SCHEDULER_STATEMENT_TIMEOUT_MS=1500, lock timeout off).
First the operator holds ``LOCK TABLE scheduled_events IN ACCESS EXCLUSIVE MODE``: every
poll and every POST then fails within its timeout (health 503 naming the timeout, POST
503), nothing hangs, and everything resumes once the lock is released. Then the operator
holds one participant's advisory lock: claims skip that participant without waiting
(DEC-2), so the others keep dispatching at no less than half the rate measured without a
hold, the participant's rows stay untouched, and they are dispatched after the release.
At the end nothing is lost.

Each phase drains its own part of the backlog (a quarter around the table lock, the rest
stored when the advisory-lock phase starts), so that how long the first phase took cannot
leave the second with nothing to measure. The held participant's rows are stored once its
lock is held, due before every other row and more than both replicas' batches together: every
claim meets them first, so a claim that waited on a busy participant would stall every
poll, not one in a few. The rates are measured while other participants' rows are pending
(a window ends early when they run out), and a run whose backlog ran out before the hold
fails as such ("use more --events"), never as a stall.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from reliability.cluster import ScenarioError, cluster, drain_and_check, log, wait_for
from reliability.report import report
from reliability.traffic import Clients, HealthMonitor, check_clients, client_rows
from reliability.workload import audit_backlog, joined, pending_count, plan_backlog, seed_backlog
from scheduler.database.events import participant_lock_key

LOCK_TIMEOUT_MS = 500
STATEMENT_TIMEOUT_MS = 1500
BATCH_SIZE = 20  # each replica's SCHEDULER_BATCH_SIZE (the default)
# The held participant's rows: more than the two replicas' batches together, so that even a
# claim that finds the other replica's batch holding some of them meets only its rows first.
HELD_ROWS = 3 * BATCH_SIZE
SAMPLE_SECONDS = 0.05  # how often the rates' windows look at the backlog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=3000,
                        help=f"due events in the backlog (default 3000), besides the held participant's {HELD_ROWS}")
    parser.add_argument("--clients", type=int, default=3, help="concurrent POSTing clients (default 3)")
    parser.add_argument("--hold", type=float, default=6.0, help="seconds the operator holds each lock (default 6)")
    parser.add_argument("--poll-seconds", type=float, default=0.2, help="SCHEDULER_POLL_SECONDS (default 0.2)")
    parser.add_argument("--timeout", type=float, default=300, help="give up waiting after this many seconds")


def run(args: argparse.Namespace) -> int:
    others = plan_backlog(args.seed, args.events)
    held = plan_backlog(_held_seed(args.seed), HELD_ROWS, users=1, prefix=f"held-{args.seed}")
    victim = held.events[0].user_id
    backlog = joined(others, held)
    first_part = len(others.events) // 4
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "replicas": 2}
    database = f"rel_slow_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        # the first phase's rows, and every participant's preferences
        seed_backlog(c.engine, dataclasses.replace(backlog, events=others.events[:first_part]))
        common = {"SCHEDULER_POLL_SECONDS": str(args.poll_seconds), "SCHEDULER_BATCH_SIZE": str(BATCH_SIZE)}
        replicas = [
            c.add_replica(1, SCHEDULER_LOCK_TIMEOUT_MS=str(LOCK_TIMEOUT_MS), SCHEDULER_STATEMENT_TIMEOUT_MS="30000",
                          **common),
            c.add_replica(2, SCHEDULER_LOCK_TIMEOUT_MS="0", SCHEDULER_STATEMENT_TIMEOUT_MS=str(STATEMENT_TIMEOUT_MS),
                          **common),
        ]
        for replica in replicas:
            replica.start()
        monitor = HealthMonitor(replicas)
        clients = Clients(replicas, c.headers("nudging.ingest"), args.clients, args.seed)
        monitor.start()
        clients.start()
        started = time.monotonic()
        wait_for(lambda: len(clients.figures.acknowledged) >= 10, 60, "the clients' first 201s")

        # 1. the whole table, locked by an operator's open transaction
        operator = c.engine.connect()
        before = pending_count(c.engine)
        log(f"operator: LOCK TABLE scheduled_events IN ACCESS EXCLUSIVE MODE for {args.hold:g}s ({before} pending)")
        operator.execute(text("LOCK TABLE scheduled_events IN ACCESS EXCLUSIVE MODE"))
        held_from = time.monotonic()
        threading.Event().wait(args.hold)
        held_to = time.monotonic()
        operator.rollback()
        log("operator: released the table lock")
        wait_for(monitor.healthy_now, args.timeout, "health to recover after the table lock", interval=0.1)
        table_recovery = time.monotonic() - held_to
        _check_timeouts_shown(monitor, held_from, held_to, problems)
        posts_503_during_lock = clients.figures.statuses.get(503, 0)

        # 2. one participant's advisory lock (the lock the orchestrator takes per participant).
        # First the rate with no lock held, over a window as long as the hold (at most 1.5 s,
        # and no longer than half the backlog lasts, so that the hold has the other half),
        # then the rate while the operator holds the lock, each while other rows are pending.
        seed_backlog(c.engine, dataclasses.replace(backlog, events=others.events[first_part:], caps={}, disabled={}))
        left = _pending_besides(c.engine, victim)
        baseline, baseline_seconds, _ = _progress(c.engine, victim, min(args.hold, 1.5), until_left=left // 2)
        baseline_rate = baseline / baseline_seconds
        operator.execute(text("SELECT pg_advisory_lock(:k)"), {"k": participant_lock_key(victim)})
        # From here on no claim may touch the held participant's rows until the release:
        # stored now, due before every other row (two hours ago, the others one).
        seed_backlog(c.engine, dataclasses.replace(held, caps={}, disabled={}), overdue=timedelta(hours=2))
        victim_before = _user_rows(c.engine, victim)
        others_at_hold = _pending_besides(c.engine, victim)
        log(f"operator: holds {victim}'s advisory lock for {args.hold:g}s ({len(victim_before)} of its rows due "
            f"first, {others_at_hold} rows of other participants pending)")
        if others_at_hold == 0:  # nothing the hold could hold up: no figure to judge
            operator.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": participant_lock_key(victim)})
            raise ScenarioError("the backlog drained before the advisory-lock hold: use more --events")
        t0 = time.monotonic()
        during, during_seconds, others_left = _progress(c.engine, victim, args.hold, until_left=0)
        during_rate = during / during_seconds
        threading.Event().wait(max(0.0, t0 + args.hold - time.monotonic()))  # the hold lasts its length
        victim_during = _user_rows(c.engine, victim)
        operator.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": participant_lock_key(victim)})
        operator.commit()
        operator.close()
        log(f"operator: released it; {during} events of other participants were dispatched or failed while it "
            f"was held ({during_rate:.0f}/s over {during_seconds:.1f}s against {baseline_rate:.0f}/s without a "
            f"hold; {others_left} left)")
        if during <= 0:
            problems.append("no progress at all while one participant's advisory lock was held")
        elif during_rate < 0.5 * baseline_rate:
            problems.append(f"progress while one participant's lock was held ({during_rate:.0f}/s) fell below "
                            f"half the rate without a hold ({baseline_rate:.0f}/s)")
        if victim_during != victim_before:
            problems.append(f"{victim}'s rows changed while its lock was held elsewhere "
                            "(a claim must leave them untouched)")
        wait_for(lambda: _user_pending(c.engine, victim) == 0, args.timeout,
                 f"{victim}'s rows to be dispatched after the release", interval=0.1)

        clients.stop()
        elapsed = drain_and_check(c.engine, args.timeout, problems, survivors=replicas) - started
        monitor.stop()
        client_figures = check_clients(clients.figures, c.engine, problems)
        if clients.figures.max_503_seconds > STATEMENT_TIMEOUT_MS / 1000 + 2:
            problems.append(f"a POST took {clients.figures.max_503_seconds:.1f}s to answer 503")
        audit = audit_backlog(c.engine, backlog)
        problems.extend(audit.problems)
        figures.update(audit.figures)
        figures.update(client_figures)
        figures.update(
            lock_timeout_ms=LOCK_TIMEOUT_MS, statement_timeout_ms=STATEMENT_TIMEOUT_MS, hold_seconds=args.hold,
            posts_503_during_table_lock=posts_503_during_lock,
            health_recovery_after_table_lock_seconds=round(table_recovery, 2),
            held_participant_rows=len(victim_before), pending_at_advisory_lock=others_at_hold,
            progress_during_advisory_lock=during, rate_during_advisory_lock=round(during_rate, 1),
            rate_without_a_hold=round(baseline_rate, 1), run_seconds=round(elapsed, 1),
        )
        figures["lost"] = audit.lost + len(clients.figures.acknowledged - set(client_rows(c.engine)))
        if problems:
            args.keep = c.keep = True  # a problem: keep the database and the logs for a look
    reproduce = f"python -m reliability slow-database --seed {args.seed} --events {args.events} --hold {args.hold}"
    return report("slow-database", figures, problems, reproduce)


def _held_seed(seed: int) -> int:
    """The held participant's plan's seed: another stream of draws than the others' (a seed
    near theirs can repeat their ids: Random(2) and Random(2 + 2**32) draw alike)."""
    return int.from_bytes(hashlib.sha256(f"slow-database held participant {seed}".encode()).digest()[:8], "big")


def _progress(engine: Any, user_id: str, seconds: float, *, until_left: int) -> tuple[int, float, int]:
    """Watch the backlog for ``seconds``, or until no more than ``until_left`` rows of
    participants other than ``user_id`` are pending: how many of its rows were done meanwhile,
    over how many seconds, and how many rows of the others are left."""
    done_before, _ = _backlog_counts(engine, user_id)
    start = time.monotonic()
    while True:
        done, left = _backlog_counts(engine, user_id)
        now = time.monotonic()
        if left <= until_left or now >= start + seconds:
            return done - done_before, now - start, left
        threading.Event().wait(min(SAMPLE_SECONDS, start + seconds - now))


def _backlog_counts(engine: Any, user_id: str) -> tuple[int, int]:
    """The backlog's rows done, and those of participants other than ``user_id`` still pending."""
    with engine.connect() as conn:
        done, left = conn.execute(text(
            "SELECT count(*) FILTER (WHERE status <> 'pending'), "
            "count(*) FILTER (WHERE status = 'pending' AND user_id <> :u) "
            "FROM scheduled_events WHERE event_type = 'reliability'"), {"u": user_id}).one()
        return int(done), int(left)


def _user_rows(engine: Any, user_id: str) -> list[tuple[Any, ...]]:
    """The participant's rows as they stand, with their row versions: a claim that skips them
    must not write them, not even the same values (BUSY-1)."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT id, status, last_error, updated_at, xmin::text FROM scheduled_events WHERE user_id = :u "
            "ORDER BY id"), {"u": user_id})]


def _user_pending(engine: Any, user_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM scheduled_events WHERE user_id = :u AND status = 'pending'"), {"u": user_id}
        ).scalar_one())


def _pending_besides(engine: Any, user_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM scheduled_events WHERE status = 'pending' AND event_type = 'reliability' "
            "AND user_id <> :u"), {"u": user_id}).scalar_one())


def _check_timeouts_shown(monitor: HealthMonitor, start: float, end: float, problems: list[str]) -> None:
    """Each replica's health named its own timeout while the table was locked, and kept answering."""
    expected = {"replica-1": "lock timeout", "replica-2": "statement timeout"}
    for name, words in expected.items():
        samples = [s for s in monitor.between(start, end) if s.replica == name]
        if not any(s.status == 503 and words in (s.body.get("last_error") or "") for s in samples):
            errors = {(s.body.get("last_error") or "")[:80] for s in samples}
            problems.append(f"{name}: health never showed a {words} during the table lock (errors seen: {errors})")
        if any(s.status is None or not s.body.get("running") for s in samples):
            problems.append(f"{name}: health stopped answering, or the loop stopped, during the table lock")
