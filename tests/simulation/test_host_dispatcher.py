"""A host's dispatcher in the simulation: the invariants for any dispatcher, the host's hooks,
faults that wrap it, and ``scheduler simulate --dispatcher`` finding a broken one by itself."""

from __future__ import annotations

import dataclasses
import json
import random
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from harness import Expected, Simulation, Violation, load_host
from harness.driver import FAULTS, run_random
from harness.sim_runner import SimulationRunner
from scheduler.cli import main
from tests.simulation.host_example import EXAMPLE, import_example

import_example()
from host_app.dispatcher import DeliveryDispatcher, create_tables  # noqa: E402
from host_app.simulation import HOST, REFUSING  # noqa: E402


@pytest.mark.clause("SIM-HOST-1")
@pytest.mark.clause("SIM-12")
def test_a_correct_host_dispatcher_holds_every_invariant_for_any_dispatcher_under_every_fault(
    database_url: str,
) -> None:
    """SIM-HOST-1: the example host's dispatcher, every fault on: clean, its effects checked
    after every step (SIM-12), and no ``refused`` fault (the built-in platform's refusal) posted."""
    with Simulation(database_url, seed=4, replicas=3, batch_size=3, participants=4, host=HOST) as sim:
        run_random(sim, 150, random.Random(4), frozenset(FAULTS))
        summary = sim.summary()
    assert summary["dispatcher"] == "host_app"
    assert summary["checks"]["SIM-12"] > 150
    assert "event-refused" not in summary["faults"]
    assert summary["faults"].get("event-python-error", 0) + summary["faults"].get("event-database-error", 0) > 0
    assert summary["events_failed"] > 0 and summary["events_dispatched"] > 0


@pytest.mark.clause("SIM-HOST-1")
def test_the_refused_fault_is_never_applied_to_a_host_dispatcher(database_url: str) -> None:
    """SIM-HOST-1: ``refused`` assumes the built-in platform refuses an unusable time scope; a
    host's run refuses to post it instead of expecting a failure its dispatcher never makes."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        create_tables(conn)  # a bare factory has no setup hook: its table is made here
    engine.dispose()
    with Simulation(database_url, dispatcher_factory=DeliveryDispatcher) as sim:
        assert sim.event_faults == ("python", "database", "slow")
        with pytest.raises(ValueError, match="assumes the built-in platform's refusal"):
            sim.post(user=0, trigger=-1, fault="refused")
        sim.post(user=0, trigger=-1, fault="slow")   # slow: dispatched all the same
        sim.post(user=1, trigger=-1, fault="python")  # raises after the dispatcher: failed
        sim.run(0)
        sim.drain()
        statuses = sorted(r.status for r in sim.observer.rows().values())
    assert statuses == ["dispatched", "failed"]


@pytest.mark.clause("SIM-HOST-2")
def test_the_hosts_expectation_of_an_event_is_checked_status_and_reason(database_url: str) -> None:
    """SIM-HOST-2: the opted-out participant's event fails; a host that expects it dispatched,
    or failed for another reason, is told so under SIM-4, by the dispatch and the loop steps."""
    loaded = load_host("host_app.simulation:HOST")
    assert loaded.path == "host_app.simulation:HOST" and loaded.expect is HOST.expect
    for expect, needle in ((lambda event: None, "expected dispatched"),
                           (lambda event: Expected("failed", reason="moved away"), "does not name")):
        for step in ("dispatch", "run"):
            host = dataclasses.replace(HOST, expect=expect)
            with Simulation(database_url, participants=4, host=host) as sim:
                sim.post(user=3, trigger=-1)
                with pytest.raises(Violation) as info:
                    if step == "run":
                        sim.run(0)
                    else:
                        sim.claim(0)
                        sim.dispatch(0)
            assert info.value.clause == "SIM-4" and needle in info.value.message, (step, info.value)
    with Simulation(database_url, participants=4, host=HOST) as sim:  # the true expectation: clean
        sim.post(user=3, trigger=-1)
        sim.post(user=0, trigger=-1)
        sim.run(0)
        sim.drain()


def _last_errors(database_url: str) -> dict[str, tuple[str, str | None]]:
    """Each row's facts' fault, with its status and ``last_error``."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT facts->>'sim_fault' AS fault, status, last_error"
                                      " FROM scheduler.scheduled_events"))
            return {str(r.fault): (r.status, r.last_error) for r in found}
    finally:
        engine.dispose()


