"""The host's test database: the scheduler's, migrated (the wheel's pytest plugin's
``scheduler_database_url``), with the host's own Alembic history beside it, as in production."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

HERE = Path(__file__).resolve().parents[1]
JWT_SETTINGS = ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_PUBLIC_KEY", "SCHEDULER_JWKS_URL")


@pytest.fixture(params=["psycopg", "asyncpg"])
def host_database(request: pytest.FixtureRequest, scheduler_database_url: str,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """One database with both schemas, the host's users ``anna`` and ``bob`` (opted out), and
    the environment production runs with: ``SCHEDULER_ENV=production``, no scheduler key, the
    host's async engine on psycopg's async driver, then on asyncpg (the parameter)."""
    monkeypatch.setenv("DATABASE_URL", scheduler_database_url)
    monkeypatch.setenv("HOST_DATABASE_DRIVER", str(request.param))
    monkeypatch.setenv("SCHEDULER_ENV", "production")
    for name in (*JWT_SETTINGS, "HOST_TOKEN_SECRET"):
        monkeypatch.delenv(name, raising=False)
    config = Config(str(HERE / "alembic.ini"))
    config.set_main_option("script_location", str(HERE / "host_service" / "migrations"))
    command.upgrade(config, "head")
    engine = create_engine(scheduler_database_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO users (id, opted_out) VALUES ('anna', false), ('bob', true)"))
    engine.dispose()
    yield scheduler_database_url
