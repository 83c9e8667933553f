"""``scheduler simulate --scenario local-time``: a seeded run of the local-time scenario
(``local_run``) on a fresh database, its summary or its violation, and the command that replays it.

The options it reads: ``--seed``, ``--steps``, ``--participants`` (7 by default: every zone
of ``local_model.ZONES`` once), ``--replicas`` (they poll in turn), ``--batch-size``,
``--scheduler`` (``correct`` or a variant of ``local_model.LOCAL_VARIANTS``), ``--json``,
``--junit-xml``, ``--keep-database``. A host's ``--dispatcher`` and ``--setup`` and
``--shrink`` are refused; the replica scenario's faults, modes and clients do not apply.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from harness.local_model import LOCAL_VARIANTS
from harness.local_run import LocalTimeSimulation
from harness.report import finish, release_database, say
from harness.types import Violation
from scheduler.config import Settings
from scheduler.database.engine import create_migrated_database, resolve_database_url

LOCAL_PARTICIPANTS = 7
LOCAL_DEFAULTS = {"replicas": 4, "batch_size": 20}


def replay_command(args: argparse.Namespace, seed: int) -> str:
    """The one command that replays a local-time run."""
    parts = ["scheduler simulate --scenario local-time", f"--steps {args.steps}", f"--seed {seed}"]
    if args.participants != LOCAL_PARTICIPANTS:
        parts.append(f"--participants {args.participants}")
    for name, default in LOCAL_DEFAULTS.items():
        if getattr(args, name) != default:
            parts.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    if args.scheduler != "correct":
        parts.append(f"--scheduler {args.scheduler}")
    return " ".join(parts)


def refusal(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot run the local-time scenario (None: they can)."""
    if args.dispatcher is not None or args.setup is not None:
        return ("--scenario local-time runs the built-in platform (its quiet hours and cap): "
                "leave out --dispatcher and --setup")
    if args.shrink:
        return "--scenario local-time does not shrink: its program is its seed's, replayed whole"
    if args.scheduler not in LOCAL_VARIANTS:
        return (f"--scheduler {args.scheduler} is a variant of the replica scenario; the local-time scenario's are "
                f"{', '.join(LOCAL_VARIANTS)}")
    return None




def cmd_local_time(args: argparse.Namespace, settings: Settings) -> int:
    """Run the scenario; exit 0 clean, 1 an invariant violated, 2 bad arguments or no database."""
    if args.participants is None:
        args.participants = LOCAL_PARTICIPANTS
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    say(args, f"simulation seed: {seed}")
    replay = replay_command(args, seed)
    base: dict[str, Any] = {"scenario": "local-time", "seed": seed, "replay": replay, "scheduler": args.scheduler,
                            "dispatcher": "built-in"}
    problem = refusal(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return finish(args, {**base, "result": "error", "message": problem}, 2)
    for noisy in ("scheduler.core", "alembic", "sqlalchemy.pool"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    name = f"simlocal_{seed}_{os.getpid()}"
    try:
        admin = resolve_database_url(settings)
        url = create_migrated_database(admin, name, settings)
    except SQLAlchemyError as exc:
        message = f"cannot create the run's database {name}: {exc}"
        print(message, file=sys.stderr)
        return finish(args, {**base, "result": "error", "message": message}, 2)
    started = time.monotonic()
    try:
        with LocalTimeSimulation(url, seed=seed, participants=args.participants, replicas=args.replicas,
                                 scheduler=args.scheduler, batch_size=args.batch_size) as sim:
            say(args, f"local time: {len(sim.participants)} participants, {args.replicas} replicas "
                       f"({args.scheduler}), starting {sim.start:%Y-%m-%dT%H:%MZ} before {sim.crossing}")
            for person in sim.participants:
                say(args, f"    {person.describe()}")
            try:
                sim.run(args.steps)
            except Violation as violation:
                return _report(args, sim, violation, replay, base, started)
            summary = {**sim.summary(), **base, "result": "clean",
                       "elapsed_seconds": round(time.monotonic() - started, 2)}
        say(args, f"steps: {summary['steps_total']}; rows {summary['rows']}, held {summary['holds']} times "
                   f"({summary['live_deferred']} live events deferred), {summary['dispatched']} dispatched, "
                   f"{summary['expired']} expired, {summary['sent']} sent; clean until {summary['end']}")
        say(args, f"replay: {replay}")
        if args.scheduler != "correct":
            say(args, f"note: the broken variant {args.scheduler!r} was not caught in {args.steps} steps; "
                       "try more steps or another seed")
        return finish(args, summary, 0)
    finally:
        release_database(args, admin, name, url)


def _report(args: argparse.Namespace, sim: LocalTimeSimulation, violation: Violation, replay: str,
            base: dict[str, Any], started: float) -> int:
    say(args, f"\nINVARIANT VIOLATED: {violation}")
    tail = sim.program[-30:]
    say(args, f"the last {len(tail)} of {len(sim.program)} steps:")
    for line in tail:
        say(args, f"    {line}")
    say(args, f"replay: {replay}")
    expected = LOCAL_VARIANTS[args.scheduler].expected
    if expected is not None:
        verdict = "as expected" if expected == violation.clause else f"(expected {expected})"
        say(args, f"broken variant {args.scheduler!r} caught by {violation.clause} {verdict}")
    document = {**base, "result": "violation", "clause": violation.clause, "violation": str(violation),
                "message": violation.message, "step": violation.step, "steps_total": len(sim.program),
                "last_steps": tail, "program": list(sim.program), "regression_file": None,
                "elapsed_seconds": round(time.monotonic() - started, 2)}
    return finish(args, document, 1)
