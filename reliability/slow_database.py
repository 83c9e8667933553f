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
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from reliability.cluster import ScenarioError, cluster, drain_and_check, log, wait_for
from reliability.report import report
from reliability.traffic import Clients, HealthMonitor, check_clients, client_rows
from reliability.workload import audit_backlog, pending_count, plan_backlog, seed_backlog
from scheduler.database.participant_locks import participant_lock_key

LOCK_TIMEOUT_MS = 500
STATEMENT_TIMEOUT_MS = 1500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=3000, help="due events in the backlog (default 3000)")
    parser.add_argument("--clients", type=int, default=3, help="concurrent POSTing clients (default 3)")
    parser.add_argument("--hold", type=float, default=6.0, help="seconds the operator holds each lock (default 6)")
    parser.add_argument("--poll-seconds", type=float, default=0.2, help="SCHEDULER_POLL_SECONDS (default 0.2)")
    parser.add_argument("--timeout", type=float, default=300, help="give up waiting after this many seconds")


def run(args: argparse.Namespace) -> int:
    backlog = plan_backlog(args.seed, args.events)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "replicas": 2}
    database = f"rel_slow_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        seed_backlog(c.engine, backlog)
        common = {"SCHEDULER_POLL_SECONDS": str(args.poll_seconds)}
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
        # so that the backlog lasts), then the rate while the operator holds the lock.
        left = _pending_users(c.engine)
        if not left:
            raise ScenarioError("the backlog drained before the advisory-lock phase: use more --events")
        victim = left[0]
        window = min(args.hold, 1.5)
        before, t0 = _backlog_done(c.engine), time.monotonic()
        threading.Event().wait(window)
        baseline_rate = (_backlog_done(c.engine) - before) / (time.monotonic() - t0)
        before = _backlog_done(c.engine)
        operator.execute(text("SELECT pg_advisory_lock(:k)"), {"k": participant_lock_key(victim)})
        # After the lock is ours (a batch that held it has committed): from here on no
        # claim may touch these rows until the release.
        victim_before = _user_rows(c.engine, victim)
        log(f"operator: holds {victim}'s advisory lock for {args.hold:g}s ({pending_count(c.engine)} pending)")
        t0 = time.monotonic()
        threading.Event().wait(args.hold)
        during = _backlog_done(c.engine) - before
        during_rate = during / (time.monotonic() - t0)
        others_left = _pending_besides(c.engine, victim)
        known = {row[0] for row in victim_before}  # clients may add rows of their own meanwhile
        victim_during = [row for row in _user_rows(c.engine, victim) if row[0] in known]
        operator.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": participant_lock_key(victim)})
        operator.commit()
        operator.close()
        log(f"operator: released it; {during} events were dispatched or failed while it was held "
            f"({during_rate:.0f}/s against {baseline_rate:.0f}/s without a hold)")
        if during <= 0:
            problems.append("no progress at all while one participant's advisory lock was held")
        elif during_rate < 0.5 * baseline_rate and others_left > 0:
            problems.append(f"progress while one participant's lock was held ({during_rate:.0f}/s) fell below "
                            f"half the rate without a hold ({baseline_rate:.0f}/s)")
        if victim_during != victim_before:
            problems.append(f"{victim}'s rows changed while its lock was held elsewhere (a claim must leave them untouched)")
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
            progress_during_advisory_lock=during, rate_during_advisory_lock=round(during_rate, 1),
            rate_without_a_hold=round(baseline_rate, 1), run_seconds=round(elapsed, 1),
        )
        figures["lost"] = audit.lost + len(clients.figures.acknowledged - set(client_rows(c.engine)))
        if problems:
            args.keep = c.keep = True  # a problem: keep the database and the logs for a look
    reproduce = f"python -m reliability slow-database --seed {args.seed} --events {args.events} --hold {args.hold}"
    return report("slow-database", figures, problems, reproduce)


def _backlog_done(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM scheduled_events WHERE status <> 'pending' AND event_type = 'reliability'"
        )).scalar_one())


def _user_rows(engine: Any, user_id: str) -> list[tuple[Any, ...]]:
    """The participant's rows as they stand: a claim that skips them must not change them."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT id, status, last_error, updated_at FROM scheduled_events WHERE user_id = :u ORDER BY id"
        ), {"u": user_id})]


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


def _pending_users(engine: Any) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT user_id FROM scheduled_events WHERE status = 'pending' AND event_type = 'reliability' "
            "GROUP BY user_id ORDER BY min(trigger_at) LIMIT 5")).scalars())


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
