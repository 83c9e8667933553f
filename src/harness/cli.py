"""``scheduler simulate`` (also ``python -m harness``): a seeded soak run of the replica simulation."""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from harness.broken import VARIANTS
from harness.driver import FAULTS, OPT_IN, Progress, regression_source, run_random, write_regression
from harness.host import HostDispatcher, HostImportError, load_host
from harness.local_cli import cmd_local_time
from harness.local_model import LOCAL_VARIANTS
from harness.report import EPILOG, finish, release_database, say
from harness.settle import HarnessError
from harness.shrink import Shrunk, shrink
from harness.simulation import MODES, Simulation
from harness.types import Violation
from scheduler.config import Settings
from scheduler.whole_numbers import digits_value

DEFAULTS = {"replicas": 4, "clients": 2, "batch_size": 20, "participants": 4, "faults": "all", "scheduler": "correct",
            "modes": "literal"}
MAX_ACTORS = 40  # keeps a run well under PostgreSQL's default max_connections (100)
SCENARIOS = ("replicas", "local-time")


def parse_faults(raw: str) -> frozenset[str]:
    """``all``, ``none`` or a comma-separated subset of ``FAULTS`` and ``OPT_IN`` (``all`` is ``FAULTS``)."""
    raw = raw.strip().lower()
    if raw == "all":
        return frozenset(FAULTS)
    if raw in ("none", ""):
        return frozenset()
    chosen = {f.strip() for f in raw.split(",") if f.strip()}
    unknown = chosen - set(FAULTS) - set(OPT_IN)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown faults {sorted(unknown)}; choose from "
                                         f"{', '.join((*FAULTS, *OPT_IN))}, all, none")
    return frozenset(chosen)


def _positive(name: str, low: int, high: int) -> Any:
    def parse(raw: str) -> int:
        # ASCII digits only, as every number a stranger writes (scheduler.whole_numbers): int() alone
        # takes signs, spaces, "_" and digits of other scripts
        value = digits_value(raw, 40)
        if value is None:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {raw!r}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}, got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=SCENARIOS, default="replicas",
                        help="replicas (default): replicas racing under faults; local-time: participants in "
                             "their own zones and quiet hours, the clock stepped across a DST change (SIM-LOCAL)")
    parser.add_argument("--replicas", type=_positive("--replicas", 1, 16), default=DEFAULTS["replicas"],
                        help="scheduler replicas sharing the database (default 4)")
    parser.add_argument("--steps", type=_positive("--steps", 1, 10_000_000), default=1000,
                        help="random steps before the final drain (default 1000)")
    parser.add_argument("--seed", type=_positive("--seed", 0, 2**63 - 1), default=None,
                        help="the seed that drives every choice (default: a random one, printed first)")
    parser.add_argument("--faults", type=parse_faults, default=DEFAULTS["faults"],
                        help=f"comma-separated faults to inject: {', '.join(FAULTS)}; or all (default) or none; "
                             f"opt-in, not in all: {', '.join(OPT_IN)} (some posts carry an expires_at window)")
    parser.add_argument("--scheduler", choices=sorted({*VARIANTS, *LOCAL_VARIANTS}), default=DEFAULTS["scheduler"],
                        help="correct (default), or a deliberately broken variant the invariants must catch "
                             f"(--scenario local-time: {', '.join(v for v in LOCAL_VARIANTS if v != 'correct')})")
    parser.add_argument("--modes", choices=MODES, default=DEFAULTS["modes"],
                        help="the replicas' loop mode: literal (default, REQ-0065's interval), prompt "
                             "(polls again at once after a full batch), or mixed (odd replicas prompt)")
    parser.add_argument("--batch-size", type=_positive("--batch-size", 1, 1000), default=DEFAULTS["batch_size"],
                        help="rows per claim (default 20, as in production)")
    parser.add_argument("--clients", type=_positive("--clients", 1, 8), default=DEFAULTS["clients"],
                        help="API clients posting events concurrently (default 2)")
    parser.add_argument("--participants", type=_positive("--participants", 1, 50), default=None,
                        help="participants the events are for; few means contention (default 4; "
                             "7 with --scenario local-time, one per zone)")
    parser.add_argument("--regression-file", type=Path, default=None,
                        help="where to write a failing program as a pytest test "
                             "(default: <SCHEDULER_DATA_DIR>/simulation/seed-<seed>.py)")
    parser.add_argument("--keep-database", action="store_true",
                        help="keep the run's database (sim_<seed>_<pid>) for inspection")
    parser.add_argument("--json", action="store_true",
                        help="write exactly one JSON document to stdout, on success and failure alike "
                             "(the seed line and the progress go to stderr)")
    parser.add_argument("--junit-xml", type=Path, default=None, metavar="PATH",
                        help="also write the run as a JUnit XML test suite to PATH (for CI test reports)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    parser.add_argument("--dispatcher", default=None, metavar="PACKAGE.MODULE:NAME",
                        help="run a host's dispatcher instead of the built-in platform: a harness.HostDispatcher "
                             "(factory, setup, expect, check_effects) or a factory returning a dispatcher, "
                             "imported as `python -m` would (the current directory first)")
    parser.add_argument("--setup", default=None, metavar="PACKAGE.MODULE:FUNCTION",
                        help="a function of a connection that creates (or empties) the host's own tables "
                             "in the run's database before every run; needs --dispatcher")
    parser.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=None,
                        help="on a violation, replay shorter programs to find the fewest steps that still "
                             "fail (default: on with --dispatcher, off for the built-in platform)")


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
        description=DESCRIPTION, epilog=EPILOG,
    )
    add_arguments(parser)
    parser.set_defaults(func=cmd_simulate)


