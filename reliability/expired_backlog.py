"""Expired backlog: every replica is stopped for longer than the reminders' window while a
backlog builds up; then the replicas start and drain it (EXP-2, DEC-EXPIRY).

The backlog is stored while no replica runs, due ``--outage-minutes`` ago (the replicas were
stopped that long). A share of the reminders (``--expired-share``) had a window shorter than
the outage, so their ``expires_at`` passed before any replica could claim them; the others'
window is longer than the outage. The replicas start together and drain. The audit states one
equality over the whole run: every row whose window passed ends ``expired`` (no notification,
no key taken), every other ends as it was built to (dispatched, or failed for its reason);
nothing is lost, nothing is both, and the caps and keys hold for what was dispatched.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from pathlib import Path

from reliability.cluster import ScenarioError, advisory_locks, cluster, log, wait_for
from reliability.report import report
from reliability.workload import (
    audit_backlog,
    pending_count,
    plan_backlog,
    seed_backlog,
    with_windows,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=4000, help="events in the backlog (default 4000)")
    parser.add_argument("--replicas", type=int, default=3, help="scheduler serve processes (default 3)")
    parser.add_argument("--outage-minutes", type=float, default=120,
                        help="how long every replica was stopped: the backlog is due that long ago (default 120)")
    parser.add_argument("--expired-share", type=float, default=0.4,
                        help="share of reminders whose window (half the outage) passed during it (default 0.4)")
    parser.add_argument("--poll-seconds", type=float, default=0.1, help="SCHEDULER_POLL_SECONDS (default 0.1)")
    parser.add_argument("--batch-size", type=int, default=20, help="SCHEDULER_BATCH_SIZE (default 20)")
    parser.add_argument("--timeout", type=float, default=600, help="give up draining after this many seconds")


def run(args: argparse.Namespace) -> int:
    outage = timedelta(minutes=args.outage_minutes)
    # the short window ends halfway through the outage; the long one a whole outage after it ends
    backlog = with_windows(plan_backlog(args.seed, args.events), args.seed, share=args.expired_share,
                           passed=outage / 2, open_for=outage * 2)
    problems: list[str] = []
    figures: dict[str, object] = {"seed": args.seed, "replicas": args.replicas,
                                  "outage_minutes": args.outage_minutes}
    database = f"rel_expired_{args.seed}"
    with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
        # every replica is stopped: the backlog builds up with nobody to claim it
        seed_backlog(c.engine, backlog, overdue=outage)
        expiring = sum(e.expected == "expired" for e in backlog.events)
        log(f"stored {args.events} events due {args.outage_minutes:g} min ago while no replica ran; "
            f"{expiring} of them past their window")
        replicas = [c.add_replica(i + 1, SCHEDULER_POLL_SECONDS=str(args.poll_seconds),
                                  SCHEDULER_BATCH_SIZE=str(args.batch_size)) for i in range(args.replicas)]
        for replica in replicas:
            replica.start(wait=False)
        started = time.monotonic()
        try:
            wait_for(lambda: pending_count(c.engine) == 0, args.timeout, "the backlog to drain")
        except ScenarioError as exc:
            problems.append(str(exc))
        drained = time.monotonic() - started
        log(f"drained in {drained:.1f}s")
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
        figures.update(planned_expired=expiring, drain_seconds=round(drained, 1))
        figures["lost"] = audit.lost
        if problems:
            args.keep = c.keep = True  # a problem: keep the database and the logs for a look
    reproduce = (f"python -m reliability expired-backlog --seed {args.seed} --events {args.events} "
                 f"--replicas {args.replicas} --outage-minutes {args.outage_minutes:g} "
                 f"--expired-share {args.expired_share:g}")
    return report("expired-backlog", figures, problems, reproduce)
