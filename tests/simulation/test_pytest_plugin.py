"""The wheel's pytest plugin (``harness.pytest_plugin``): inert unless used, and a host's
suite (examples/host_ci) runs the simulation and its regression tests with its fixtures."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PgServer, libpq_url
from tests.simulation.host_example import EXAMPLE


@pytest.mark.clause("SIM-CI-2")
def test_the_plugin_is_registered_and_importing_it_imports_nothing_heavy() -> None:
    """SIM-CI-2: the ``pytest11`` entry point names the plugin; importing it (as pytest does in
    every session once the wheel is installed) loads neither the scheduler nor SQLAlchemy."""
    points = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")}
    assert points.get("scheduler_sim") == "harness.pytest_plugin"
    script = ("import sys, harness.pytest_plugin\n"
              "heavy = sorted(m for m in sys.modules\n"
              "               if m.split('.')[0] in ('scheduler', 'sqlalchemy', 'psycopg', 'pgserver'))\n"
              "print(heavy)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.clause("SIM-CI-2")
def test_the_plugins_options_and_fixtures_are_namespaced(pytestconfig: pytest.Config) -> None:
    """SIM-CI-2: this very session has the plugin loaded; its options are all --scheduler-sim-*
    and its fixtures scheduler_*, so none collides with this suite's (database_url, engine...)."""
    plugin = pytestconfig.pluginmanager.get_plugin("scheduler_sim")
    assert plugin is not None
    group = next(g for g in pytestconfig._parser._groups if g.name == "scheduler_sim")
    assert group.options and all(o.names()[0].startswith("--scheduler-sim-") for o in group.options)
    fixtures = [name for name in vars(plugin) if name.startswith("scheduler_") or name in ("database_url", "engine")]
    assert set(fixtures) == {"scheduler_server_url", "scheduler_template_database", "scheduler_database_url",
                             "scheduler_host", "scheduler_simulation"}


def _pytest(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          capture_output=True, text=True, timeout=240, check=False, cwd=cwd, env=env)


@pytest.mark.clause("SIM-CI-2")
@pytest.mark.clause("SIM-HOST-3")
def test_a_hosts_suite_runs_the_simulation_and_the_regression_test_it_wrote(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """SIM-CI-2, SIM-HOST-3: examples/host_ci's own tests, run as its CI runs them: the correct
    dispatcher passes; the broken one is found, shrunk and written as a regression test; that
    test runs downstream with the plugin's fixtures and fails on the bug; a failing run prints
    its seed and the command that replays it."""
    server = libpq_url("postgres", host=pg_server.host, port=pg_server.port, user=pg_server.user,
                       password=pg_server.password or None)
    env = {**os.environ, "SCHEDULER_SIM_DATABASE_URL": server, "SCHEDULER_SIM_STEPS": "120",
           "SCHEDULER_SIM_SEED": "5"}
    regressions = tmp_path / "regressions"
    done = _pytest(["--scheduler-sim-regressions", str(regressions), "-s"], env, EXAMPLE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    written = sorted(regressions.glob("seed-*.py"))
    assert written, done.stdout
    downstream = tmp_path / "downstream"
    downstream.mkdir()
    (downstream / "test_regression.py").write_text(written[0].read_text())
    (downstream / "test_failing.py").write_text(
        "from host_app.simulation import BROKEN\n\n"
        "def test_the_broken_dispatcher_fails_the_run(scheduler_simulation):\n"
        "    scheduler_simulation.run(BROKEN, seed=1)\n")
    again = _pytest([str(downstream), "--rootdir", str(EXAMPLE), "-c", str(EXAMPLE / "pyproject.toml"),
                     "--scheduler-sim-regressions", str(regressions)], env, EXAMPLE)
    assert again.returncode == 1 and "2 failed" in again.stdout, again.stdout + again.stderr
    # The regression test in the host's suite: the fixture is found, and the bug fails it.
    assert "test_regression.py::test_seed_1_sim_12" in again.stdout and "SIM-12 violated" in again.stdout
    assert "fixture 'scheduler_database_url' not found" not in again.stdout
    # A failing simulation test reports its seed and the one command that replays it.
    assert "INVARIANT VIOLATED: SIM-12" in again.stdout and "simulation seed: 1" in again.stdout
    assert "replay: SCHEDULER_SIM_SEED=1 SCHEDULER_SIM_STEPS=120 python -m pytest" in again.stdout


SETUP_OPTION_TEST = '''
from sqlalchemy import create_engine, text


def test_the_hosts_tables_come_from_the_setup_option(scheduler_host, scheduler_simulation, scheduler_database_url):
    scheduler_simulation.run(seed=3, steps=40, participants=3)  # p3 opted out: a bare factory expects none
    engine = create_engine(scheduler_database_url)
    with engine.connect() as conn:
        delivered = conn.execute(text("SELECT count(*) FROM host_deliveries")).scalar_one()
    engine.dispose()
    assert delivered > 0
    assert scheduler_host.setup_path == "host_app.dispatcher:create_tables"
'''


@pytest.mark.clause("SIM-CI-3")
def test_the_plugins_setup_option_creates_the_hosts_tables_before_the_simulation(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """SIM-CI-3: a host whose ini names a bare dispatcher factory (no setup of its own) and its
    ``scheduler_sim_setup``: ``scheduler_host`` carries that setup, so the simulation's run has
    the host's table and its dispatcher delivers into it (ignored, every event would fail)."""
    server = libpq_url("postgres", host=pg_server.host, port=pg_server.port, user=pg_server.user,
                       password=pg_server.password or None)
    project = tmp_path / "host"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        f"pythonpath = [{str(EXAMPLE)!r}]\n"
        'scheduler_sim_dispatcher = "host_app.dispatcher:DeliveryDispatcher"\n'
        'scheduler_sim_setup = "host_app.dispatcher:create_tables"\n')
    (project / "test_setup_option.py").write_text(SETUP_OPTION_TEST)
    done = _pytest(["--scheduler-sim-regressions", str(tmp_path / "regressions")],
                   {**os.environ, "SCHEDULER_SIM_DATABASE_URL": server}, project)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
