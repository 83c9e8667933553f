"""Alembic environment: runs against the connection handed over by ``scheduler.database.engine.migrate``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from scheduler.database.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:  # pragma: no cover - only when alembic is driven by hand with a URL
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _run(conn)
