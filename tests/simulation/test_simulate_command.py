"""The seeded random driver and ``scheduler simulate``: seed first, clean summary, replayable failures."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness import Simulation
from harness.driver import FAULTS, run_random
from scheduler.cli import main


@pytest.mark.clause("SIM-8")
def test_the_same_seed_replays_the_same_program_and_summary(database_url: str) -> None:
    """SIM-8: two runs from one seed take the same steps and end in the same state."""
    runs = []
    for _ in range(2):
        with Simulation(database_url, seed=7, replicas=3, batch_size=3, participants=3) as sim:
            run_random(sim, 150, random.Random(7), frozenset(FAULTS))
            runs.append((sim.program, sim.summary(), sorted(
                (r.id, r.status, r.version) for r in sim.observer.rows().values())))
    assert runs[0] == runs[1]


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The command runs against this test's server; it creates and drops its own database."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.clause("SIM-8")
def test_the_simulate_command_prints_the_seed_first_and_ends_with_a_clean_summary(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-8: the seed comes first; the summary gives steps by kind, events, faults, checks and replay."""
    code = main(["simulate", "--replicas", "3", "--steps", "120", "--seed", "5", "--batch-size", "4"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "simulation seed: 5"
    for expected in ("steps: ", "  by kind: ", "events: ", "faults injected: ", "invariant checks: "):
        assert any(line.startswith(expected) for line in lines), (expected, out)
    assert lines[-1] == "replay: scheduler simulate --replicas 3 --steps 120 --seed 5 --batch-size 4"
    assert "120/120 steps" in err  # the progress line


@pytest.mark.clause("SIM-8")
def test_a_caught_variant_prints_the_invariant_the_program_and_the_replay_command(
    cli_env: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-8: a violation prints the invariant, the program, a pytest file that replays it, the command."""
    args = ["simulate", "--scheduler", "batch-of-21", "--replicas", "2", "--batch-size", "3",
            "--steps", "300", "--seed", "1", "--faults", "none"]
    code = main(args)
    out, _ = capsys.readouterr()
    assert code == 1
    assert out.splitlines()[0] == "simulation seed: 1"
    assert "INVARIANT VIOLATED: SIM-1 violated at step" in out
    assert "    sim.claim(" in out
    replay = ("replay: scheduler simulate --replicas 2 --steps 300 --seed 1 --faults none "
              "--scheduler batch-of-21 --batch-size 3")
    assert replay in out
    assert "broken variant 'batch-of-21' caught by SIM-1 as expected" in out
    source = (cli_env / "simulation" / "seed-1.py").read_text()
    namespace: dict[str, object] = {}
    exec(compile(source, "seed-1.py", "exec"), namespace)
    with pytest.raises(pytest.fail.Exception, match="SIM-1 violated"):
        namespace["test_seed_1_sim_1"](database_url)  # type: ignore[operator]


def test_the_simulate_command_refuses_bad_arguments_with_a_clear_message(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input is a usage error naming the option, before any database is touched."""
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--faults", "crash,meteor"])
    assert exit_info.value.code == 2
    assert "unknown faults ['meteor']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--replicas", "0"])
    assert "--replicas must be between 1 and 16" in capsys.readouterr().err
    for hostile in ("+5", " 5", "5_0", "\u00b2", "\u0663", "5.0", "-1", "9" * 1000):
        with pytest.raises(SystemExit) as exit_info:
            main(["simulate", "--steps", hostile])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--steps must be" in err and "Traceback" not in err, (hostile, err)


@pytest.mark.clause("SIM-8")
@pytest.mark.clause("SIM-CI-1")
def test_python_dash_m_harness_runs_the_same_simulation_without_faults(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-8, SIM-CI-1: ``python -m harness`` takes the same options; its seed comes first (on
    stderr under --json, whose stdout is one JSON document), its replay names it."""
    from harness.__main__ import main as harness_main

    code = harness_main(["--replicas", "2", "--steps", "60", "--seed", "9", "--faults", "none", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert err.splitlines()[0] == "simulation seed: 9"  # with --json, stdout is the JSON alone
    summary = json.loads(out)
    assert summary["replay"] == "scheduler simulate --replicas 2 --steps 60 --seed 9 --faults none"
    assert summary["faults"] == {} and summary["steps_total"] >= 60


@pytest.mark.clause("SIM-CI-1")
def test_a_caught_variant_under_json_writes_one_json_document_and_no_text(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-CI-1: a violation under --json is one JSON document on stdout (the invariant, the
    program, the regression file, the replay); the text report goes to stderr; exit 1. The
    built-in platform's failure is not shrunk unless asked (its output stays as it was)."""
    code = main(["simulate", "--scheduler", "batch-of-21", "--replicas", "2", "--batch-size", "3",
                 "--steps", "300", "--seed", "1", "--faults", "none", "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    report = json.loads(out)
    assert report["result"] == "violation" and report["clause"] == "SIM-1" and not report["shrunk"]
    assert report["replay"].startswith("scheduler simulate --replicas 2 --steps 300 --seed 1")
    assert Path(report["regression_file"]).exists()
    assert "INVARIANT VIOLATED: SIM-1" in err and "shrinking" not in err
