"""The host's own Alembic environment: its tables in ``public``, its history in
``public.alembic_version``, untouched by the scheduler's (which keeps its own in its schema)."""

from __future__ import annotations

from alembic import context
from host_service.database import database_url
from sqlalchemy import create_engine

engine = create_engine(database_url())
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