def replay_command(args: argparse.Namespace, seed: int, host: HostDispatcher | None = None) -> str:
    """The one command that replays the run. A loaded ``host`` names itself by what the run
    recorded (``load_host``'s ``path`` and ``setup_path``), as the regression test does, so the
    two never disagree; before a host is loaded, the arguments as given."""
    parts = ["scheduler simulate", f"--replicas {args.replicas}", f"--steps {args.steps}", f"--seed {seed}"]
    faults = ",".join(sorted(args.faults)) if args.faults != frozenset(FAULTS) else "all"
    if faults != "all":
        parts.append(f"--faults {faults or 'none'}")
    for name in ("scheduler", "modes", "batch_size", "clients", "participants"):
        value = getattr(args, name)
        if value != DEFAULTS[name]:
            parts.append(f"--{name.replace('_', '-')} {value}")
    if host is None:
        paths = {"dispatcher": getattr(args, "dispatcher", None), "setup": getattr(args, "setup", None)}
    else:
        paths = {"dispatcher": host.path, "setup": host.setup_path}
    for name, value in paths.items():
        if value is not None:
            parts.append(f"--{name} {value}")
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


def _host(args: argparse.Namespace) -> HostDispatcher | None:
    """The host named by --dispatcher and --setup (HostImportError: a sentence for exit 2)."""
    if args.dispatcher is None:
        if args.setup is not None:
            raise HostImportError("--setup creates a host dispatcher's tables: it needs --dispatcher")
        return None
    if args.scheduler != "correct":
        raise HostImportError("--scheduler picks a broken variant of the scheduler, which runs the built-in "
                              "platform; leave it out with --dispatcher")
    return load_host(args.dispatcher, args.setup)




