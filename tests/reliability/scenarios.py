"""Running a fault scenario of ``python -m reliability`` at a small size, as CI does (REL-17).

Every scenario registered in ``reliability.__main__.SCENARIOS`` has a test that calls
``run_small_scenario`` with the scenario's name written out (the registry test reads those
calls from the tests' source), so a scenario cannot rot unseen: it runs, small, in every CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from reliability.__main__ import SCENARIOS
from reliability.cluster import ROOT


def suite_pgdata() -> Path | None:
    """The embedded server the suite already runs (tests/conftest.py), shared by the scenario;
    None when the suite runs on a server of its own (SCHEDULER_TEST_DATABASE_URL)."""
    if os.environ.get("SCHEDULER_TEST_DATABASE_URL"):
        return None
    return Path(os.environ.get("SCHEDULER_TEST_PGDATA")
                or Path(tempfile.gettempdir()) / f"scheduler-tests-pg-{os.getuid()}")


@dataclass(frozen=True)
class ScenarioRun:
    """What a scenario printed, and its figures (the ``figures-json`` line)."""

    stdout: str
    stderr: str
    figures: dict[str, Any]

    def output(self) -> str:
        """The end of both streams, for an assertion's message."""
        return self.stdout[-4000:] + self.stderr[-3000:]


def run_small_scenario(name: str, args: list[str], tmp_path: Path, *, timeout: float,
                       pgdata: Path | None = None, env: dict[str, str] | None = None) -> ScenarioRun:
    """``python -m reliability NAME ARGS`` on the suite's embedded server (or ``pgdata``, a
    server of the scenario's own), its replicas' logs under ``tmp_path``; asserts that it
    exited 0, said ``== NAME: passed``, and its figures show nothing lost and no problem.
    ``env``: variables for the scenario beyond the suite's (whose SCHEDULER_* are dropped, so
    that no test setting reaches a replica)."""
    assert name in {registered for registered, _, _ in SCENARIOS}, f"no scenario {name!r} in reliability"
    server = pgdata or suite_pgdata()
    if server is None:
        pytest.skip("the scenario needs the embedded server (SCHEDULER_TEST_DATABASE_URL is set)")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    environment.update(env or {})
    command = [sys.executable, "-m", "reliability", name, *args, "--pgdata", str(server),
               "--workdir", str(tmp_path / "work")]
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                            timeout=timeout, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("figures-json: ")]
    run = ScenarioRun(result.stdout, result.stderr,
                      json.loads(lines[-1].removeprefix("figures-json: ")) if lines else {})
    assert result.returncode == 0, run.output()
    assert f"== {name}: passed" in result.stdout, run.output()
    assert run.figures.get("lost") == 0 and run.figures.get("problems") == 0, run.output()
    return run
