"""Test fixtures: one PostgreSQL per session, a fresh database per test cloned from a template.

The server is ``SCHEDULER_TEST_DATABASE_URL`` when set, else an embedded PostgreSQL
(the ``pgserver`` wheel) started by the session fixture ``pg_server`` the first time a
test needs a database (importing this module starts nothing). The template database is
migrated with Alembic once; each test gets ``CREATE DATABASE ... TEMPLATE`` in milliseconds.

Tokens (``ADMIN``, ``INGEST``, ``PARTICIPANT``) are minted when a request reads them, so
a session longer than a token's lifetime never sends an expired one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql import factories
from sqlalchemy import Engine, make_url
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine, migrate, socket_dir_of
from scheduler.nudging.publishers import RecordingPublisher
from scheduler.web.app import SchedulerService
from scheduler.web.http.auth import mint_token

# The spec report (--spec-report DIR) and the selection by clause (--clause ID) come from the
# wheel's own pytest plugin (harness.spec_report.plugin, the pytest11 entry point
# scheduler_spec_report), as in a host's suite; pytester runs the report's own tests.
pytest_plugins = ["pytester"]

TEST_SECRET = "test-secret-for-the-requirement-suite-0123456789"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class PgServer:
    """Where the session's PostgreSQL listens (what pytest-postgresql's ``depends_on`` reads)."""

    host: str
    port: int
    user: str
    password: str
    options: str = ""
    maintenance_dbname: str = "postgres"
    template_dbname: str | None = None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL: ``SCHEDULER_TEST_DATABASE_URL``, or an embedded server
    started here and stopped when the session ends."""
    url = os.environ.get("SCHEDULER_TEST_DATABASE_URL")
    if url:
        parsed = make_url(url)
        host = parsed.host or parsed.query.get("host")
        yield PgServer(host=str(host), port=parsed.port or 5432, user=parsed.username or "postgres",
                       password=parsed.password or "")
        return
    import pgserver

    pgdata = Path(os.environ.get("SCHEDULER_TEST_PGDATA")
                  or Path(tempfile.gettempdir()) / f"scheduler-tests-pg-{os.getuid()}")
    server = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
    host = socket_dir_of(server.get_uri())
    assert host is not None, server.get_uri()
    try:
        yield PgServer(host=host, port=5432, user="postgres", password="")
    finally:
        server.cleanup()  # stops it unless another process still uses it (cleanup_mode="stop")


def libpq_url(dbname: str, *, host: str, port: int, user: str, password: str | None = None) -> str:
    """A SQLAlchemy (psycopg 3) URL to ``dbname``, over a Unix socket or TCP."""
    secret = f":{password}" if password else ""
    if str(host).startswith("/"):
        return f"postgresql+psycopg://{user}{secret}@/{dbname}?host={host}&port={port}"
    return f"postgresql+psycopg://{user}{secret}@{host}:{port}/{dbname}"


def load_schema(host: str, port: int, user: str, dbname: str, password: str | None = None, **_: Any) -> None:
    """Migrate the template database once; every test database is cloned from it."""
    engine = make_engine(libpq_url(dbname, host=host, port=port, user=user, password=password))
    try:
        migrate(engine)
    finally:
        engine.dispose()


postgresql_noproc = factories.postgresql_noproc(
    depends_on="pg_server",
    # One template per pytest process, so that concurrent sessions on one server never collide.
    dbname=f"scheduler_test_{os.getpid()}", load=[load_schema],
)
postgresql = factories.postgresql("postgresql_noproc")


@pytest.fixture
def database_url(postgresql: psycopg.Connection[Any]) -> str:
    """A SQLAlchemy URL to this test's own freshly cloned database."""
    info = postgresql.info
    return libpq_url(info.dbname, host=info.host, port=info.port, user=info.user, password=info.password or None)


@pytest.fixture
def scheduler_database_url(database_url: str) -> str:
    """The wheel's pytest plugin's fixture (harness.pytest_plugin), served by this suite's own
    template clone: regression tests written by ``scheduler simulate`` take it."""
    return database_url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """The test's own hand on the database, not a replica: a lock it holds while a subprocess
    waits on it must not be ended by DEC-11's idle-in-transaction timeout on a loaded machine."""
    engine = make_engine(database_url, Settings(lock_timeout_ms=0, statement_timeout_ms=60_000,
                                                idle_in_transaction_timeout_ms=0))
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def settings() -> Settings:
    return Settings(jwt_secret=TEST_SECRET, poll_seconds=30.0, batch_size=20)


@pytest.fixture
def service(settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher) -> SchedulerService:
    """The service wired to this test's database and frozen clock; the loop is stepped by hand."""
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False)


def token(scope: str | None, *, secret: str = TEST_SECRET, **kwargs: Any) -> str:
    return mint_token(secret, scope=scope, **kwargs)


def bearer(scope: str | None, **kwargs: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(scope, **kwargs)}"}


class FreshBearer(Mapping[str, str]):
    """Request headers with a bearer token minted at the moment a request reads them."""

    def __init__(self, scope: str | None, **kwargs: Any) -> None:
        self.scope = scope
        self.kwargs = kwargs

    def __getitem__(self, name: str) -> str:
        if name != "Authorization":
            raise KeyError(name)
        return f"Bearer {token(self.scope, **self.kwargs)}"

    def __iter__(self) -> Iterator[str]:
        return iter(("Authorization",))

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return f"FreshBearer({self.scope!r})"


ADMIN = FreshBearer("nudging.admin")
INGEST = FreshBearer("nudging.ingest")
PARTICIPANT = FreshBearer(None, subject="participant-1")


@pytest.fixture
def client(service: SchedulerService) -> Iterator[TestClient]:
    with TestClient(service.app, raise_server_exceptions=True) as client:
        yield client
