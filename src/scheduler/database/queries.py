"""Loads ``sql/queries.sql``: every scheduler statement, by name, as a SQLAlchemy ``text``.

Keeping the SQL in one file (as procrastinate does) makes the claim query reviewable
in one place and lets the benchmarks and the plan test run exactly what production runs.

Every object of the scheduler's is named with its schema (``scheduler.scheduled_events``): the
tables live in a PostgreSQL schema of their own (``SCHEDULER_DATABASE_SCHEMA``, DEC-SCHEMA),
beside a host's tables of the same names, and no statement depends on a connection's
``search_path`` (a host's engine, a transaction pooler). The file is written with the default
schema, ``scheduler``; a process configured with another (``use_schema``) gets every statement
with that name instead (``in_schema``), rewritten once per statement.

A block may include another by name, ``{{event_filter}}``: the named block's text (a
fragment, such as the one WHERE clause every list and bulk command of scheduled events
shares) replaces it when the file is loaded, so a clause written once is run everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sqlalchemy import TextClause, text

SQL_FILE = Path(__file__).parent / "sql" / "queries.sql"

DEFAULT_SCHEMA = "scheduler"
# The scheduler's objects: its tables, its sequence, its trigger functions, Alembic's table.
TABLES = ("scheduled_events", "notifications", "dedup_keys", "deliveries", "participant_preferences",
          "scheduled_event_history", "scheduler_maintenance", "scheduler_replicas", "operator_actions",
          "operator_action_events", "web_sessions")
SEQUENCES = ("notification_stream_seq",)
FUNCTIONS = ("scheduled_events_history", "scheduled_events_announce_due")
OBJECTS = (*TABLES, *SEQUENCES, *FUNCTIONS, "alembic_version")
# ``scheduler.<object>`` (or one of its indexes, ``ix_...``): only our objects' names, so that
# the GUCs ``scheduler.change`` and ``scheduler.actor`` (the history trigger's) are never taken
# for a schema.
_QUALIFIED = re.compile(rf"\b{DEFAULT_SCHEMA}\.(?=(?:{'|'.join(OBJECTS)})\b|ix_)")

_schema = DEFAULT_SCHEMA


def in_schema(sql_text: str, schema: str | None = None) -> str:
    """``sql_text`` (written with the default schema) with ``schema`` (default: the process's)."""
    schema = schema or _schema
    return sql_text if schema == DEFAULT_SCHEMA else _QUALIFIED.sub(f"{schema}.", sql_text)


def use_schema(schema: str) -> str:
    """Make ``schema`` the one every statement of this process names; return the previous one.

    One schema per process: the service and every command call this with
    ``Settings.database_schema`` (a name already validated as a plain lower-case identifier)."""
    global _schema
    previous, _schema = _schema, schema
    return previous


def current_schema() -> str:
    """The schema this process's statements name."""
    return _schema
_BLOCK = re.compile(r"^-- name: (?P<name>\w+)\n-- (?P<doc>[^\n]+)\n(?P<sql>.*?)(?=^-- name: |\Z)", re.M | re.S)
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str

    @property
    def statement(self) -> TextClause:
        return text(self.sql)


def load_queries(path: Path = SQL_FILE, schema: str | None = None) -> dict[str, Query]:
    """Parse the named blocks of ``path`` (naming ``schema``, default: the process's); a
    duplicate name is an error."""
    return _load_queries(path, schema or _schema)


@cache
def _load_queries(path: Path, schema: str) -> dict[str, Query]:
    queries: dict[str, Query] = {}
    for match in _BLOCK.finditer(in_schema(path.read_text(), schema)):
        name = match["name"]
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        body = match["sql"].strip()
        queries[name] = Query(name, match["doc"].strip(), body.rstrip(";"))

    def include(found: re.Match[str]) -> str:
        fragment = queries.get(found[1])
        if fragment is None:
            raise ValueError(f"{path}: {{{{{found[1]}}}}} names no block")
        if _INCLUDE.search(fragment.sql):
            raise ValueError(f"{path}: the fragment {found[1]!r} includes another (one level only)")
        return fragment.sql

    return {name: Query(q.name, q.description, _INCLUDE.sub(include, q.sql)) for name, q in queries.items()}


def statement(name: str) -> TextClause:
    """The named statement, ready to execute with bound parameters."""
    return _statement(name, _schema)


@cache
def _statement(name: str, schema: str) -> TextClause:
    try:
        return load_queries(schema=schema)[name].statement
    except KeyError:
        raise KeyError(f"no query named {name!r} in {SQL_FILE}") from None


def sql(name: str) -> str:
    """The named statement's text (for EXPLAIN and the benchmarks)."""
    return load_queries()[name].sql
