"""Database restart: PostgreSQL is stopped and started again, then every replica backend is
terminated, repeatedly, while the replicas poll a backlog and clients POST.

The loop must survive (an exception escaping a poll is caught, REQ-0067), /health/scheduler
must show the outage (503, ``state: failing``) and recover without a restart, the
pool must heal by itself, every POST that answered 201 must be in the table, and a POST
during the outage must answer 503 with a JSON detail, promptly.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from reliability.cluster import (
    cluster,
    drain_and_check,
    log,
    terminate_backends,
    wait_for,
)
from reliability.report import report
from reliability.traffic import Clients, HealthMonitor, check_clients
from reliability.workload import audit_backlog, pending_count, plan_backlog, seed_backlog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=3000, help="due events in the backlog (default 3000)")
    parser.add_argument("--replicas", type=int, default=2, help="scheduler serve processes (default 2)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent POSTing clients (default 4)")
    parser.add_argument("--outage", type=float, default=5.0, help="seconds PostgreSQL stays down (default 5)")
    parser.add_argument("--restarts", type=int, default=2, help="stop/start cycles of PostgreSQL (default 2)")
    parser.add_argument("--terminations", type=int, default=5,
                        help="rounds of pg_terminate_backend on every replica backend (default 5)")
    parser.add_argument("--poll-seconds", type=float, default=0.2, help="SCHEDULER_POLL_SECONDS (default 0.2)")
    parser.add_argument("--timeout", type=float, default=300, help="give up waiting after this many seconds")


def run(args: argparse.Namespace) -> int:
    backlog = plan_backlog(args.seed, args.events)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "replicas": args.replicas}
    database = f"rel_restart_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        seed_backlog(c.engine, backlog)
        replicas = [c.add_replica(i + 1, SCHEDULER_POLL_SECONDS=str(args.poll_seconds),
                                  SCHEDULER_POOL_TIMEOUT_SECONDS="2") for i in range(args.replicas)]
        for replica in replicas:
            replica.start()
        monitor = HealthMonitor(replicas)
        clients = Clients(replicas, c.headers("nudging.ingest"), args.clients, args.seed)
        monitor.start()
        clients.start()
        started = time.monotonic()
        wait_for(lambda: len(clients.figures.acknowledged) >= 20, 60, "the clients' first 201s")
        outages: list[tuple[float, float]] = []
        recoveries: list[float] = []

        for n in range(args.restarts):
            log(f"restart {n + 1}/{args.restarts}: stopping PostgreSQL ({pending_count(c.engine)} pending, "
                f"{len(clients.figures.acknowledged)} POSTs acknowledged)")
            down = time.monotonic()
            c.pg.stop("fast")
            threading.Event().wait(args.outage)  # the outage itself: the point of the scenario
            c.pg.start()
            up = time.monotonic()
            outages.append((down, up))
            log(f"PostgreSQL is back after {up - down:.1f}s; waiting for every replica's health to recover")
            recoveries.append(_recover(monitor, args.timeout) - up)
            log(f"healthy again {recoveries[-1]:.1f}s after the restart")

        killed = 0
        for n in range(args.terminations):
            threading.Event().wait(1.0)
            count = terminate_backends(c.engine, database)
            killed += count
            log(f"termination {n + 1}/{args.terminations}: pg_terminate_backend on {count} replica backends")
        _recover(monitor, args.timeout)

        clients.stop()
        log(f"clients stopped; draining ({pending_count(c.engine)} pending)")
        elapsed = drain_and_check(c.engine, args.timeout, problems, survivors=replicas) - started
        monitor.stop()
        _check_health_during_outages(monitor, outages, replicas, problems)
        client_figures = check_clients(clients.figures, c.engine, problems)
        audit = audit_backlog(c.engine, backlog)
        problems.extend(audit.problems)
        figures.update(audit.figures)
        figures.update(client_figures)
        figures.update(
            database_restarts=args.restarts, outage_seconds=args.outage, backend_terminations=args.terminations,
            backends_terminated=killed, max_recovery_seconds=round(max(recoveries, default=0.0), 1),
            health_503_samples=sum(1 for s in monitor.samples if s.status == 503),
            health_samples=len(monitor.samples), run_seconds=round(elapsed, 1),
        )
        figures["lost"] = audit.lost + len(clients.figures.acknowledged - set(_keys(c)))
        if problems:
            args.keep = c.keep = True  # a problem: keep the database and the logs for a look
    reproduce = (f"python -m reliability database-restart --seed {args.seed} --events {args.events} "
                 f"--replicas {args.replicas} --clients {args.clients} --outage {args.outage}")
    return report("database-restart", figures, problems, reproduce)


def _keys(c: Any) -> list[str]:
    from reliability.traffic import client_rows

    return list(client_rows(c.engine))


def _recover(monitor: HealthMonitor, timeout: float) -> float:
    wait_for(monitor.healthy_now, timeout, "every replica's /health/scheduler to answer 200 again", interval=0.1)
    return time.monotonic()


def _check_health_during_outages(monitor: HealthMonitor, outages: list[tuple[float, float]],
                                 replicas: list[Any], problems: list[str]) -> None:
    """During each outage every replica's health showed it: a 503 in state ``failing`` (the open
    route says so in words; the error itself is on the admin route)."""
    for down, up in outages:
        for replica in replicas:
            samples = [s for s in monitor.between(down, up) if s.replica == replica.name]
            shown = [s for s in samples if s.status == 503 and s.body.get("state") == "failing"
                     and s.body.get("consecutive_failures", 0) >= 1]
            if not shown:
                problems.append(f"{replica.name}: /health/scheduler never showed the outage "
                                f"({len(samples)} samples, statuses {sorted({s.status or 0 for s in samples})})")
            elif not all(s.status in (200, 503) and s.body.get("running") for s in samples):
                problems.append(f"{replica.name}: /health/scheduler failed to answer "
                                "or the loop stopped during an outage")
