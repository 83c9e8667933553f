"""``python -m bench`` and ``scheduler bench``: run one benchmark or all of them.

Progress goes to stderr; the Markdown table to stdout; both files (JSON with everything,
including the EXPLAIN plans, and the table) to ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is: the full run (about ten minutes) or ``--quick``."""

    claim_sizes: tuple[int, ...]
    claim_samples: int
    claim_budget: float
    events: int
    replicas: tuple[int, ...]
    batches: tuple[int, ...]
    full_events: int
    formula_events: int
    formula_poll: float
    http_requests: int
    http_concurrency: tuple[int, ...]
    http_seconds: float
    shutdown_repeats: int
    memory_events: int
    profile_events: int
    repeats: int
    burst_events: int
    burst_replicas: tuple[int, ...]
    burst_single_modes: tuple[str, ...]
    console_rows: int = 1_000_000
    console_samples: int = 30
    scale_sizes: tuple[int, ...] = (10_000, 1_000_000, 10_000_000)
    scale_samples: int = 1_000
    scale_page_samples: int = 30
    scale_budget: float = 60.0
    delivery_events: int = 10_000
    delivery_concurrency: int = 256  # sends at once per replica (and per peer worker)
    delivery_batch: int = 100  # the outbox replicas' SCHEDULER_BATCH_SIZE
    delivery_rounds: int = 1  # the outbox and pgqueuer, taking turns at going first


FULL = Sizes(claim_sizes=(10_000, 100_000, 1_000_000), claim_samples=300, claim_budget=10.0,
             events=6_000, replicas=(1, 2, 4), batches=(20, 100), full_events=4_000,
             formula_events=1_000, formula_poll=0.1, http_requests=1_500, http_concurrency=(1, 8, 16),
             http_seconds=6.0, shutdown_repeats=10, memory_events=100_000, profile_events=4_000, repeats=2,
             burst_events=10_000, burst_replicas=(1, 2, 4), burst_single_modes=("prompt", "literal"))
QUICK = Sizes(claim_sizes=(10_000, 100_000), claim_samples=100, claim_budget=3.0,
              events=2_000, replicas=(1, 2), batches=(20, 100), full_events=1_000,
              formula_events=400, formula_poll=0.1, http_requests=600, http_concurrency=(8,),
              http_seconds=10.0, shutdown_repeats=3, memory_events=10_000, profile_events=1_000, repeats=1,
              burst_events=2_000, burst_replicas=(1, 2), burst_single_modes=("prompt",),
              console_rows=100_000, console_samples=15,
              scale_sizes=(10_000, 100_000), scale_samples=200, scale_page_samples=10, scale_budget=10.0,
              delivery_events=1_000)

