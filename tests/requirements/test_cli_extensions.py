"""The ``scheduler`` command starts without the test harness or the benchmarks (OPS-23).

In our words: ``simulate`` (the replica simulation) and ``bench`` (the benchmarks, a folder
of the checkout) are listed by ``scheduler --help`` but imported only when they run, so
nothing in them can stop ``scheduler serve``; ``bench`` runs from a checkout and says where
to run it otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import extensions
from scheduler.config import Settings

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # seconds: one interpreter start, on a loaded machine

PROBE = """
import json, sys
from scheduler.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'harness', 'bench', 'hypothesis', 'pytest'})))
"""


def _imported_by(argv: list[str], cwd: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=cwd, capture_output=True,
                          text=True, timeout=TIMEOUT, check=True)
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.clause("DEC-PKG-1")
@pytest.mark.clause("OPS-23")
@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["events", "list", "--help"], ["token", "--help"]])
def test_the_command_starts_without_importing_the_harness_or_the_benchmarks(argv: list[str]) -> None:
    """OPS-23: ``scheduler --help`` and ``scheduler serve --help`` (and the other commands)
    import neither ``harness`` nor ``bench`` (nor a test library), even run from the checkout's
    root where ``bench`` is importable."""
    assert _imported_by(argv, ROOT) == []


@pytest.mark.clause("OPS-23")
def test_simulate_and_bench_are_imported_when_they_run(tmp_path: Path) -> None:
    """OPS-23: ``scheduler simulate --help`` shows the harness's own options; ``scheduler bench
    --help`` finds the checkout's bench/ from any directory; ``python -m bench`` runs from the
    checkout's root."""
    assert _imported_by(["simulate", "--help"], tmp_path) == ["harness"]
    assert _imported_by(["bench", "--help"], tmp_path) == ["bench"]

    def run(*args: str, cwd: Path) -> str:
        done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                              timeout=TIMEOUT, check=True)
        return done.stdout

    assert "--replicas" in run("-m", "scheduler", "simulate", "--help", cwd=tmp_path)
    assert "usage: scheduler bench" in run("-m", "scheduler", "bench", "--help", cwd=tmp_path)
    assert "usage: python -m bench" in run("-m", "bench", "--help", cwd=ROOT)


@pytest.mark.clause("OPS-23")
def test_a_checkout_only_command_without_its_folder_says_where_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """OPS-23: where the checkout's folder is missing (an installed wheel has no bench/), the
    command exits 2 saying to run it from a checkout, with the command to use there."""
    missing = extensions.Extension("bench", "no_such_folder.cli", "add_bench_command", "benchmarks",
                                   checkout_only=True)
    assert extensions.run_extension(missing, ["--help"], Settings()) == 2
    err = capsys.readouterr().err
    assert "runs from a checkout of the repository" in err and "python -m no_such_folder" in err


@pytest.mark.clause("OPS-23")
def test_arguments_the_command_does_not_know_are_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """OPS-23: leaving the extensions' arguments to their own parsers does not let a typo
    through elsewhere: ``scheduler serve --prot 1`` is a usage error (exit 2)."""
    from scheduler.cli import main

    with pytest.raises(SystemExit) as done:
        main(["serve", "--prot", "1"])
    assert done.value.code == 2
    assert "unrecognized arguments: --prot 1" in capsys.readouterr().err
