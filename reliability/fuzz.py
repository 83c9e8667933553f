"""The nightly-style fuzz run: the CI test tests/security/test_fuzz_openapi.py with many more
cases and a fresh seed (printed, so a failure replays with ``--seed``).

schemathesis generates valid and invalid requests for every operation in /openapi.json as
admin, ingest, participant and anonymous callers; no answer may be a 5xx, every 4xx must be
JSON with a detail, and the table must hold exactly the rows that answered 201.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Any

from reliability.cluster import ROOT
from reliability.report import report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=350,
                        help="examples per operation and generation mode (default 350: about 5000 cases)")


def run(args: argparse.Namespace) -> int:
    env = {**os.environ, "SCHEDULER_FUZZ_EXAMPLES": str(args.examples), "SCHEDULER_FUZZ_SEED": str(args.seed),
           "SCHEDULER_TEST_PGDATA": os.environ.get("SCHEDULER_TEST_PGDATA", args.pgdata + "-tests")}
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
               "tests/security/test_fuzz_openapi.py"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    print(result.stdout[-4000:])
    figures: dict[str, Any] = {"seed": args.seed, "examples_per_operation_and_mode": args.examples}
    match = re.search(r"fuzzed (\d+) cases: statuses (\{[^}]*\}); rows created (\d+)", result.stdout)
    problems = []
    if match:
        figures.update(cases=int(match[1]), statuses=match[2], rows_created_201=int(match[3]))
    if result.returncode != 0:
        problems.append(f"pytest exited {result.returncode}: see the output above")
        print(result.stderr[-4000:], file=sys.stderr)
    figures["lost"] = 0 if result.returncode == 0 else 1
    return report("fuzz", figures, problems,
                  f"python -m reliability fuzz --seed {args.seed} --examples {args.examples}")