DESCRIPTIONS = {
    "claim": "claim latency (median, p90, EXPLAIN ANALYZE BUFFERS) with 1,000 due rows among 10k/100k/1M "
             "rows, ours against a naive plain index on trigger_at, and ours with a history made by UPDATE "
             "before and after VACUUM; ratio 1M / 10k",
    "mechanics": "drain N due events with a no-op dispatcher at poll interval 0 by 1/2/4 replica processes, "
                 "batch 20 and larger; beside it the raw SQL ceiling, procrastinate and pgqueuer; and the "
                 "drain-time formula checked with a real poll interval",
    "fullpath": "drain N due commitment reminders through the real NudgingPlatform (rules, dedup, "
                "preferences, cap, notification rows) by 1/2/4 replicas; beside it procrastinate and pgqueuer "
                "running the handler a user writes (dedup key, notification, delivery, own transaction)",
    "http": "requests/s and p50/p99 of POST /admin/scheduled-events (and events/s of the batch route) "
            "on a real `scheduler serve` (uvicorn, "
            "127.0.0.1) from a separate load process: new keys, then the same keys re-posted",
    "shutdown": "time from stop to loop exit with a one-hour poll interval: run_blocking, async run, "
                "and the service lifespan",
    "memory": "RSS of one replica process after 1,000 and after 100,000 dispatched events (full path)",
    "profile": "cProfile of one replica's drain and the statements it sends per event (explains the "
               "mechanics ratio)",
    "burst": "lateness (dispatched_at - trigger_at: p50, p99, max) and time to the last dispatch when N "
             "reminders stored through the real store path fall due at one instant, 1/2/4 replicas on the full "
             "path in literal (short interval, checked against the drain formula) and prompt mode, beside "
             "pgqueuer and procrastinate draining the same burst as scheduled jobs (a no-op handler, and the "
             "handler a user writes: dedup key, notification, delivery); then one reminder alone",
    "console": "response time of the console's overview and filtered events pages (whole ASGI app, "
               "queries and templates) with 1,000,000 rows, mostly dispatched; and each overview query",
    "history": "what the history trigger costs a drain: one replica, no-op and full dispatch path, "
               "with the trigger enabled and disabled, alternated",
    "inbox": "latency from one replica's commit to a participant's SSE stream on another replica "
             "(uvicorn), with LISTEN/NOTIFY and on the hub's timer",
    "scale": "the claim (median, p99; alone and while other replicas hold batches), the console's overview "
             "and events pages, the /metrics scrape, each hot statement with its EXPLAIN (ANALYZE, BUFFERS), and "
             "retention, at 10k, 1M and 10M rows (--quick: 10k and 100k; --rows N ... to choose), loaded "
             "set-based and sampled side by side; ratio largest / smallest. Not part of `all`: at 10M rows "
             "it needs about 8 GB of disk and 20 minutes on two cores",
    "delivery": "trigger to delivered (p50, p99) when N reminders (default 10,000) fall due at once, each delivered "
                "by webhook to a local receiver answering after 100 ms: two `scheduler serve` replicas with the "
                "outbox, beside the in-process publisher path (a few hundred, extrapolated to N), procrastinate "
                "and pgqueuer running the same HTTP call as a job at the same concurrency. Not part of `all`",
}
ORDER = ("claim", "mechanics", "fullpath", "http", "shutdown", "memory", "profile", "burst", "console", "history",
         "inbox")
EXTRA = ("scale", "delivery")  # run by name only (too big for `all`)


