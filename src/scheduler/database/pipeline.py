"""Statements sent together, in one round trip and one message, under a SQLAlchemy session
(DEC-1, "Round trips").

``send`` runs several statements on the session's psycopg connection, inside the session's
transaction (its ``BEGIN`` ahead of them when none is open), as ONE message of PostgreSQL's
simple query protocol: the statements joined, their parameters bound on the client
(psycopg's ``ClientCursor.mogrify``). Why one message and not psycopg's pipeline mode (what
a replica frozen mid-send leaves behind): DEC-1, "Round trips", and DEC-11. The first error
ends the message: nothing after it runs (a ``COMMIT`` after a failed write does not run, and
the transaction can roll back to a savepoint sent before it).

SQLAlchemy's ``before_cursor_execute`` / ``after_cursor_execute`` listeners hear of each
statement as if SQLAlchemy had sent it (the statement tests, the benchmarks' profile and
tracing see every statement, and a listener registered with ``retval=True`` may rewrite it,
as the simulation's broken variants do). A database error is raised as SQLAlchemy raises it
(a ``DBAPIError``, with ``connection_invalidated`` set and the connection invalidated when it
is gone).

The statements are the caller's (``Statements.step``: a named statement of the schema its
``Database`` names, DEC-DB); nothing here knows a schema.

The listeners that run a deferred command and drop it at the transaction's end are put on
an engine by ``attach`` (a ``Database`` attaches them to each engine it works through: the
service's own, or its view of a host's engine), never on SQLAlchemy's ``Engine`` or ``Pool``
classes: a host's other engines never see them (EMB-12); ``detach`` takes them off again.

``defer`` queues a command (a ``SAVEPOINT``) to travel ahead of the next statement on the
same connection: with the next ``send``, in the same message, or just ahead of a statement
run any other way (``Session.execute``, a dispatcher's ORM flush), which the listener
``attach`` put on the engine sees first. A command never followed by a statement is never sent (the batch's
checkpoint of a dispatcher that wrote nothing costs nothing); ``discard`` drops it and says
whether it was still unsent. The end of the transaction drops it too.

``send`` puts the message on the wire itself (``PGconn.send_query``, public) because psycopg,
on a connection with no open transaction, first sends its own ``BEGIN`` alone, in a round trip
of its own, and has no public way to be handed ours. Reading the answers with psycopg's own
generator, handing each cursor its answer as psycopg's ``execute`` would, SQLAlchemy's
translation of a driver error and the statement listeners it would call are private API:
this module is the one that names them (DEC-1.3, "the drivers' private pieces" below), and
``pyproject.toml`` bounds psycopg and SQLAlchemy below their next minor release for it. On a
connection that is not psycopg's (another driver), or a driver without one of those pieces
(``missing()``), ``send`` runs the statements one by one through the session: the same
results, a round trip each, with a warning logged once; PERF-8 counts the messages on the
wire and fails.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row
from sqlalchemy import Connection, Engine, TextClause, event
from sqlalchemy.orm import Session

logger = logging.getLogger(__name__)

# Where a connection keeps the commands deferred to its next statement (its ``info``,
# which follows the DBAPI connection: cleared at the transaction's end and at checkin).
_DEFERRED = "scheduler.database.pipeline.deferred"


@dataclass(frozen=True)
class Step:
    """One statement of a pipeline: a named statement of ``queries.sql`` (``statement``, as
    its ``Statements`` give it, ``Statements.step``) with its parameters, or a raw command
    (``SAVEPOINT name``, no parameters); ``fetch``: its rows are wanted (as dicts, in order)."""

    name: str | None = None
    params: Mapping[str, Any] | None = None
    fetch: bool = True
    command: str | None = None
    statement: TextClause | None = None


def command(sql: str) -> Step:
    """A raw command without parameters or rows (``SAVEPOINT``, ``ROLLBACK TO SAVEPOINT``)."""
    return Step(fetch=False, command=sql)


def defer(session: Session, step: Step) -> None:
    """Send the command ``step`` ahead of the next statement on this session's connection
    (with the next ``send``, in its round trip); never, if no statement follows before the
    transaction ends."""
    assert step.command is not None, "only commands without parameters or rows are deferred"
    session.connection().info.setdefault(_DEFERRED, []).append(step)


def defer_on(conn: Connection, step: Step) -> None:
    """``defer`` on a connection (a ``begin`` listener's: the settings of a transaction)."""
    assert step.command is not None, "only commands without parameters or rows are deferred"
    conn.info.setdefault(_DEFERRED, []).append(step)


def withdraw(session: Session, step: Step) -> bool:
    """Take ``step`` back if it is still deferred (unsent); return whether it was (``False``:
    it went out ahead of a statement). Other deferred commands stay queued."""
    queued: list[Step] = session.connection().info.get(_DEFERRED, [])
    for i, waiting in enumerate(queued):
        if waiting is step:
            del queued[i]
            return True
    return False


def discard(session: Session) -> list[Step]:
    """Drop the commands deferred and not yet sent; return them (empty: all were sent)."""
    return list(session.connection().info.pop(_DEFERRED, []))


def _deferred_first(conn: Connection, cursor: Any, sql: str, params: Any, context: Any, executemany: bool) -> None:
    """A statement about to run outside ``send``: the commands deferred go first (popped
    before they run, so their own execution does not come back here)."""
    deferred = conn.info.pop(_DEFERRED, None)
    for step in deferred or ():
        assert step.command is not None
        conn.exec_driver_sql(step.command)


def _drop_deferred(conn: Connection) -> None:
    """A command deferred inside a transaction belongs to it: its end drops what is unsent.
    Every end fires one of these events (a session closed without commit or rollback rolls
    back through SQLAlchemy); an invalidated connection's ``info`` is cleared by the pool when
    it reconnects."""
    if not conn.invalidated:
        conn.info.pop(_DEFERRED, None)


# What ``attach`` puts on an engine: (event, listener).
LISTENERS: tuple[tuple[str, Any], ...] = (
    ("before_cursor_execute", _deferred_first),
    ("commit", _drop_deferred),
    ("rollback", _drop_deferred),
)


def attach(engine: Engine) -> None:
    """Put the pipeline's listeners on ``engine`` (this engine object only: a view made with
    ``execution_options()`` hears its own connections, not its parent's); twice is once."""
    for name, listener in LISTENERS:
        if not event.contains(engine, name, listener):
            event.listen(engine, name, listener)


def detach(engine: Engine) -> None:
    """Take the pipeline's listeners off ``engine`` again."""
    for name, listener in LISTENERS:
        if event.contains(engine, name, listener):
            event.remove(engine, name, listener)


def attached(engine: Engine) -> bool:
    """Whether ``engine`` carries the pipeline's listeners."""
    return all(event.contains(engine, name, listener) for name, listener in LISTENERS)


def send(session: Session, steps: Sequence[Step], *, commit: bool = False) -> list[list[dict[str, Any]] | None]:
    """Run ``steps`` (after the deferred commands) in one message and one round trip in the
    session's transaction; return each step's rows (``None`` where ``fetch`` is false).

    ``commit``: the transaction's ``COMMIT`` ends the same message (a short transaction is then
    one round trip, BEGIN to COMMIT; it does not run if a step failed). The transaction has
    then ended on the server: the caller closes the session, whose rollback finds nothing open."""
    deferred = discard(session)
    everything = [*deferred, *steps, *([command("COMMIT")] if commit else [])]
    conn = session.connection()
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection) or _MISSING:
        _warn_slow_path(driver)
        return _one_by_one(conn, everything)[len(deferred):len(deferred) + len(steps)]
    before_listeners, after_listeners = statement_listeners(conn)
    compiled = [_compiled(conn, step) for step in everything]
    contexts = [SimpleNamespace() for _ in everything]  # what the listeners see as the execution context
    cursors: list[Any] = []
    current: tuple[str | None, Any, Any] = (None, None, None)
    try:
        with psycopg.ClientCursor(driver) as binder:
            texts = []
            for i, (sql, params) in enumerate(compiled):
                cursor = driver.cursor(row_factory=dict_row)
                cursors.append(cursor)
                # as SQLAlchemy does: each listener may rewrite the statement (retval=True);
                # a listener that keeps state for its after-hook (OpenTelemetry's span) keeps
                # it on the context, here one object per statement handed to both hooks
                for listener in before_listeners:
                    sql, params = listener(conn, cursor, sql, params, contexts[i], False)
                compiled[i] = (sql, params)
                current = (sql, params, cursor)
                texts.append(binder.mogrify(sql, params) if params else sql)
        begin = _transaction_start(driver)
        message = ";\n".join([*([begin] if begin else []), *texts])
        driver.pgconn.send_query(message.encode(driver.info.encoding))
        results = read_answers(driver)
        if begin:
            _check(results.pop(0), driver)
        for i, result in enumerate(results):
            current = (compiled[i][0], compiled[i][1], cursors[i])
            _check(result, driver)
        if len(results) != len(everything):
            raise psycopg.InternalError(f"{len(everything)} statements sent, {len(results)} answers")
        answers: list[list[dict[str, Any]] | None] = []
        for step, cursor, result, (sql, params), context in zip(everything, cursors, results, compiled, contexts,
                                                                strict=True):
            current = (sql, params, cursor)
            hand_answer(cursor, result)
            answers.append(cursor.fetchall() if step.fetch else None)
            for after in after_listeners:
                after(conn, cursor, sql, params, context, False)
    except psycopg.Error as exc:
        # SQLAlchemy's own translation: a DBAPIError, and the pool told of a lost connection
        raise_translated(conn, exc, current[0], current[1], current[2])
    finally:
        for cursor in cursors:
            cursor.close()
    return answers[len(deferred):len(deferred) + len(steps)]


