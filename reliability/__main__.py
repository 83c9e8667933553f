"""``python -m reliability <scenario>``: the fault scenarios, one command each.

Each starts its own embedded PostgreSQL (``--pgdata``, default /tmp/reliability-pg; failover
makes a primary and a standby of its own instead), a fresh database, and real
``scheduler serve`` replicas on 127.0.0.1; prints its figures (events,
faults, requests, ``lost``) and exits 1 if anything was lost or an invariant failed.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from collections.abc import Sequence

SCENARIOS = [
    ("killed-replicas", "killed_replicas", "kill -9 random replicas while they drain a backlog"),
    ("database-restart", "database_restart", "stop/start PostgreSQL and terminate backends under polls and POSTs"),
    ("slow-database", "slow_database", "an operator holds locks: lock/statement timeouts bound the damage"),
    ("shutdown", "shutdown", "SIGTERM replicas while batches are in flight"),
    ("pgbouncer", "pgbouncer", "two prompt-mode replicas behind a real PgBouncer in transaction mode"),
    ("partition", "partition", "a replica frozen mid-batch (a SIGSTOPped proxy or process) while others drain"),
    ("clock-skew", "clock_skew", "replicas whose host clocks are 5 minutes ahead and behind (libfaketime)"),
    ("expired-backlog", "expired_backlog",
     "every replica stopped past the reminders' window, then started: the passed ones end expired"),
    ("failover", "failover",
     "the primary SIGKILLed under load and its standby promoted: replicas follow by a multi-host URL"),
    ("provider-down", "provider_down",
     "the webhook provider refuses connections, then answers 503, for 60 s under load; then back"),
    ("fuzz", "fuzz", "the nightly-style schemathesis run (a few thousand cases)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reliability",
        description="Fault scenarios against real scheduler serve processes and one PostgreSQL. "
        "Each prints its figures and exits non-zero if anything is lost.",
    )
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, module_name, help_text in SCENARIOS:
        try:
            module = importlib.import_module(f"reliability.{module_name}")
        except ModuleNotFoundError:
            continue
        scenario = sub.add_parser(name, help=help_text, description=(module.__doc__ or "").strip().split("\n\n")[0])
        scenario.add_argument("--seed", type=int, default=None,
                              help="the seed that drives everything (default: random)")
        scenario.add_argument("--pgdata", default="/tmp/reliability-pg", help="embedded PostgreSQL data directory")
        scenario.add_argument("--workdir", default="/tmp/reliability-work", help="logs and replica data directories")
        scenario.add_argument("--keep", action="store_true", help="keep the database and logs afterwards")
        module.add_arguments(scenario)
        scenario.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    print(f"seed {args.seed}", flush=True)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
