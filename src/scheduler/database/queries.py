"""Loads ``sql/queries.sql``: every scheduler statement, by name, as a SQLAlchemy ``text``.

Keeping the SQL in one file (as procrastinate does) makes the claim query reviewable
in one place and lets the benchmarks and the plan test run exactly what production runs.

Every object of the scheduler's is named with its schema (``scheduler.scheduled_events``): the
tables live in a PostgreSQL schema of their own (``SCHEDULER_DATABASE_SCHEMA``, DEC-SCHEMA),
beside a host's tables of the same names, and no statement depends on a connection's
``search_path`` (a host's engine, a transaction pooler). The file is written with the default
schema, ``scheduler``; ``Statements.of(schema)`` gives every statement naming ``schema``
instead, quoted as an identifier (``"select".scheduled_events``), parsed once per schema. There
is no schema "of the process": each ``Database`` holds the statements of its own
(``scheduler.database.database``), so two services with two schemas share a process (DEC-DB).

A block may include another by name, ``{{event_filter}}``: the named block's text (a
fragment, such as the one WHERE clause every list and bulk command of scheduled events
shares) replaces it when the file is loaded, so a clause written once is run everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import TextClause, text

if TYPE_CHECKING:
    from scheduler.database.pipeline import Step

SQL_FILE = Path(__file__).parent / "sql" / "queries.sql"

DEFAULT_SCHEMA = "scheduler"
# The scheduler's objects: its tables, its sequence, its trigger functions, Alembic's table.
TABLES = ("scheduled_events", "notifications", "dedup_keys", "deliveries", "participant_preferences",
          "scheduled_event_history", "scheduler_maintenance", "scheduler_replicas", "operator_actions",
          "operator_action_events", "web_sessions", "push_subscriptions")
SEQUENCES = ("notification_stream_seq",)
FUNCTIONS = ("scheduled_events_history", "scheduled_events_announce_due")
OBJECTS = (*TABLES, *SEQUENCES, *FUNCTIONS, "alembic_version")
# ``scheduler.<object>`` (or one of its indexes, ``ix_...``): only our objects' names, so that
# the GUCs ``scheduler.change`` and ``scheduler.actor`` (the history trigger's) are never taken
# for a schema.
_QUALIFIED = re.compile(rf"\b{DEFAULT_SCHEMA}\.(?=(?:{'|'.join(OBJECTS)})\b|ix_)")


def quoted(schema: str) -> str:
    """``schema`` as a SQL identifier, double-quoted (``"select"``): a schema named like a
    reserved word (``select``, ``user``, ``order``, ``all``) is a name, never a keyword."""
    return '"' + schema.replace('"', '""') + '"'


def qualified(schema: str, name: str) -> str:
    """``name`` in ``schema``, quoted, for ``to_regclass``/``to_regprocedure`` (``"a".t``)."""
    return f"{quoted(schema)}.{name}"


def in_schema(sql_text: str, schema: str) -> str:
    """``sql_text`` (written with the default schema) naming ``schema`` instead, quoted."""
    return sql_text if schema == DEFAULT_SCHEMA else _QUALIFIED.sub(f"{quoted(schema)}.", sql_text)


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


def load_queries(path: Path = SQL_FILE, schema: str = DEFAULT_SCHEMA) -> dict[str, Query]:
    """Parse the named blocks of ``path`` naming ``schema`` (default: ``scheduler``); a
    duplicate name is an error. Parsed once per file and schema."""
    return _load_queries(path, schema)


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


class Statements:
    """Every statement of ``queries.sql`` naming one schema, by name (``statements["get_event"]``).

    Built once per schema and file (``Statements.of``): a ``Database`` holds the statements of
    its schema, and nothing else in the process changes which schema they name."""

    def __init__(self, schema: str, path: Path = SQL_FILE) -> None:
        self.schema = schema
        self.path = path
        self.queries = load_queries(path, schema)
        self._texts = {name: query.statement for name, query in self.queries.items()}

    @staticmethod
    def of(schema: str = DEFAULT_SCHEMA, path: Path = SQL_FILE) -> Statements:
        """The statements naming ``schema`` (one object per schema and file)."""
        return _statements(schema, path)

    def __getitem__(self, name: str) -> TextClause:
        """The named statement, ready to execute with bound parameters."""
        try:
            return self._texts[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in {self.path}") from None

    def sql(self, name: str) -> str:
        """The named statement's text (for EXPLAIN and the benchmarks)."""
        try:
            return self.queries[name].sql
        except KeyError:
            raise KeyError(f"no query named {name!r} in {self.path}") from None

    def step(self, name: str, params: Mapping[str, Any], fetch: bool = True) -> Step:
        """The named statement as one step of a pipelined send (``database.pipeline``)."""
        from scheduler.database.pipeline import Step

        return Step(name=name, statement=self[name], params=params, fetch=fetch)

    def __repr__(self) -> str:
        return f"Statements(schema={self.schema!r})"


@cache
def _statements(schema: str, path: Path) -> Statements:
    return Statements(schema, path)


def sql(name: str, schema: str = DEFAULT_SCHEMA) -> str:
    """The named statement's text naming ``schema`` (for EXPLAIN and the benchmarks)."""
    return Statements.of(schema).sql(name)
