"""Alembic environment: runs against the connection handed over by ``scheduler.database.schema.migrate``.

Everything goes into the scheduler's schema (``config.attributes["schema"]``, from
``SCHEDULER_DATABASE_SCHEMA``): Alembic's version table by ``version_table_schema``, and every
object a migration names without a schema because this transaction's ``search_path`` is that
schema alone (DEC-SCHEMA). A host's ``public.alembic_version`` is never read.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from scheduler.database.models import Base
from scheduler.database.queries import DEFAULT_SCHEMA
from scheduler.database.schema import set_search_path

config = context.config
target_metadata = Base.metadata
schema = str(config.attributes.get("schema") or DEFAULT_SCHEMA)


def _run(connection: Connection) -> None:
    set_search_path(connection, schema)
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True,
                      version_table_schema=schema, include_schemas=True,
                      include_name=lambda name, kind, _parent: kind != "schema" or name == schema)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:  # pragma: no cover - only when alembic is driven by hand with a URL
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)
