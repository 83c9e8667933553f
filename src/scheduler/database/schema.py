"""The scheduler's schema of its own, and the migrations that keep it (DEC-SCHEMA).

Every table, sequence, trigger function and trigger of the scheduler lives in one PostgreSQL
schema (``SCHEDULER_DATABASE_SCHEMA``, default ``scheduler``), and so does Alembic's version
table (``version_table_schema``): a host's own Alembic history (its ``public.alembic_version``)
and its tables of the same names (``public.notifications``) are never read, never touched.

``migrate`` runs in one transaction, serialised with any other migrator of the database:

1. It reads the scheduler's version table. A revision this code does not know (a newer
   release migrated the database) is a ``MigrationError``: nothing is changed.
2. Alembic upgrades the schema to ``revision`` with ``search_path`` set to the schema for this
   transaction only, so the migrations' unqualified names land there.

It returns what it did (``MigrationResult.sentence``: "created schema scheduler at revision
R", "upgraded from R1 to R2", "already at R"); a database it cannot migrate (unknown revision,
permission denied, unreachable) is a ``MigrationError`` whose message is one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import Connection, Engine, TextClause
from sqlalchemy.exc import DBAPIError

from scheduler.config import DatabaseUnusable
from scheduler.database.queries import (
    DEFAULT_SCHEMA,
    Statements,
    qualified,
    quoted,
)

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"

# SQLSTATE class 42501: insufficient_privilege; class 08: the connection failed.
_PERMISSION_DENIED = "42501"


class MigrationError(DatabaseUnusable):
    """A database this code cannot migrate; the message says why, in one sentence."""


@dataclass(frozen=True)
class MigrationResult:
    """What ``migrate`` did: the schema, its revision before (``None``: there was none) and after."""

    schema: str
    before: str | None
    after: str

    def sentence(self) -> str:
        """What ``scheduler migrate`` prints."""
        if self.before is None:
            return f"created schema {self.schema} at revision {self.after}"
        if self.before == self.after:
            return f"schema {self.schema} already at revision {self.after}"
        return f"schema {self.schema}: upgraded from {self.before} to {self.after}"


def alembic_config(schema: str = DEFAULT_SCHEMA) -> Config:
    """Alembic's configuration for the scheduler's migrations, in ``schema``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["schema"] = schema
    return config


def our_revisions(config: Config | None = None) -> frozenset[str]:
    """Every revision id of this project's migrations."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(config or alembic_config())
    return frozenset(rev.revision for rev in script.walk_revisions())


def head_revision(config: Config | None = None) -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(config or alembic_config()).get_current_head()
    assert head is not None
    return head


def migrate(engine: Engine, revision: str = "head", schema: str = DEFAULT_SCHEMA) -> MigrationResult:
    """Bring the scheduler's schema ``schema`` up to ``revision`` (never ``create_all``); see the module."""
    from alembic import command

    config = alembic_config(schema)
    ours = our_revisions(config)
    try:
        with engine.begin() as conn:
            conn.execute(_statement("migration_lock"))
            before = _revision_in(conn, schema, ours)
            _ddl(conn, "create_schema_ddl", schema=schema)
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            after = _revision_in(conn, schema, ours)
    except DBAPIError as exc:
        raise MigrationError(_explain(exc.orig, engine, schema, invalidated=exc.connection_invalidated)) from exc
    except psycopg.Error as exc:  # a DDL template, run on the driver's connection
        raise MigrationError(_explain(exc, engine, schema)) from exc
    assert after is not None
    return MigrationResult(schema, before, after)


def _revision_in(conn: Connection, schema: str, ours: frozenset[str]) -> str | None:
    """The revision in the schema's version table (``None``: no table, or no row); one this
    code does not know is a ``MigrationError``."""
    if not _exists(conn, qualified(schema, "alembic_version")):
        return None
    revisions = list(conn.execute(_statement("schema_revisions", schema)).scalars())
    unknown = [r for r in revisions if r not in ours]
    if unknown:
        raise MigrationError(
            f"{schema}.alembic_version holds revision {unknown[0]!r}, which this version of the scheduler "
            f"does not know (a newer release migrated this database?): run that release, or a newer one; "
            f"nothing was changed")
    if len(revisions) > 1:
        raise MigrationError(f"{schema}.alembic_version holds {len(revisions)} revisions ({', '.join(revisions)}) "
                             "where the scheduler keeps one; nothing was changed")
    return revisions[0] if revisions else None


def _exists(conn: Connection, name: str, *, function: bool = False) -> bool:
    if function:  # our trigger functions take no argument
        return bool(conn.execute(_statement("function_exists"), {"signature": f"{name}()"}).scalar_one())
    return bool(conn.execute(_statement("relation_exists"), {"name": name}).scalar_one())


def _statement(name: str, schema: str = DEFAULT_SCHEMA) -> TextClause:
    """The named statement naming ``schema`` (the statements that name none of our objects
    read the same in every schema's)."""
    return Statements.of(schema)[name]


def _ddl(conn: Connection, template_name: str, /, **identifiers: str) -> None:
    """Run the DDL template ``name`` of queries.sql with its names quoted by psycopg (DDL
    cannot bind a name)."""
    from psycopg import sql as pgsql

    parts: dict[str, Any] = {key: pgsql.Identifier(value) for key, value in identifiers.items()}
    if "schema" in identifiers:
        # a search_path value: the name quoted as an identifier inside it ('"select"')
        parts["schema_literal"] = pgsql.Literal(quoted(identifiers["schema"]))
    driver = conn.connection.driver_connection
    assert driver is not None
    template = Statements.of().sql(template_name)
    driver.execute(pgsql.SQL(template).format(**{k: v for k, v in parts.items() if "{" + k + "}" in template}))


def set_search_path(conn: Connection, schema: str) -> None:
    """This transaction's unqualified names resolve in ``schema`` only (the migrations')."""
    _ddl(conn, "search_path_ddl", schema=schema)


def _explain(orig: BaseException | None, engine: Engine, schema: str, *, invalidated: bool = False) -> str:
    """A database error as the sentence ``scheduler migrate`` prints."""
    where = engine.url.render_as_string(hide_password=True)
    sqlstate = getattr(orig, "sqlstate", None)
    first_line = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if sqlstate == _PERMISSION_DENIED:
        return (f"permission denied migrating schema {schema} on {where} ({first_line}): the role needs CREATE "
                f"on the database (to create the schema) or ownership of the schema and its tables")
    if invalidated or sqlstate is None or sqlstate.startswith("08"):
        return f"cannot reach the database at {where}: {first_line}"
    return f"migrating schema {schema} on {where} failed: {first_line} (SQLSTATE {sqlstate})"