@pytest.mark.clause("SIM-HOST-5")
def test_a_host_that_returns_its_refusal_fails_the_event_with_its_reason_whatever_fault_it_carries(
    database_url: str,
) -> None:
    """SIM-HOST-5: the example host's refusing dispatcher returns ``DispatchResult(refusal="opted
    out")`` for p3, as docs/embedding.md shows, and its ``expect`` says so: p3's events fail
    naming the reason under every fault (none applies to a refused event), through the
    dispatch step and the loop's run step alike, with no violation."""
    faults = ("python", "database", "slow", None)
    for step in ("dispatch", "run"):
        with Simulation(database_url, participants=4, host=REFUSING) as sim:
            for fault in faults:
                sim.post(user=3, trigger=-1, fault=fault)
            if step == "run":
                sim.run(0)
            else:
                sim.claim(0)
                for _ in faults:
                    sim.dispatch(0)
                sim.finish(0)
            sim.drain()
            found = _last_errors(sim.url)
        assert {fault: status for fault, (status, _) in found.items()} == {str(f): "failed" for f in faults}, step
        assert all(error == "opted out" for _, error in found.values()), (step, found)


@pytest.mark.clause("SIM-HOST-5")
def test_the_pytest_plugins_run_of_the_refusing_host_at_seed_1_is_clean(
    scheduler_simulation: SimulationRunner,
) -> None:
    """SIM-HOST-5: the plugin's seeded run of the refusing host (which raised a SIM-4 violation
    at step 40 while the model took a refusal for a raise) holds every invariant."""
    scheduler_simulation.run(REFUSING, seed=1, steps=120)


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(EXAMPLE)
    return tmp_path


