"""Test fixtures: one PostgreSQL per session, a fresh database per test cloned from a template.

The server is ``SCHEDULER_TEST_DATABASE_URL`` when set, else an embedded PostgreSQL
(the ``pgserver`` wheel) started once per session. The template database is migrated
with Alembic once; each test gets ``CREATE DATABASE ... TEMPLATE`` in milliseconds.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql import factories
from sqlalchemy import Engine, make_url
from starlette.testclient import TestClient

from scheduler.app import SchedulerService
from scheduler.auth import mint_token
from scheduler.clock import ManualClock
from scheduler.config import Settings
from scheduler.db import make_engine, migrate, socket_dir_of
from scheduler.publishers import RecordingPublisher

TEST_SECRET = "test-secret-for-the-requirement-suite-0123456789"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _server() -> dict[str, Any]:
    url = os.environ.get("SCHEDULER_TEST_DATABASE_URL")
    if url:
        parsed = make_url(url)
        return {
            "host": parsed.host or parsed.query.get("host"),
            "port": parsed.port or 5432,
            "user": parsed.username or "postgres",
            "password": parsed.password or "",
        }
    import pgserver

    pgdata = Path(os.environ.get("SCHEDULER_TEST_PGDATA") or Path(tempfile.gettempdir()) / f"scheduler-tests-pg-{os.getuid()}")
    server = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
    _server.keep = server  # type: ignore[attr-defined]  # keep it alive for the session
    return {"host": socket_dir_of(server.get_uri()), "port": 5432, "user": "postgres", "password": ""}


SERVER = _server()


def libpq_url(dbname: str) -> str:
    password = f":{SERVER['password']}" if SERVER["password"] else ""
    host = SERVER["host"]
    if str(host).startswith("/"):
        return f"postgresql+psycopg://{SERVER['user']}{password}@/{dbname}?host={host}&port={SERVER['port']}"
    return f"postgresql+psycopg://{SERVER['user']}{password}@{host}:{SERVER['port']}/{dbname}"


def load_schema(host: str, port: int, user: str, dbname: str, password: str | None = None, **_: Any) -> None:
    """Migrate the template database once; every test database is cloned from it."""
    engine = make_engine(libpq_url(dbname))
    try:
        migrate(engine)
    finally:
        engine.dispose()


postgresql_noproc = factories.postgresql_noproc(
    host=SERVER["host"], port=SERVER["port"], user=SERVER["user"], password=SERVER["password"],
    # One template per pytest process, so that concurrent sessions on one server never collide.
    dbname=f"scheduler_test_{os.getpid()}", load=[load_schema],
)
postgresql = factories.postgresql("postgresql_noproc")


@pytest.fixture
def database_url(postgresql: psycopg.Connection[Any]) -> str:
    """A SQLAlchemy URL to this test's own freshly cloned database."""
    return libpq_url(postgresql.info.dbname)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, Settings(lock_timeout_ms=0, statement_timeout_ms=60_000))
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


ADMIN = bearer("nudging.admin")
INGEST = bearer("nudging.ingest")
PARTICIPANT = bearer(None, subject="participant-1")


@pytest.fixture
def client(service: SchedulerService) -> Iterator[TestClient]:
    with TestClient(service.app, raise_server_exceptions=True) as client:
        yield client
