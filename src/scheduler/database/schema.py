"""The scheduler's schema of its own, and the migrations that keep it (DEC-SCHEMA).

Every table, sequence, trigger function and trigger of the scheduler lives in one PostgreSQL
schema (``SCHEDULER_DATABASE_SCHEMA``, default ``scheduler``), and so does Alembic's version
table (``version_table_schema``): a host's own Alembic history (its ``public.alembic_version``)
and its tables of the same names (``public.notifications``) are never read, never touched.

``migrate`` runs in one transaction, serialised with any other migrator of the database:

1. It reads the scheduler's version table. A revision this code does not know (a newer
   release migrated the database) is a ``MigrationError``: nothing is changed.
2. A deployment from before the schema of its own (everything in ``public`` at some revision
   of ours, recorded in ``public.alembic_version``) is moved in place: its tables (with their
   rows, indexes, constraints, triggers and owned sequences), its sequence and its trigger
   functions go into the schema with ``SET SCHEMA``, and its row of ``public.alembic_version``
   moves too. A row is ours when its revision is one of this project's revision ids and
   ``public.scheduled_events`` exists; a host's rows stay, and ``public.alembic_version`` is
   dropped only when nothing of the host's is left in it.
3. Alembic upgrades the schema to ``revision`` with ``search_path`` set to the schema for this
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
    FUNCTIONS,
    SEQUENCES,
    TABLES,
    Statements,
    qualified,
    quoted,
)

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"

# The tables every revision of ours has: a public.alembic_version row with one of our revision
# ids is ours only if public holds these too (a host may have a revision called "0001").
FIRST_TABLES = ("scheduled_events", "dedup_keys")

# SQLSTATE class 42501: insufficient_privilege; class 08: the connection failed.
_PERMISSION_DENIED = "42501"


class MigrationError(DatabaseUnusable):
    """A database this code cannot migrate; the message says why, in one sentence."""


@dataclass(frozen=True)
class MigrationResult:
    """What ``migrate`` did: the schema, its revision before (``None``: there was none) and
    after, and whether the tables came from ``public`` (a deployment older than the schema)."""

    schema: str
    before: str | None
    after: str
    moved_from_public: bool = False

    def sentence(self) -> str:
        """What ``scheduler migrate`` prints."""
        if self.moved_from_public:
            moved = f"moved the scheduler's tables from public into schema {self.schema} at revision {self.before}"
            return moved if self.before == self.after else f"{moved}, then upgraded from {self.before} to {self.after}"
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
            moved = False
            if before is None:
                before = _move_from_public(conn, schema, ours)
                moved = before is not None
            _ddl(conn, "create_schema_ddl", schema=schema)
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            after = _revision_in(conn, schema, ours)
    except DBAPIError as exc:
        raise MigrationError(_explain(exc.orig, engine, schema, invalidated=exc.connection_invalidated)) from exc
    except psycopg.Error as exc:  # a DDL template, run on the driver's connection
        raise MigrationError(_explain(exc, engine, schema)) from exc
    assert after is not None
    return MigrationResult(schema, before, after, moved)


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


def _move_from_public(conn: Connection, schema: str, ours: frozenset[str]) -> str | None:
    """Move a deployment of ours from ``public`` into ``schema`` (see the module); return its
    revision, or ``None`` when ``public`` holds none of ours."""
    if not _exists(conn, "public.alembic_version"):
        return None
    rows = list(conn.execute(_statement("public_revisions")).scalars())
    mine = [r for r in rows if r in ours]
    if not mine:
        return None  # a host's history only: ours starts afresh in its own schema
    missing = [t for t in FIRST_TABLES
               if not _exists(conn, f"public.{t}")]
    if missing:
        raise MigrationError(
            f"public.alembic_version holds revision {mine[0]!r}, one of the scheduler's revision ids, but public "
            f"has no {missing[0]} table: it is not a deployment of the scheduler to move (is the revision a "
            f"host's of the same name?); nothing was changed")
    if len(mine) > 1:
        raise MigrationError(f"public.alembic_version holds {len(mine)} of the scheduler's revisions "
                             f"({', '.join(mine)}) where it keeps one; nothing was changed")
    _ddl(conn, "create_schema_ddl", schema=schema)
    for table in TABLES:
        if _exists(conn, f"public.{table}"):
            _ddl(conn, "move_table_ddl", schema=schema, name=table)
    for sequence in SEQUENCES:
        if _exists(conn, f"public.{sequence}"):
            _ddl(conn, "move_sequence_ddl", schema=schema, name=sequence)
    for function in FUNCTIONS:
        if _exists(conn, f"public.{function}", function=True):
            _ddl(conn, "move_function_ddl", schema=schema, name=function)
    _ddl(conn, "version_table_like_public_ddl", schema=schema)
    conn.execute(_statement("copy_revisions_into_schema", schema), {"revisions": mine})
    conn.execute(_statement("delete_public_revisions"), {"revisions": mine})
    if len(mine) == len(rows):
        _ddl(conn, "drop_public_version_table_ddl")
    return str(mine[0])


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