def _transaction_start(driver: psycopg.Connection[Any]) -> str | None:
    """The ``BEGIN`` psycopg would send before a statement (with the connection's isolation
    level, read-only and deferrable settings), or ``None`` when a transaction is open (or
    the connection commits each statement itself)."""
    if driver.autocommit or driver.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return None
    parts = ["BEGIN"]
    if driver.isolation_level is not None:
        parts += ["ISOLATION LEVEL", psycopg.IsolationLevel(driver.isolation_level).name.replace("_", " ")]
    if driver.read_only is not None:
        parts.append("READ ONLY" if driver.read_only else "READ WRITE")
    if driver.deferrable is not None:
        parts.append("DEFERRABLE" if driver.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def _check(result: pq.abc.PGresult, driver: psycopg.Connection[Any]) -> None:
    """Raise the error a statement's answer carries (as psycopg would)."""
    if result.status == pq.ExecStatus.FATAL_ERROR:
        raise psycopg.errors.error_from_result(result, encoding=driver.info.encoding)


def in_failed_transaction(session: Session) -> bool:
    """True when the session's transaction is open but failed (a statement of it raised):
    it can still roll back to a savepoint. False when it ended (a COMMIT that failed)."""
    driver = session.connection().connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return True
    return driver.pgconn.transaction_status == pq.TransactionStatus.INERROR


def _compiled(conn: Connection, step: Step) -> tuple[str, Any]:
    """The statement in the driver's parameter style, and its parameters."""
    if step.command is not None:
        return step.command, None
    assert step.statement is not None, "a step is a command or a statement (Statements.step)"
    compiled = _compiled_statement(step.statement, conn.dialect)
    return compiled.string, compiled.construct_params(dict(step.params or {}))


def _compiled_statement(statement: TextClause, dialect: Any) -> Any:
    """``statement`` compiled for ``dialect``, once per statement object and dialect (a
    ``Statements`` holds one object per named statement of its schema)."""
    key = (id(statement), dialect.name)
    found = _COMPILED.get(key)
    if found is None or found[0] is not statement:
        found = _COMPILED[key] = (statement, statement.compile(dialect=dialect))
    return found[1]


# -- the drivers' private pieces (DEC-1.3): each named here only --------------------------

# psycopg's generator that sends a message already handed to libpq and reads every answer
# (one result per statement of the message), run by the connection's ``wait``.
_EXECUTE: Any = getattr(getattr(psycopg, "generators", None), "execute", None)


def missing() -> list[str]:
    """The private pieces this psycopg lacks (empty: ``send`` sends one message)."""
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


# The private pieces this driver lacks; any one missing sends the statements one by one.
_MISSING = missing()
_WARNED: set[str] = set()


def _warn_slow_path(driver: Any) -> None:
    """Say once per cause that statements go one round trip each (PERF-8 fails too)."""
    cause = (f"psycopg lacks {', '.join(_MISSING)}" if isinstance(driver, psycopg.Connection)
             else f"the driver is {type(driver).__module__}, not psycopg 3")
    if cause not in _WARNED:
        _WARNED.add(cause)
        logger.warning("statements sent together go one round trip each: %s (database.pipeline.missing)", cause)


# Each statement object compiled once per dialect (SQLAlchemy caches its own executions
# alike): a cache keyed by the statement object, which it keeps alive, so a key is never reused.
_COMPILED: dict[tuple[int, str], tuple[TextClause, Any]] = {}


def _one_by_one(conn: Connection, steps: Sequence[Step]) -> list[list[dict[str, Any]] | None]:
    results: list[list[dict[str, Any]] | None] = []
    for step in steps:
        if step.command is not None:
            conn.exec_driver_sql(step.command)
            results.append(None)
            continue
        assert step.statement is not None
        result = conn.execute(step.statement, dict(step.params or {}))
        results.append([dict(row) for row in result.mappings()] if step.fetch else None)
    return results
