"""Shutdown under load: SIGTERM a replica while it holds a batch open, again and again.

The lifespan's stop sets the loop's stop event; the batch finishes the event in hand,
commits what it did (the rows it never reached are released still ``pending``), and the
process exits. After each SIGTERM: exit code 0, promptly, and no backend or lock of that
replica left in PostgreSQL. At the end the audit finds every event done exactly once.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

from reliability.cluster import ScenarioError, backends_of, cluster, drain_and_check, log, wait_for
from reliability.report import report
from reliability.workload import audit_backlog, pending_count, plan_backlog, seed_backlog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=3000, help="due events in the backlog (default 3000)")
    parser.add_argument("--replicas", type=int, default=2, help="scheduler serve processes (default 2)")
    parser.add_argument("--rounds", type=int, default=12, help="SIGTERMs to send (default 12)")
    parser.add_argument("--poll-seconds", type=float, default=0.1, help="SCHEDULER_POLL_SECONDS (default 0.1)")
    parser.add_argument("--exit-timeout", type=float, default=30, help="a replica must exit within this (default 30)")
    parser.add_argument("--timeout", type=float, default=300, help="give up draining after this many seconds")


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    backlog = plan_backlog(args.seed, args.events)
    problems: list[str] = []
    figures: dict[str, Any] = {"seed": args.seed, "replicas": args.replicas}
    database = f"rel_shutdown_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        seed_backlog(c.engine, backlog)
        replicas = [c.add_replica(i + 1, SCHEDULER_POLL_SECONDS=str(args.poll_seconds)) for i in range(args.replicas)]
        for replica in replicas:
            replica.log_level = "info"  # to see uvicorn's "Application shutdown complete"
            replica.start()
        started = time.monotonic()
        exit_seconds: list[float] = []
        codes: list[int] = []
        mid_batch = 0
        graceful = 0
        for n in range(args.rounds):
            if pending_count(c.engine) == 0:
                log("the backlog drained before all rounds were done")
                break
            victim = rng.choice(replicas)
            try:
                wait_for(lambda v=victim: _in_batch(c.engine, v.name), 10, f"{victim.name} to open a batch",  # type: ignore[misc]
                         interval=0.002)
                in_batch = True
            except ScenarioError:
                in_batch = False
            mid_batch += in_batch
            clean_before = victim.clean_shutdowns()
            try:
                code, seconds = victim.terminate(args.exit_timeout)
            except ScenarioError as exc:
                problems.append(str(exc))
                continue
            codes.append(code)
            exit_seconds.append(seconds)
            clean = victim.clean_shutdowns() == clean_before + 1
            graceful += clean
            if code != 0 or not clean:
                problems.append(f"{victim.name} did not shut down cleanly after SIGTERM (round {n + 1}): "
                                f"exit {code}, lifespan shutdown logged: {clean}")
            try:
                wait_for(lambda v=victim: not backends_of(c.engine, v.name), 10,  # type: ignore[misc]
                         f"{victim.name}'s backends to disappear")
            except ScenarioError as exc:
                problems.append(f"round {n + 1}: {exc}: {backends_of(c.engine, victim.name)}")
            log(f"round {n + 1}: SIGTERM {victim.name} {'mid-batch' if in_batch else 'between batches'}: "
                f"exit {code} in {seconds:.2f}s, no backend left; {pending_count(c.engine)} pending; restarting it")
            victim.start()
        elapsed = drain_and_check(c.engine, args.timeout, problems) - started
        audit = audit_backlog(c.engine, backlog)
        problems.extend(audit.problems)
        figures.update(audit.figures)
        figures.update(sigterms=len(codes), sigterm_mid_batch=mid_batch, graceful_shutdowns=graceful,
                       exit_codes=sorted(set(codes)),
                       max_exit_seconds=round(max(exit_seconds, default=0.0), 2),
                       mean_exit_seconds=round(sum(exit_seconds) / len(exit_seconds), 2) if exit_seconds else None,
                       run_seconds=round(elapsed, 1))
        figures["lost"] = audit.lost
        if problems:
            args.keep = c.keep = True  # a problem: keep the database and the logs for a look
    reproduce = f"python -m reliability shutdown --seed {args.seed} --events {args.events} --rounds {args.rounds}"
    return report("shutdown", figures, problems, reproduce)


def _in_batch(engine: Any, name: str) -> bool:
    return any(b["in_transaction"] and b["state"] != "idle" and b["locks"] > 1 for b in backends_of(engine, name))
