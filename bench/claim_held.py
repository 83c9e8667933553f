"""What rows held in quiet hours cost the claim (PERF-9): ``python -m bench.claim_held``.

Two fresh databases side by side, each with 1,000 due pending rows (the claim benchmark's,
``bench claim``) and 30,000 terminal ones; the second also holds ``--held`` (default 10,000)
pending rows held in their participants' quiet hours: due by ``trigger_at`` before every due
row, ``not_before`` eight hours ahead. Production's claim is sampled round-robin on both
(``bench.claim.measure``: median, p90, EXPLAIN ANALYZE BUFFERS). Prints the JSON; see
docs/performance.md, "Held rows". No time is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from bench.claim import PENDING, measure
from bench.env import Server, bench_engine, load_events, machine_facts, progress

TERMINAL = 30_000


def run(server: Server, *, held: int, samples: int, budget: float) -> dict[str, Any]:
    """The claim without and with ``held`` held rows, measured side by side."""
    import contextlib

    with contextlib.ExitStack() as stack:
        engines = {}
        for count in (0, held):
            url = stack.enter_context(server.fresh_database(f"claim_held_{count}"))
            engines[count] = bench_engine(url)
            stack.callback(engines[count].dispose)
            started = time.perf_counter()
            load_events(engines[count], pending=PENDING, terminal=TERMINAL, held=count)
            progress(f"claim_held: loaded {PENDING:,} due, {TERMINAL:,} terminal and {count:,} held rows "
                     f"in {time.perf_counter() - started:.1f}s")
        figures = measure(engines, samples, budget)
    without, with_held = figures[0], figures[held]
    return {"pending": PENDING, "terminal": TERMINAL, "held": held, "without_held": without, "with_held": with_held,
            "ratio_median": with_held["median_ms"] / without["median_ms"], "machine": machine_facts()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_held", description=__doc__)
    parser.add_argument("--held", type=int, default=10_000, help="held rows in the second table (default 10,000)")
    parser.add_argument("--samples", type=int, default=300, help="claims sampled on each table (default 300)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of sampling at most (default 10)")
    parser.add_argument("--database-url", default=None, help="as for python -m bench")
    args = parser.parse_args()
    logging.getLogger("alembic").setLevel(logging.WARNING)
    result = run(Server(args.database_url), held=args.held, samples=args.samples, budget=args.budget)
    progress(f"claim_held: median {result['without_held']['median_ms']:.3f} ms without held rows, "
             f"{result['with_held']['median_ms']:.3f} ms with {args.held:,} (x{result['ratio_median']:.2f})")
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
