"""``scheduler simulate`` (also ``python -m harness``): a seeded soak run of the replica simulation."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from harness.broken import VARIANTS
from harness.driver import FAULTS, Progress, regression_source, run_random, write_regression
from harness.settle import HarnessError
from harness.simulation import MODES, Simulation
from harness.types import Violation
from scheduler.config import Settings
from scheduler.database.engine import drop_database
from scheduler.digits import digits_value

DEFAULTS = {"replicas": 4, "clients": 2, "batch_size": 20, "participants": 4, "faults": "all", "scheduler": "correct",
            "modes": "literal"}
MAX_ACTORS = 40  # keeps a run well under PostgreSQL's default max_connections (100)


def parse_faults(raw: str) -> frozenset[str]:
    """``all``, ``none`` or a comma-separated subset of ``FAULTS``."""
    raw = raw.strip().lower()
    if raw == "all":
        return frozenset(FAULTS)
    if raw in ("none", ""):
        return frozenset()
    chosen = {f.strip() for f in raw.split(",") if f.strip()}
    unknown = chosen - set(FAULTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}, all, none")
    return frozenset(chosen)


def _positive(name: str, low: int, high: int) -> Any:
    def parse(raw: str) -> int:
        # ASCII digits only, as every number a stranger writes (scheduler.digits): int() alone
        # takes signs, spaces, "_" and digits of other scripts
        value = digits_value(raw, 40)
        if value is None:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {raw!r}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}, got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=_positive("--replicas", 1, 16), default=DEFAULTS["replicas"],
                        help="scheduler replicas sharing the database (default 4)")
    parser.add_argument("--steps", type=_positive("--steps", 1, 10_000_000), default=1000,
                        help="random steps before the final drain (default 1000)")
    parser.add_argument("--seed", type=_positive("--seed", 0, 2**63 - 1), default=None,
                        help="the seed that drives every choice (default: a random one, printed first)")
    parser.add_argument("--faults", type=parse_faults, default=DEFAULTS["faults"],
                        help=f"comma-separated faults to inject: {', '.join(FAULTS)}; or all (default) or none")
    parser.add_argument("--scheduler", choices=sorted(VARIANTS), default=DEFAULTS["scheduler"],
                        help="correct (default), or a deliberately broken variant the invariants must catch")
    parser.add_argument("--modes", choices=MODES, default=DEFAULTS["modes"],
                        help="the replicas' loop mode: literal (default, REQ-0065's interval), prompt "
                             "(polls again at once after a full batch), or mixed (odd replicas prompt)")
    parser.add_argument("--batch-size", type=_positive("--batch-size", 1, 1000), default=DEFAULTS["batch_size"],
                        help="rows per claim (default 20, as in production)")
    parser.add_argument("--clients", type=_positive("--clients", 1, 8), default=DEFAULTS["clients"],
                        help="API clients posting events concurrently (default 2)")
    parser.add_argument("--participants", type=_positive("--participants", 1, 50), default=DEFAULTS["participants"],
                        help="participants the events are for; few means contention (default 4)")
    parser.add_argument("--regression-file", type=Path, default=None,
                        help="where to write a failing program as a pytest test "
                             "(default: <SCHEDULER_DATA_DIR>/simulation/seed-<seed>.py)")
    parser.add_argument("--keep-database", action="store_true",
                        help="keep the run's database (sim_<seed>_<pid>) for inspection")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


DESCRIPTION = (
    "Run the replica simulation: N production schedulers (each with its own connection), API "
    "clients and a frozen clock over a fresh database, driven step by step by one seed, with "
    "crashes, killed backends, failing events and polls, stops and clock jumps. After every step "
    "the database is compared with a model. The seed is printed first; a failure prints the "
    "violated invariant, the program and the command that replays it. Without DATABASE_URL the "
    "embedded PostgreSQL in SCHEDULER_DATA_DIR is used; each run creates and drops its own database."
)


def add_simulate_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``scheduler simulate``."""
    parser = sub.add_parser(
        "simulate",
        help="run several scheduler replicas against one database under a seeded random program",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=cmd_simulate)


def replay_command(args: argparse.Namespace, seed: int) -> str:
    parts = ["scheduler simulate", f"--replicas {args.replicas}", f"--steps {args.steps}", f"--seed {seed}"]
    faults = ",".join(sorted(args.faults)) if args.faults != frozenset(FAULTS) else "all"
    if faults != "all":
        parts.append(f"--faults {faults or 'none'}")
    for name in ("scheduler", "modes", "batch_size", "clients", "participants"):
        value = getattr(args, name)
        if value != DEFAULTS[name]:
            parts.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)


