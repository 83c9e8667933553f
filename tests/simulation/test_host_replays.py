"""What a host's CI is handed after a failure replays that failure: the run records the
``--setup`` it was given (SIM-HOST-6), and shrinking keeps the invariant the run reported
(SIM-HOST-7)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from harness import Simulation, Violation, load_host
from harness.host import source_of
from harness.shrink import replay, shrink
from scheduler.cli import main
from tests.simulation.broken_hosts import BROKEN_WITHOUT_SETUP, CARELESS, SETUP_PATH
from tests.simulation.host_example import EXAMPLE

WITHOUT_SETUP = "tests.simulation.broken_hosts:BROKEN_WITHOUT_SETUP"


@pytest.mark.clause("SIM-HOST-6")
def test_a_loaded_host_records_its_setup_path_for_its_regression_test() -> None:
    """SIM-HOST-6: ``load_host`` keeps the ``--setup`` path beside the dispatcher's, and the
    regression test's source names both; without one, it names the dispatcher alone."""
    host = load_host(WITHOUT_SETUP, SETUP_PATH)
    assert (host.path, host.setup_path) == (WITHOUT_SETUP, SETUP_PATH)
    assert host.setup is not None and BROKEN_WITHOUT_SETUP.setup is None
    assert source_of(host) == f"load_host({WITHOUT_SETUP!r}, {SETUP_PATH!r})"
    assert source_of(load_host(WITHOUT_SETUP)) == f"load_host({WITHOUT_SETUP!r})"


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(EXAMPLE)
    return tmp_path


@pytest.mark.clause("SIM-HOST-6")
def test_a_failure_found_with_a_setup_replays_with_that_setup_from_its_command_and_its_regression_test(
    cli_env: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-HOST-6: a host whose tables only ``--setup`` creates fails SIM-12; the printed replay
    command and the regression test both carry the setup, so each fails SIM-12 again on a
    database without the host's tables (forgetting it, they would fail on a missing table)."""
    code = main(["simulate", "--dispatcher", WITHOUT_SETUP, "--setup", SETUP_PATH, "--seed", "1", "--json",
                 "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 1, err
    report = json.loads(out)
    assert report["clause"] == "SIM-12", report
    assert report["replay"].endswith(f"--dispatcher {WITHOUT_SETUP} --setup {SETUP_PATH}"), report["replay"]
    source = Path(report["regression_file"]).read_text()
    assert f"host=load_host({WITHOUT_SETUP!r}, {SETUP_PATH!r})" in source
    # The test's own database is fresh: no host_deliveries until the setup makes it.
    namespace: dict[str, object] = {}
    exec(compile(source, "seed-1.py", "exec"), namespace)
    with pytest.raises(pytest.fail.Exception, match="SIM-12 violated"):
        namespace["test_seed_1_sim_12"](database_url)  # type: ignore[operator]
    code = main([*shlex.split(report["replay"])[1:], "--json", "--no-progress", "--no-shrink"])
    again = json.loads(capsys.readouterr().out)
    assert code == 1 and again["clause"] == "SIM-12" and again["step"] == report["step"], again


def _careless(database_url: str) -> Simulation:
    return Simulation(database_url, seed=7, replicas=1, participants=4, host=CARELESS)


@pytest.mark.clause("SIM-HOST-7")
def test_shrinking_keeps_the_reported_invariant_when_a_shorter_program_breaks_another(database_url: str) -> None:
    """SIM-HOST-7: the careless host breaks SIM-12 (a delivery committed before its batch) and,
    in shorter programs, SIM-4 (a delivery to a participant who opted out). The run reported
    SIM-12, so the shrunk program must still break SIM-12, not whichever clause fails first."""
    with _careless(database_url) as sim:
        with pytest.raises(Violation) as info:
            sim.post(user=0, trigger=-5)  # p0: its delivery commits before its batch does
            sim.post(user=3, trigger=-1)  # p3 opted out: the host expects a failure, gets a delivery
            sim.claim(0)
            sim.dispatch(0)  # p0's delivery is visible, its dispatch is not: SIM-12
        program = list(sim.program)
    assert info.value.clause == "SIM-12", info.value

    def make() -> Simulation:
        return _careless(database_url)

    # Shorter programs that break another invariant: without p0's post, or without the steps
    # that hold p0's batch open while its delivery shows (the drain's loop dispatches both).
    for shorter in (program[1:], program[:2]):
        other = replay(make, shorter)
        assert other is not None and other.clause == "SIM-4", (shorter, other)
    shrunk = shrink(make, program, "SIM-12")
    assert shrunk is not None, "the reported failure did not replay"
    assert shrunk.violation.clause == "SIM-12", shrunk
    assert len(shrunk.program) < len(program)
    again = replay(make, shrunk.program)
    assert again is not None and again.clause == "SIM-12", (shrunk.program, again)