def _claim(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import claim

    return claim.run(server, sizes=list(s.claim_sizes), samples=s.claim_samples, budget=s.claim_budget)


def _mechanics(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import drain, peers

    runs: list[dict[str, Any]] = []
    for replicas in s.replicas:
        for batch in s.batches:
            # Batch 20 carries the target ratio: its trio runs twice, interleaved, and the
            # best of each counts (noise from other work on the machine only slows a run).
            kinds = ("ours", "raw", "raw_same") if batch == 20 else ("ours", "raw")
            attempts: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
            for _ in range(s.repeats if batch == 20 else 1):
                for kind in kinds:
                    attempts[kind].append(drain.drain(server, kind, events=s.events, replicas=replicas, batch=batch))
            for kind in kinds:
                best = max(attempts[kind], key=lambda r: float(r["events_per_second"]))
                best["attempts_events_per_second"] = [r["events_per_second"] for r in attempts[kind]]
                runs.append(best)
        for peer in peers.PEERS:
            runs.append(peers.drain(server, peer, events=s.events, replicas=replicas, batch=20))
        # pgqueuer's own default batch is 10: ours is compared with it at 10 and at 20.
        runs.append(peers.drain(server, "pgqueuer", events=s.events, replicas=replicas, batch=10))
    one = next(r for r in runs if r["kind"] == "ours" and r["replicas"] == 1 and r["batch_size"] == 20)
    poll_cost = one["seconds"] / -(-s.events // 20)
    formula = [
        drain.formula_check(server, events=s.formula_events, replicas=r, batch=20,
                            poll_seconds=s.formula_poll, poll_cost_seconds=poll_cost)
        for r in s.replicas[:2]
    ]
    return {"events": s.events, "runs": runs, "formula": formula}


def _fullpath(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import drain, peers

    runs: list[dict[str, Any]] = []
    mechanics: list[dict[str, Any]] = []
    for r in s.replicas:
        # The mechanics (no-op dispatcher) beside each full drain, interleaved, so the ratio
        # full / mechanics comes from one run even without the mechanics benchmark.
        mechanics.append(drain.drain(server, "ours", events=s.full_events, replicas=r, batch=20))
        runs.append(drain.drain(server, "full", events=s.full_events, replicas=r, batch=20))
    # The peers with the handler a user writes for a reminder (dedup, notification,
    # delivery, its own transaction): the fair comparison for the full path.
    peer_runs = [peers.drain(server, peer, events=s.full_events, replicas=r, batch=20, handler="work")
                 for r in s.replicas for peer in peers.PEERS]
    return {"events": s.full_events, "runs": runs, "mechanics": mechanics, "peers": peer_runs}


def _http(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import http_load

    # the batch route's phases (1 and 8 clients) run once, in the first server's run, beside
    # that run's single POST from one client
    return {
        str(c): http_load.run(server, requests=s.http_requests, concurrency=c, seconds=s.http_seconds,
                              batch_concurrency=(1, 8) if index == 0 else ())
        for index, c in enumerate(s.http_concurrency)
    }


def _shutdown(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import shutdown

    return shutdown.run(server, repeats=s.shutdown_repeats)


def _memory(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import memory

    return memory.run(server, events=s.memory_events)


def _profile(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import profile

    return {
        "mechanics": profile.run(server, events=s.profile_events, kind="ours"),
        "fullpath": profile.run(server, events=s.profile_events // 2, kind="full"),
    }


def _burst(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import burst

    return burst.run(server, events=s.burst_events, replicas=s.burst_replicas, single_modes=s.burst_single_modes)


def _console(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import console

    return console.run(server, rows=s.console_rows, samples=s.console_samples)
def _history(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import lifecycle

    return lifecycle.run(server, events=s.full_events, rounds=s.repeats + 1)


def _inbox(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import inbox

    return inbox.run(server, events=s.formula_events // 10)


def _scale(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import scale

    return scale.run(server, sizes=list(s.scale_sizes), samples=s.scale_samples, budget=s.scale_budget,
                     page_samples=s.scale_page_samples)


def _delivery(server: Any, s: Sizes, results: dict[str, Any]) -> dict[str, Any]:
    from bench import delivery

    return delivery.run(server, events=s.delivery_events, concurrency=s.delivery_concurrency,
                        batch_size=s.delivery_batch, rounds=s.delivery_rounds)


RUNNERS: dict[str, Callable[[Any, Sizes, dict[str, Any]], dict[str, Any]]] = {
    "claim": _claim, "mechanics": _mechanics, "fullpath": _fullpath, "http": _http,
    "shutdown": _shutdown, "memory": _memory, "profile": _profile, "burst": _burst, "console": _console,
    "history": _history, "inbox": _inbox, "scale": _scale, "delivery": _delivery,
}


def run_benchmarks(names: Sequence[str], *, quick: bool, out: Path, database_url: str | None,
                   burst_events: int | None = None, rows: Sequence[int] | None = None,
                   concurrency: int | None = None, batch_size: int | None = None,
                   rounds: int | None = None) -> int:
    """Run ``names`` in order; one failing benchmark is reported and the others still run."""
    from bench import report
    from bench.env import Server, machine_facts, progress

    # Every fresh database is migrated: keep Alembic's per-migration INFO lines out of the progress.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    sizes = QUICK if quick else FULL
    if burst_events is not None:
        if burst_events < 1:
            raise SystemExit("--events must be at least 1")
        sizes = dataclasses.replace(sizes, burst_events=burst_events, delivery_events=burst_events)
    if concurrency is not None:
        if not 1 <= concurrency <= 256:
            raise SystemExit("--concurrency must be 1 to 256 (SCHEDULER_DELIVERY_CONCURRENCY's range)")
        sizes = dataclasses.replace(sizes, delivery_concurrency=concurrency)
    if batch_size is not None:
        if batch_size < 1:
            raise SystemExit("--batch-size must be at least 1")
        sizes = dataclasses.replace(sizes, delivery_batch=batch_size)
    if rounds is not None:
        if rounds < 1:
            raise SystemExit("--rounds must be at least 1")
        sizes = dataclasses.replace(sizes, delivery_rounds=rounds)
    if rows:
        if min(rows) <= 1_000:
            raise SystemExit("--rows: every size must be above the 1,000 pending rows")
        sizes = dataclasses.replace(sizes, scale_sizes=tuple(sorted(set(rows))))
    started = time.perf_counter()
    results: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": quick, "sizes": sizes.__dict__, "machine": machine_facts(),
        "benchmarks": {}, "errors": {},
    }
    server = Server(database_url)
    results["server"] = server.facts()
    for name in names:
        progress(f"{name}: {DESCRIPTIONS[name]}")
        try:
            results["benchmarks"][name] = RUNNERS[name](server, sizes, results)
        except Exception as exc:  # noqa: BLE001 -- one benchmark's failure must not lose the others' figures
            progress(f"{name} FAILED: {type(exc).__name__}: {exc}")
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            results.setdefault("tracebacks", {})[name] = traceback.format_exc()
    results["seconds"] = time.perf_counter() - started
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    json_path, md_path = report.write(results, out)
    sys.stdout.write(report.markdown(results))
    progress(f"done in {results['seconds']:.0f}s: {json_path} and {md_path}")
    return 1 if results["errors"] else 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a smaller run (about five minutes): 10k/100k claim sizes, 2,000 events, 1-2 replicas, "
                             "a burst of 2,000")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where the JSON and Markdown results go (default {DEFAULT_OUT})")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                        help="a PostgreSQL server to create the benchmark databases on (needs CREATEDB); "
                             "default: DATABASE_URL, else the embedded server in $SCHEDULER_DATA_DIR/pgdata")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark subcommands to ``parser`` (``python -m bench`` or ``scheduler bench``)."""
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    every = sub.add_parser("all", help="every benchmark, one table (about twenty minutes; --quick: about five)",
                           description="Run every benchmark in one go: " + "; ".join(
                               f"{n}: {DESCRIPTIONS[n]}" for n in ORDER) + ".")
    _common(every)
    every.set_defaults(bench_names=ORDER)
    for name in ORDER + EXTRA:
        one = sub.add_parser(name, help=DESCRIPTIONS[name], description=DESCRIPTIONS[name] + ".")
        _common(one)
        one.set_defaults(bench_names=(name,))
        if name == "burst":
            one.add_argument("--events", type=int, default=None, metavar="N",
                             help=f"reminders due at once (default {FULL.burst_events:,}; "
                                  f"--quick: {QUICK.burst_events:,})")
        if name == "delivery":
            one.add_argument("--events", type=int, default=None, metavar="N",
                             help=f"reminders due at once (default {FULL.delivery_events:,}; "
                                  f"--quick: {QUICK.delivery_events:,})")
            one.add_argument("--concurrency", type=int, default=None, metavar="C",
                             help=f"sends at once per replica, and per peer worker (default "
                                  f"{FULL.delivery_concurrency})")
            one.add_argument("--batch-size", type=int, default=None, metavar="B",
                             help=f"the outbox replicas' SCHEDULER_BATCH_SIZE (default {FULL.delivery_batch}; "
                                  "the service's own default is 20)")
            one.add_argument("--rounds", type=int, default=None, metavar="R",
                             help="run the outbox and pgqueuer R times, taking turns at going first, and report "
                                  "every round's p99 and each one's median round (default 1)")
        if name == "scale":
            one.add_argument("--rows", type=int, nargs="+", default=None, metavar="N",
                             help="table sizes to measure side by side (default "
                                  f"{' '.join(str(n) for n in FULL.scale_sizes)}; --quick: "
                                  f"{' '.join(str(n) for n in QUICK.scale_sizes)}); the smallest is the "
                                  "ratio's base")


def _run(args: argparse.Namespace, settings: Any = None) -> int:
    return run_benchmarks(args.bench_names, quick=args.quick, out=args.out, database_url=args.database_url,
                          burst_events=getattr(args, "events", None), rows=getattr(args, "rows", None),
                          concurrency=getattr(args, "concurrency", None), batch_size=getattr(args, "batch_size", None),
                          rounds=getattr(args, "rounds", None))


EPILOG = ("Figures are ratios measured side by side in one run; absolute times on a shared machine "
          "mean little. Each benchmark uses its own fresh database, dropped afterwards. "
          "procrastinate and pgqueuer are optional: pip install -e '.[bench]'. See docs/performance.md.")


def add_bench_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``scheduler bench ...`` (called by scheduler.cli when this package is importable)."""
    parser = sub.add_parser("bench", help="benchmarks: claim cost, drain throughput, HTTP, shutdown, memory",
                            description="Benchmarks of the scheduler, on the embedded PostgreSQL by default.",
                            epilog=EPILOG)
    configure(parser)
    parser.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench",
                                     description="Benchmarks of the scheduler, on the embedded PostgreSQL by default.",
                                     epilog=EPILOG)
    configure(parser)
    args = parser.parse_args(argv)
    return _run(args)
