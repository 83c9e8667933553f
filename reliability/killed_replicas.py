"""Killed replicas: N `scheduler serve` processes drain a backlog while a chaos driver
``kill -9``s a random one every few seconds and starts it again.

A replica killed mid-batch never commits: PostgreSQL sees the socket close, rolls the
transaction back and frees its row and advisory locks, so the rows it held are pending
again and another replica (or the restarted one) takes them. At the end the audit
(``workload.audit_backlog``) must find every event dispatched or failed for its reason,
each dedup key claimed once, and every participant's sent count exactly at its cap.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

from reliability.cluster import (
    Cluster,
    ScenarioError,
    advisory_locks,
    backends_of,
    cluster,
    log,
    wait_for,
)
from reliability.report import report
from reliability.workload import audit_backlog, pending_count, plan_backlog, seed_backlog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=4000, help="due events in the backlog (default 4000)")
    parser.add_argument("--replicas", type=int, default=3, help="scheduler serve processes (default 3)")
    parser.add_argument("--kill-every", type=float, default=2.0,
                        help="mean seconds between kills (drawn from 0.5x to 1.5x; default 2)")
    parser.add_argument("--poll-seconds", type=float, default=0.1, help="SCHEDULER_POLL_SECONDS (default 0.1)")
    parser.add_argument("--batch-size", type=int, default=20, help="SCHEDULER_BATCH_SIZE (default 20)")
    parser.add_argument("--timeout", type=float, default=600, help="give up draining after this many seconds")


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    backlog = plan_backlog(args.seed, args.events)
    problems: list[str] = []
    figures: dict[str, object] = {"seed": args.seed, "replicas": args.replicas}
    database = f"rel_killed_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        seed_backlog(c.engine, backlog)
        log(f"seeded {args.events} due events for {len({e.user_id for e in backlog.events})} participants")
        replicas = [c.add_replica(i + 1, SCHEDULER_POLL_SECONDS=str(args.poll_seconds),
                                  SCHEDULER_BATCH_SIZE=str(args.batch_size)) for i in range(args.replicas)]
        # Start them together: they begin draining as soon as the first is up.
        for replica in replicas:
            replica.start(wait=False)
        started = time.monotonic()
        kills = 0
        killed_mid_batch = 0
        stop = threading.Event()
        while pending_count(c.engine) > 0:
            if time.monotonic() - started > args.timeout:
                problems.append(f"not drained after {args.timeout:g}s")
                break
            if stop.wait(rng.uniform(0.5, 1.5) * args.kill_every):
                break
            victim = rng.choice(replicas)
            if not victim.alive():
                continue
            # Aim for the worst moment: wait (briefly) until the victim holds a batch open.
            deadline = time.monotonic() + 2 * args.poll_seconds + 1
            in_batch = _in_transaction(c, victim.name)
            while not in_batch and time.monotonic() < deadline and pending_count(c.engine) > 0:
                stop.wait(0.005)
                in_batch = _in_transaction(c, victim.name)
            victim.kill()
            kills += 1
            killed_mid_batch += in_batch
            left = pending_count(c.engine)
            log(f"kill -9 {victim.name} ({'mid-batch' if in_batch else 'between batches'}); "
                f"{left} pending; restarting it")
            victim.start(wait=False)
        drained = time.monotonic() - started
        log(f"drained in {drained:.1f}s; waiting for every replica to be healthy")
        for replica in replicas:
            try:
                replica.wait_healthy(60)
            except ScenarioError as exc:
                problems.append(str(exc))
        try:
            wait_for(lambda: advisory_locks(c.engine) == 0, 30, "advisory locks to be released")
        except ScenarioError as exc:
            problems.append(str(exc))
        audit = audit_backlog(c.engine, backlog)
        problems.extend(audit.problems)
        figures.update(audit.figures)
        figures.update(kills=kills, killed_mid_batch=killed_mid_batch,
                       restarts=sum(r.starts for r in replicas) - len(replicas),
                       drain_seconds=round(drained, 1),
                       events_per_second=round(args.events / drained, 1) if drained else None)
        figures["lost"] = audit.lost
        if problems:
            args.keep = c.keep = True  # a problem: keep the database and the logs for a look
    reproduce = (f"python -m reliability killed-replicas --seed {args.seed} --events {args.events} "
                 f"--replicas {args.replicas} --kill-every {args.kill_every}")
    return report("killed-replicas", figures, problems, reproduce)


def _in_transaction(c: Cluster, name: str) -> bool:
    return any(b["in_transaction"] and b["state"] != "idle" for b in backends_of(c.engine, name))
