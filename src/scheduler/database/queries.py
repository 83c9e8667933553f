"""Loads ``sql/queries.sql``: every scheduler statement, by name, as a SQLAlchemy ``text``.

Keeping the SQL in one file (as procrastinate does) makes the claim query reviewable
in one place and lets the benchmarks and the plan test run exactly what production runs.

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


@cache
def load_queries(path: Path = SQL_FILE) -> dict[str, Query]:
    """Parse the named blocks of ``path``; a duplicate name is an error."""
    queries: dict[str, Query] = {}
    for match in _BLOCK.finditer(path.read_text()):
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


@cache
def statement(name: str) -> TextClause:
    """The named statement, ready to execute with bound parameters."""
    try:
        return load_queries()[name].statement
    except KeyError:
        raise KeyError(f"no query named {name!r} in {SQL_FILE}") from None


def sql(name: str) -> str:
    """The named statement's text (for EXPLAIN and the benchmarks)."""
    return load_queries()[name].sql
