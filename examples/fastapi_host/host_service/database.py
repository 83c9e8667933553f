"""The one database both the host and the scheduler use (``DATABASE_URL``).

The host's own code is async (FastAPI): its engine is an ``AsyncEngine`` on psycopg 3's async
driver, or on asyncpg with ``HOST_DATABASE_DRIVER=asyncpg``. The scheduler takes that engine
as it is (it runs on the engine's sync psycopg twin); its own commands (``scheduler migrate``)
and the host's Alembic history use ``DATABASE_URL`` with the sync driver.
"""

from __future__ import annotations

import os

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DRIVERS = ("psycopg", "asyncpg")


def database_url() -> str:
    """``DATABASE_URL`` for SQLAlchemy with psycopg 3 (a bare ``postgresql://`` URL included)."""
    url = os.environ["DATABASE_URL"]
    return url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql://") else url


def async_engine(**pool: int) -> AsyncEngine:
    """The host's ``AsyncEngine`` on ``DATABASE_URL``, with ``HOST_DATABASE_DRIVER``'s driver."""
    driver = os.environ.get("HOST_DATABASE_DRIVER", "psycopg")
    if driver not in DRIVERS:
        raise ValueError(f"HOST_DATABASE_DRIVER is one of {', '.join(DRIVERS)}, not {driver!r}")
    # postgresql+psycopg:// with create_async_engine is psycopg's async driver
    url = make_url(database_url()).set(drivername=f"postgresql+{driver}")
    return create_async_engine(url, pool_pre_ping=True, **pool)
