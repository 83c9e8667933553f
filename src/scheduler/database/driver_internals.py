"""The drivers' private pieces ``database.pipeline`` needs, named in one place (DEC-1.3).

``pipeline.send`` puts a transaction's ``BEGIN`` and several statements in ONE message of
the simple query protocol (one round trip, and nothing run by a message that arrived in
part: DEC-11). psycopg's public API does part of this: a cursor's ``execute`` of several
statements joined, without parameters (``ClientCursor.mogrify`` binds them on the client),
sends one simple-query message and ``nextset()`` walks the answers. But on a connection with
no open transaction psycopg first sends its own ``BEGIN``, alone, in a round trip of its
own, and there is no public way to hand it ours: so ``send`` puts the message on the wire
itself (``PGconn.send_query``, public) and reads the answers with psycopg's own generator,
then hands each cursor its answer as psycopg's ``execute`` would. Those two steps, SQLAlchemy's
translation of a driver error, and the statement listeners it would call (each statement of
the message is told to them as if SQLAlchemy had sent it) are private API; each is used here
only.

``pyproject.toml`` bounds psycopg and SQLAlchemy below their next minor release for this
reason. ``missing()`` says which piece a driver lacks: ``send`` then runs the statements one
by one (the same results, a round trip each) and logs a warning once, and PERF-8 (the wire
test that counts messages, not statements) fails.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy import Connection

# psycopg's generator that sends a message already handed to libpq and reads every answer
# (one result per statement of the message), run by the connection's ``wait``.
_EXECUTE: Any = getattr(getattr(psycopg, "generators", None), "execute", None)


def missing() -> list[str]:
    """The private pieces this psycopg lacks (empty: ``pipeline.send`` sends one message)."""
    gaps = []
    if _EXECUTE is None:
        gaps.append("psycopg.generators.execute")
    if not hasattr(psycopg.Connection, "wait"):
        gaps.append("psycopg.Connection.wait")
    if not hasattr(psycopg.Cursor, "_set_results"):
        gaps.append("psycopg.Cursor._set_results")
    if not hasattr(Connection, "_handle_dbapi_exception"):
        gaps.append("sqlalchemy.Connection._handle_dbapi_exception")
    if not hasattr(Connection, "dispatch"):
        gaps.append("sqlalchemy.Connection.dispatch")
    return gaps


def read_answers(driver: psycopg.Connection[Any]) -> list[pq.abc.PGresult]:
    """Wait for and read every answer to the message just sent with ``pgconn.send_query``."""
    results: list[pq.abc.PGresult] = driver.wait(_EXECUTE(driver.pgconn))
    return results


def hand_answer(cursor: psycopg.Cursor[Any], result: pq.abc.PGresult) -> None:
    """Give ``cursor`` one answer, as psycopg's own ``execute`` leaves a cursor (its loaders
    started afresh), so that ``fetchall`` reads its rows."""
    cursor._tx = psycopg.adapt.Transformer(cursor)
    cursor._set_results([result])


def statement_listeners(conn: Connection) -> tuple[Any, Any]:
    """The engine's ``before_cursor_execute`` and ``after_cursor_execute`` listeners, in the
    order SQLAlchemy calls them."""
    return conn.dispatch.before_cursor_execute, conn.dispatch.after_cursor_execute


def raise_translated(conn: Connection, exc: psycopg.Error, sql: str | None, params: Any, cursor: Any) -> None:
    """Raise ``exc`` as SQLAlchemy raises a driver error: a ``DBAPIError``, the connection (and
    the pool's older connections) invalidated when it is gone."""
    conn._handle_dbapi_exception(exc, sql, params, cursor, None)


def connect_parameters(engine: Any) -> dict[str, Any] | None:
    """The keyword arguments ``engine``'s pool connects with: its URL's, merged with the
    ``connect_args`` it was created with (SQLAlchemy keeps them only in the closure of the
    connect function ``create_engine`` gives the pool, ``cparams``). ``None`` when the pool's
    connect function is not that one (a ``creator=`` of the host's, another SQLAlchemy)."""
    creator: Any = getattr(getattr(engine, "pool", None), "_creator", None)
    code = getattr(creator, "__code__", None)
    if code is None or "cparams" not in code.co_freevars or creator.__closure__ is None:
        return None
    cell = creator.__closure__[code.co_freevars.index("cparams")]
    return dict(cell.cell_contents)