def _fresh_database(settings: Settings, name: str) -> tuple[str, str]:
    """Create database ``name`` next to the configured one; return (its URL, an admin URL)."""
    from scheduler.database.engine import create_migrated_database, resolve_database_url

    base = resolve_database_url(settings)
    return create_migrated_database(base, name, settings), base


def print_summary(summary: dict[str, Any], replay: str, elapsed: float, out: Any) -> None:
    steps = summary["steps_total"]
    print(f"steps: {steps} in {elapsed:.1f}s ({steps / max(elapsed, 1e-9):.1f} steps/s)", file=out)
    print("  by kind: " + ", ".join(f"{k} {v}" for k, v in summary["steps"].items()), file=out)
    if summary["blocked_steps"]:
        print("  waited on a lock: " + ", ".join(f"{k} {v}" for k, v in summary["blocked_steps"].items()), file=out)
    print(f"events: {summary['events_posted']} posted into {summary['rows']} rows; "
          f"{summary['events_dispatched']} dispatched, {summary['events_failed']} failed", file=out)
    faults = summary["faults"]
    print("faults injected: " + (", ".join(f"{k} {v}" for k, v in faults.items()) or "none")
          + f"; poll errors caught by the loop: {summary['poll_errors_caught']}", file=out)
    print(f"invariant checks: {summary['checks_total']} ("
          + ", ".join(f"{k} {v}" for k, v in summary["checks"].items()) + ")", file=out)
    print(f"replay: {replay}", file=out)


def cmd_simulate(args: argparse.Namespace, settings: Settings) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"simulation seed: {seed}", flush=True)
    replay = replay_command(args, seed)
    if args.replicas + args.clients + 1 > MAX_ACTORS:
        print(f"--replicas plus --clients must stay under {MAX_ACTORS} connections", file=sys.stderr)
        return 2
    if not args.json:
        modes = VARIANTS[args.scheduler].modes or args.modes
        print(f"{args.replicas} replicas ({args.scheduler}, {modes}), {args.clients} clients, batch {args.batch_size}, "
              f"faults: {', '.join(sorted(args.faults)) or 'none'}", flush=True)
    for noisy in ("scheduler.core", "alembic", "sqlalchemy.pool"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    name = f"sim_{seed}_{os.getpid()}"
    try:
        url, base = _fresh_database(settings, name)
    except SQLAlchemyError as exc:
        print(f"cannot create the run's database {name}: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        with Simulation(url, seed=seed, replicas=args.replicas, clients=args.clients,
                        batch_size=args.batch_size, participants=args.participants,
                        scheduler=args.scheduler, modes=args.modes) as sim:
            progress = None if args.no_progress else Progress(args.steps)
            try:
                run_random(sim, args.steps, random.Random(seed), args.faults, progress)
            except Violation as violation:
                return _report_failure(args, settings, sim, violation, seed, replay)
            except HarnessError as exc:
                print(f"\nthe harness could not go on: {exc}\nreplay: {replay}", file=sys.stderr)
                return 3
            elapsed = time.monotonic() - started
            summary = sim.summary()
            summary.update(seed=seed, elapsed_seconds=round(elapsed, 2), replay=replay, scheduler=args.scheduler)
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print_summary(summary, replay, elapsed, sys.stdout)
            if args.scheduler != "correct":
                print(f"note: the broken variant {args.scheduler!r} was not caught in {args.steps} steps; "
                      "try more steps or another seed")
        return 0
    finally:
        if args.keep_database:
            print(f"database kept: {url}", file=sys.stderr)
        else:
            with contextlib.suppress(Exception):
                drop_database(base, name)


def _report_failure(args: argparse.Namespace, settings: Settings, sim: Simulation, violation: Violation,
                    seed: int, replay: str) -> int:
    out = sys.stdout
    print(f"\nINVARIANT VIOLATED: {violation}", file=out)
    tail = sim.program[-40:]
    print(f"the last {len(tail)} of {len(sim.program)} steps:", file=out)
    for line in tail:
        print(f"    {line}", file=out)
    path = args.regression_file or settings.data_dir / "simulation" / f"seed-{seed}.py"
    source = regression_source(sim, violation, replay, name=f"seed_{seed}_{violation.clause.replace('-', '_').lower()}",
                               replicas=args.replicas, clients=args.clients, batch_size=args.batch_size,
                               scheduler=args.scheduler, modes=args.modes)
    write_regression(path, source)
    print(f"the whole program, as a pytest test: {path}", file=out)
    print(f"replay: {replay}", file=out)
    expected = VARIANTS[args.scheduler].expected
    if expected is not None:
        verdict = "as expected" if expected == violation.clause else f"(expected {expected})"
        print(f"broken variant {args.scheduler!r} caught by {violation.clause} {verdict}", file=out)
    return 1