def cmd_simulate(args: argparse.Namespace, settings: Settings) -> int:
    if args.scenario == "local-time":
        return cmd_local_time(args, settings)
    if args.participants is None:
        args.participants = DEFAULTS["participants"]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    say(args, f"simulation seed: {seed}")
    replay = replay_command(args, seed)
    base_document: dict[str, Any] = {"seed": seed, "replay": replay, "scheduler": args.scheduler,
                                     "dispatcher": args.dispatcher or "built-in"}
    if args.replicas + args.clients + 1 > MAX_ACTORS:
        message = f"--replicas plus --clients must stay under {MAX_ACTORS} connections"
        print(message, file=sys.stderr)
        return finish(args, {**base_document, "result": "error", "message": message}, 2)
    try:
        host = _host(args)
    except HostImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return finish(args, {**base_document, "result": "error", "message": str(exc)}, 2)
    if host is not None:
        replay = base_document["replay"] = replay_command(args, seed, host)
    if args.scheduler not in VARIANTS:
        message = f"--scheduler {args.scheduler} is a variant of --scenario local-time"
        print(f"error: {message}", file=sys.stderr)
        return finish(args, {**base_document, "result": "error", "message": message}, 2)
    if not args.json:
        modes = VARIANTS[args.scheduler].modes or args.modes
        who = args.scheduler if host is None else f"dispatcher {host.name}"
        print(f"{args.replicas} replicas ({who}, {modes}), {args.clients} clients, batch {args.batch_size}, "
              f"faults: {', '.join(sorted(args.faults)) or 'none'}", flush=True)
    for noisy in ("scheduler.core", "alembic", "sqlalchemy.pool"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    name = f"sim_{seed}_{os.getpid()}"
    try:
        url, base = _fresh_database(settings, name)
    except SQLAlchemyError as exc:
        message = f"cannot create the run's database {name}: {exc}"
        print(message, file=sys.stderr)
        return finish(args, {**base_document, "result": "error", "message": message}, 2)
    started = time.monotonic()

    def make() -> Simulation:
        return Simulation(url, seed=seed, replicas=args.replicas, clients=args.clients,
                          batch_size=args.batch_size, participants=args.participants,
                          scheduler=args.scheduler, modes=args.modes, host=host)

    failure: tuple[Simulation, Violation] | None = None
    try:
        with make() as sim:
            progress = None if args.no_progress else Progress(args.steps)
            try:
                run_random(sim, args.steps, random.Random(seed), args.faults, progress)
            except Violation as violation:
                failure = (sim, violation)
            except HarnessError as exc:
                print(f"\nthe harness could not go on: {exc}\nreplay: {replay}", file=sys.stderr)
                return finish(args, {**base_document, "result": "harness_error", "message": str(exc),
                                      "elapsed_seconds": round(time.monotonic() - started, 2)}, 3)
            else:
                elapsed = time.monotonic() - started
                summary = sim.summary()
                summary.update(base_document, result="clean", elapsed_seconds=round(elapsed, 2))
        if failure is not None:
            return _report_failure(args, settings, make, *failure, seed, replay, base_document, started)
        if not args.json:
            print_summary(summary, replay, elapsed, sys.stdout)
            if args.scheduler != "correct":
                print(f"note: the broken variant {args.scheduler!r} was not caught in {args.steps} steps; "
                      "try more steps or another seed")
        return finish(args, summary, 0)
    finally:
        release_database(args, base, name, url)


def _report_failure(args: argparse.Namespace, settings: Settings, make: Callable[[], Simulation], sim: Simulation,
                    violation: Violation, seed: int, replay: str, base_document: dict[str, Any],
                    started: float) -> int:
    say(args, f"\nINVARIANT VIOLATED: {violation}")
    tail = sim.program[-40:]
    say(args, f"the last {len(tail)} of {len(sim.program)} steps:")
    for line in tail:
        say(args, f"    {line}")
    shrunk: Shrunk | None = None
    if args.shrink if args.shrink is not None else sim.host is not None:
        say(args, f"shrinking the {len(sim.program)}-step program (replaying shorter ones)...")
        shrunk = shrink(make, list(sim.program), violation.clause)
        if shrunk is None:
            say(args, "the whole program did not fail again on replay: kept as it is")
        else:
            say(args, f"shrunk to {len(shrunk.program)} steps in {shrunk.replays} replays "
                       f"({shrunk.seconds:.1f}s): {shrunk.violation}")
            for line in shrunk.program:
                say(args, f"    {line}")
    program = shrunk.program if shrunk is not None else list(sim.program)
    path = args.regression_file or settings.data_dir / "simulation" / f"seed-{seed}.py"
    source = regression_source(sim, violation if shrunk is None else shrunk.violation, replay,
                               name=f"seed_{seed}_{violation.clause.replace('-', '_').lower()}",
                               replicas=args.replicas, clients=args.clients, batch_size=args.batch_size,
                               scheduler=args.scheduler, modes=args.modes, program=program,
                               participants=args.participants)
    write_regression(path, source)
    say(args, f"the whole program, as a pytest test: {path}")
    say(args, f"replay: {replay}")
    expected = VARIANTS[args.scheduler].expected
    if expected is not None:
        verdict = "as expected" if expected == violation.clause else f"(expected {expected})"
        say(args, f"broken variant {args.scheduler!r} caught by {violation.clause} {verdict}")
    document = {
        **base_document, "result": "violation", "clause": violation.clause, "violation": str(violation),
        "message": violation.message, "step": violation.step, "steps_total": len(sim.program),
        "last_steps": tail, "program": program, "shrunk": shrunk is not None,
        "regression_file": str(path), "elapsed_seconds": round(time.monotonic() - started, 2),
    }
    return finish(args, document, 1)