@pytest.mark.clause("SIM-HOST-3")
@pytest.mark.clause("SIM-12")
@pytest.mark.clause("SIM-CI-1")
def test_the_broken_host_dispatcher_is_found_at_the_default_budget_shrunk_and_replayed(
    cli_env: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-HOST-3, SIM-CI-1: a delivery row written outside the scheduler's transaction is found
    by the default budget, shrunk, written as a regression test that fails on it, and the
    printed command finds it again; --json's stdout is one JSON document, failure or not."""
    code = main(["simulate", "--dispatcher", "host_app.simulation:BROKEN", "--seed", "1", "--json",
                 "--no-progress", "--junit-xml", str(cli_env / "junit.xml")])
    out, err = capsys.readouterr()
    assert code == 1, err
    report = json.loads(out)  # the whole of stdout
    assert err.splitlines()[0] == "simulation seed: 1"
    assert report["result"] == "violation" and report["clause"] == "SIM-12", report
    assert report["shrunk"] and len(report["program"]) < report["steps_total"] <= 1000 + 100
    assert report["replay"] == ("scheduler simulate --replicas 4 --steps 1000 --seed 1 "
                                "--dispatcher host_app.simulation:BROKEN")
    failure = ET.parse(cli_env / "junit.xml").getroot().find("testcase/failure")
    assert failure is not None and failure.get("type") == "SIM-12"
    source = Path(report["regression_file"]).read_text()
    assert "def test_seed_1_sim_12(scheduler_database_url: str)" in source
    namespace: dict[str, object] = {}
    exec(compile(source, "seed-1.py", "exec"), namespace)
    with pytest.raises(pytest.fail.Exception, match="SIM-12 violated"):
        namespace["test_seed_1_sim_12"](database_url)  # type: ignore[operator]
    code = main([*shlex.split(report["replay"])[1:], "--json", "--no-progress", "--no-shrink"])
    again = json.loads(capsys.readouterr().out)
    assert code == 1 and again["clause"] == "SIM-12" and again["step"] == report["step"], again


@pytest.mark.clause("SIM-CI-1")
def test_a_clean_host_run_writes_pure_json_and_a_passing_junit_suite(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-CI-1: success is one JSON document too (seed and progress on stderr), and JUnit XML
    holds one passing test case naming the seed; a bare factory plus --setup works alike."""
    junit = cli_env / "ok.xml"
    code = main(["simulate", "--dispatcher", "host_app.dispatcher:DeliveryDispatcher", "--setup",
                 "host_app.dispatcher:create_tables", "--steps", "80", "--seed", "2", "--replicas", "2",
                 # a bare factory has no expect hook: p3 (opted out, so failing) stays out of it
                 "--participants", "3",
                 "--json", "--junit-xml", str(junit)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    summary = json.loads(out)
    assert summary["result"] == "clean" and summary["dispatcher"] == "host_app.dispatcher:DeliveryDispatcher"
    assert summary["replay"].endswith("--participants 3 --dispatcher host_app.dispatcher:DeliveryDispatcher "
                                      "--setup host_app.dispatcher:create_tables")
    assert "80/80 steps" in err
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and suite.find("testcase").get("name").startswith("seed 2")  # type: ignore[union-attr]


@pytest.mark.clause("SIM-HOST-5")
def test_the_refusing_host_is_clean_from_the_command_at_seed_1(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-HOST-5: ``scheduler simulate --dispatcher host_app.simulation:REFUSING --seed 1`` (a
    SIM-4 violation at step 40 while the model took a refusal for a raise) exits 0."""
    code = main(["simulate", "--dispatcher", "host_app.simulation:REFUSING", "--seed", "1", "--steps", "300",
                 "--json", "--no-progress", "--no-shrink"])
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == "simulation seed: 1"
    summary = json.loads(out)
    assert code == 0 and summary["result"] == "clean", summary
    assert summary["events_failed"] > 0 and summary["events_dispatched"] > 0


@pytest.mark.clause("SIM-HOST-4")
def test_a_dispatcher_or_setup_path_that_does_not_import_is_a_sentence_and_exit_2(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-HOST-4: every unusable path is named in one sentence on stderr, exit 2, no traceback;
    with --json stdout still holds one JSON document."""
    cases = [
        (["--dispatcher", "no_such_host.module:factory"], "module 'no_such_host.module' does not import"),
        (["--dispatcher", "host_app.simulation:NOPE"], "has no attribute 'NOPE'"),
        (["--dispatcher", "host_app.simulation"], "is not of the form package.module:name"),
        (["--dispatcher", "host_app.dispatcher:OPTED_OUT"], "neither a HostDispatcher nor a callable"),
        (["--setup", "host_app.dispatcher:create_tables"], "needs --dispatcher"),
        (["--dispatcher", "host_app.simulation:HOST", "--setup", "host_app.nowhere:f"], "--setup 'host_app.nowhere:f'"),
        (["--dispatcher", "host_app.simulation:HOST", "--scheduler", "batch-of-21"], "leave it out with --dispatcher"),
    ]
    for extra, needle in cases:
        code = main(["simulate", "--steps", "5", *extra, "--json"])
        out, err = capsys.readouterr()
        assert code == 2, (extra, out, err)
        assert needle in err and "Traceback" not in err, (extra, err)
        assert json.loads(out)["result"] == "error"


@pytest.mark.clause("SIM-CI-1")
def test_exit_codes_are_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    """SIM-CI-1: --help lists what each exit code means."""
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("exit codes: 0 clean", "1 an invariant was violated", "2 bad arguments", "3 the harness itself"):
        assert needle in text
