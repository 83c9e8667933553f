"""The replica simulation in a host's test suite: a pytest plugin shipped in the wheel.

Registered as the ``pytest11`` entry point ``scheduler_sim``, so installing
``nudging-scheduler`` makes it available in any pytest run; it is inert until a test asks
for one of its fixtures: importing it imports neither the scheduler nor SQLAlchemy, starts
nothing, and its options are all ``--scheduler-sim-*``. Disable it with
``-p no:scheduler_sim``.

Fixtures (each named ``scheduler_*``, so none shadows a fixture of the host's own):

- ``scheduler_database_url``: a fresh, migrated scheduler database per test, cloned from a
  template migrated once per session, on the server at ``--scheduler-sim-database-url`` /
  ``SCHEDULER_SIM_DATABASE_URL`` (a URL to any database of that server), else on an
  embedded PostgreSQL (``pgserver``, the ``embedded`` extra) started on first use;
- ``scheduler_host``: the host's dispatcher (``harness.HostDispatcher``); by default the
  ini options ``scheduler_sim_dispatcher`` / ``scheduler_sim_setup`` (``package.module:name``
  paths), else the built-in platform. Override it in your ``conftest.py``;
- ``scheduler_simulation``: runs seeded random programs against ``scheduler_host``
  (``.run()``); a failure is shrunk, written as a regression test, and reported with its
  seed and the one command that replays it.

Seeds, steps and the number of seeds: ``--scheduler-sim-seed`` / ``SCHEDULER_SIM_SEED``
(default: a fresh one per run, printed), ``--scheduler-sim-steps`` / ``SCHEDULER_SIM_STEPS``
(default 300), ``--scheduler-sim-seeds`` / ``SCHEDULER_SIM_SEEDS`` (default 1: seed, seed+1, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from harness.host import HostDispatcher
    from harness.sim_runner import SimulationRunner

ENV_URL = "SCHEDULER_SIM_DATABASE_URL"
ENV_SEED = "SCHEDULER_SIM_SEED"
ENV_STEPS = "SCHEDULER_SIM_STEPS"
ENV_SEEDS = "SCHEDULER_SIM_SEEDS"
DEFAULT_STEPS = 300


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scheduler_sim", "scheduler replica simulation (nudging-scheduler)")
    group.addoption("--scheduler-sim-database-url", default=None, metavar="URL",
                    help=f"a PostgreSQL server for scheduler_database_url (else ${ENV_URL}, else embedded)")
    group.addoption("--scheduler-sim-seed", default=None, metavar="N",
                    help=f"the first seed of scheduler_simulation (else ${ENV_SEED}, else a fresh one)")
    group.addoption("--scheduler-sim-steps", default=None, metavar="N",
                    help=f"random steps per seed (else ${ENV_STEPS}, else {DEFAULT_STEPS})")
    group.addoption("--scheduler-sim-seeds", default=None, metavar="N",
                    help=f"how many seeds to run, from the first one up (else ${ENV_SEEDS}, else 1)")
    group.addoption("--scheduler-sim-regressions", default=None, metavar="DIR",
                    help="where a failing run writes its regression test (default .scheduler/simulation)")
    parser.addini("scheduler_sim_dispatcher", "package.module:name of the host's dispatcher for scheduler_host")
    parser.addini("scheduler_sim_setup", "package.module:function creating the host's tables")


def _number(config: pytest.Config, option: str, env: str, default: int | None) -> int | None:
    raw = config.getoption(option) or os.environ.get(env) or None
    if raw is None:
        return default
    from scheduler.whole_numbers import digits_value

    value = digits_value(str(raw), 20)
    if value is None:
        raise pytest.UsageError(f"{option} (or ${env}) must be a whole number, got {raw!r}")
    return value


@pytest.fixture(scope="session")
def scheduler_server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A SQLAlchemy URL to the session's PostgreSQL server (its ``postgres`` database)."""
    from harness.sim_runner import embedded_server, server_url

    url = request.config.getoption("--scheduler-sim-database-url") or os.environ.get(ENV_URL)
    if url:
        yield server_url(url)
        return
    with embedded_server() as embedded:
        yield embedded


@pytest.fixture(scope="session")
def scheduler_template_database(scheduler_server_url: str) -> Iterator[str]:
    """The name of a database migrated once per session, which every test's is cloned from."""
    from harness.sim_runner import template_database

    with template_database(scheduler_server_url) as name:
        yield name


@pytest.fixture
def scheduler_database_url(scheduler_server_url: str, scheduler_template_database: str) -> Iterator[str]:
    """A SQLAlchemy URL to this test's own freshly migrated scheduler database."""
    from harness.sim_runner import cloned_database

    with cloned_database(scheduler_server_url, scheduler_template_database) as url:
        yield url


@pytest.fixture
def scheduler_host(request: pytest.FixtureRequest) -> HostDispatcher | None:
    """The host's dispatcher the simulation runs (None: the built-in platform)."""
    dispatcher = request.config.getini("scheduler_sim_dispatcher") or None
    setup = request.config.getini("scheduler_sim_setup") or None
    if not dispatcher:
        return None
    from harness.host import HostImportError, load_host

    try:
        return load_host(str(dispatcher), str(setup) if setup else None)
    except HostImportError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.fixture
def scheduler_simulation(request: pytest.FixtureRequest, scheduler_database_url: str,
                         scheduler_host: HostDispatcher | None) -> SimulationRunner:
    """Seeded random runs against ``scheduler_host`` on this test's database (``.run()``)."""
    from pathlib import Path

    from harness.sim_runner import SimulationRunner

    config = request.config
    regressions = config.getoption("--scheduler-sim-regressions")
    return SimulationRunner(
        scheduler_database_url, scheduler_host,
        seed=_number(config, "--scheduler-sim-seed", ENV_SEED, None),
        steps=_number(config, "--scheduler-sim-steps", ENV_STEPS, DEFAULT_STEPS) or DEFAULT_STEPS,
        seeds=_number(config, "--scheduler-sim-seeds", ENV_SEEDS, 1) or 1,
        nodeid=request.node.nodeid,
        regressions=Path(regressions) if regressions else config.rootpath / ".scheduler" / "simulation",
    )


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    seed = config.getoption("--scheduler-sim-seed") or os.environ.get(ENV_SEED)
    return [f"scheduler simulation seed: {seed}"] if seed else None

