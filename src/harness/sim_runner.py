"""What the pytest plugin's fixtures do (``harness.pytest_plugin`` imports this lazily).

A server (a URL, or the embedded PostgreSQL), a template database migrated once per
session, a clone of it per test, and ``SimulationRunner``: seeded random runs against a
host's dispatcher that, on a violation, shrink the program, write it as a regression test
and fail the test with the seed and the one command that replays it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.driver import regression_source, run_random, write_regression
from harness.host import HostDispatcher
from harness.shrink import shrink
from harness.simulation import Simulation
from harness.types import Violation

_clones = itertools.count()
SIMULATION_DEFAULTS: dict[str, Any] = {"replicas": 4, "clients": 2, "batch_size": 20, "participants": 4}
FAULTS_ALL = ("event-errors", "poll-errors", "crash", "kill", "stop", "clock", "skew", "freeze")


def server_url(url: str) -> str:
    """A SQLAlchemy (psycopg 3) URL for ``url``, a libpq or SQLAlchemy URL to the server."""
    from scheduler.database.engine import sqlalchemy_url

    return sqlalchemy_url(url)


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """The embedded PostgreSQL (``pgserver``), started for the session and stopped after it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pgserver warns at import without XDG_RUNTIME_DIR
            import pgserver
    except ImportError as exc:
        raise RuntimeError("scheduler_database_url needs a PostgreSQL server: set SCHEDULER_SIM_DATABASE_URL "
                           "(or --scheduler-sim-database-url), or install the embedded one "
                           "(pip install 'nudging-scheduler[embedded]', the pgserver package)") from exc
    from scheduler.database.engine import sqlalchemy_url

    pgdata = Path(os.environ.get("SCHEDULER_SIM_PGDATA")
                  or Path(tempfile.gettempdir()) / f"scheduler-sim-pg-{os.getuid()}")
    server = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield sqlalchemy_url(server.get_uri(), "postgres")
    finally:
        server.cleanup()  # stops it unless another process still uses it


def _url_of(admin_url: str, name: str) -> str:
    from sqlalchemy import make_url

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def template_database(admin_url: str) -> Iterator[str]:
    """A scheduler database migrated once, to clone per test; dropped at the end."""
    from scheduler.database.engine import create_migrated_database, drop_database

    name = f"scheduler_sim_template_{os.getpid()}"
    drop_database(admin_url, name)
    create_migrated_database(admin_url, name)
    try:
        yield name
    finally:
        drop_database(admin_url, name)


@contextlib.contextmanager
def cloned_database(admin_url: str, template: str) -> Iterator[str]:
    """A fresh database cloned from ``template`` (milliseconds); dropped after the test."""
    from psycopg import sql
    from sqlalchemy import create_engine

    from scheduler.database.engine import drop_database

    name = f"scheduler_sim_{os.getpid()}_{next(_clones)}"
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            driver.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                             sql.Identifier(template)))
    finally:
        engine.dispose()
    try:
        yield _url_of(admin_url, name)
    finally:
        drop_database(admin_url, name)


@contextlib.contextmanager
def _quiet_loops() -> Iterator[None]:
    """The loops log every injected failure with its traceback; a run's report says enough."""
    loggers = [logging.getLogger(name) for name in ("scheduler.core", "alembic", "sqlalchemy.pool")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@dataclass
class Failure:
    """A seed that broke an invariant: its (shrunk) program, its regression test, its replay."""

    seed: int
    violation: Violation
    program: list[str]
    original_steps: int
    regression_file: Path
    replay: str

    def report(self) -> str:
        steps = "\n".join(f"    {line}" for line in self.program)
        return (f"INVARIANT VIOLATED: {self.violation}\n"
                f"simulation seed: {self.seed}\n"
                f"the program, shrunk from {self.original_steps} to {len(self.program)} steps:\n{steps}\n"
                f"regression test: {self.regression_file}\n"
                f"replay: {self.replay}")


class SimulationRunner:
    """Seeded random runs against a host's dispatcher (the ``scheduler_simulation`` fixture)."""

    def __init__(self, database_url: str, host: HostDispatcher | None, *, seed: int | None, steps: int,
                 seeds: int, nodeid: str, regressions: Path) -> None:
        self.database_url = database_url
        self.host = host
        self.seed = seed
        self.steps = steps
        self.seeds = seeds
        self.nodeid = nodeid
        self.regressions = regressions

    def replay_command(self, seed: int, steps: int) -> str:
        return f"SCHEDULER_SIM_SEED={seed} SCHEDULER_SIM_STEPS={steps} python -m pytest '{self.nodeid}'"

    def find(self, host: HostDispatcher | None = None, *, steps: int | None = None, seed: int | None = None,
             seeds: int | None = None, faults: frozenset[str] = frozenset(FAULTS_ALL),
             **simulation: Any) -> Failure | None:
        """Run ``seeds`` seeds of ``steps`` random steps (then the drain); the first failure,
        shrunk and written as a regression test, or None when every run was clean."""
        host = host if host is not None else self.host
        steps = steps or self.steps
        first = seed if seed is not None else self.seed
        if first is None:
            first = random.SystemRandom().randrange(2**32)
        params = {**SIMULATION_DEFAULTS, **simulation}
        with _quiet_loops():
            return self._find(host, steps, first, seeds or self.seeds, faults, params)

    def _find(self, host: HostDispatcher | None, steps: int, first: int, seeds: int,
              faults: frozenset[str], params: dict[str, Any]) -> Failure | None:
        for current in range(first, first + seeds):
            print(f"simulation seed: {current}", flush=True)

            def make(current: int = current) -> Simulation:
                return Simulation(self.database_url, seed=current, host=host, **params)

            with make() as sim:
                try:
                    run_random(sim, steps, random.Random(current), faults)
                    continue
                except Violation as violation:
                    found = violation
            program = list(sim.program)
            shrunk = shrink(make, program, found.clause)
            if shrunk is not None:
                program, found = shrunk.program, shrunk.violation
            replay = self.replay_command(current, steps)
            path = self.regressions / f"seed-{current}.py"
            source = regression_source(sim, found, replay,
                                       name=f"seed_{current}_{found.clause.replace('-', '_').lower()}",
                                       replicas=params["replicas"], clients=params["clients"],
                                       batch_size=params["batch_size"], scheduler=params.get("scheduler", "correct"),
                                       modes=params.get("modes", "literal"), program=program,
                                       participants=params["participants"])
            write_regression(path, source)
            return Failure(current, found, program, len(sim.program), path, replay)
        return None

    def run(self, host: HostDispatcher | None = None, **kwargs: Any) -> None:
        """``find``, failing the test with the seed and the replay command on a violation."""
        import pytest

        failure = self.find(host, **kwargs)
        if failure is not None:
            pytest.fail(failure.report(), pytrace=False)
