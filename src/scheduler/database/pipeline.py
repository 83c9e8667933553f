"""Statements sent together: psycopg's pipeline mode under a SQLAlchemy session (issue 16 §2).

In pipeline mode psycopg sends several statements without waiting for each one's answer,
with its implicit ``BEGIN`` ahead of the first, so they cost one round trip instead of one
each. SQLAlchemy has no pipeline of its own, so ``send`` runs the statements on the
session's psycopg connection, inside the session's transaction, and tells SQLAlchemy's
``before_cursor_execute`` / ``after_cursor_execute`` listeners about each of them as if
SQLAlchemy had sent it (the statement tests, the benchmarks' profile and tracing hooks see
every statement, and a listener registered with ``retval=True`` may rewrite it, as the
simulation's broken variants do). A database error is raised as SQLAlchemy raises it (a ``DBAPIError``,
with ``connection_invalidated`` set and the connection invalidated when it is gone).

``defer`` queues a command (a ``SAVEPOINT``) to travel ahead of the next ``send`` on the
same session, so it costs no round trip of its own; ``discard`` drops it unsent. A
statement run through ``Session.execute`` meanwhile would run before the deferred command:
the callers send nothing else in between (``core.set_based``).

On a connection that is not psycopg's (another driver), ``send`` runs the statements one
by one through the session: the same results, a round trip each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from scheduler.database.queries import statement

# Where a session keeps the commands deferred to its next ``send`` (its ``info``).
_DEFERRED = "scheduler.database.pipeline.deferred"


@dataclass(frozen=True)
class Step:
    """One statement of a pipeline: a named statement of ``queries.sql`` with its
    parameters, or a raw command (``SAVEPOINT name``, no parameters); ``fetch``: its rows
    are wanted (as dicts, in order)."""

    name: str | None = None
    params: Mapping[str, Any] | None = None
    fetch: bool = True
    command: str | None = None


def named(name: str, params: Mapping[str, Any], fetch: bool = True) -> Step:
    """A named statement of ``queries.sql``."""
    return Step(name=name, params=params, fetch=fetch)


def command(sql: str) -> Step:
    """A raw command without parameters or rows (``SAVEPOINT``, ``ROLLBACK TO SAVEPOINT``)."""
    return Step(fetch=False, command=sql)


def defer(session: Session, step: Step) -> None:
    """Send ``step`` ahead of the next ``send`` on this session, in the same round trip."""
    session.info.setdefault(_DEFERRED, []).append(step)


def discard(session: Session) -> list[Step]:
    """Drop the commands deferred and not yet sent; return them."""
    return list(session.info.pop(_DEFERRED, []))


def send(session: Session, steps: Sequence[Step]) -> list[list[dict[str, Any]] | None]:
    """Run ``steps`` (after the deferred commands) in one round trip in the session's
    transaction; return each step's rows (``None`` where ``fetch`` is false)."""
    deferred = discard(session)
    everything = [*deferred, *steps]
    conn = session.connection()
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return _one_by_one(conn, everything)[len(deferred):]
    compiled = [_compiled(conn, step) for step in everything]
    contexts = [SimpleNamespace() for _ in everything]  # what the listeners see as the execution context
    results: list[list[dict[str, Any]] | None] = []
    cursors: list[Any] = []
    current: tuple[str | None, Any, Any] = (None, None, None)
    try:
        # Queued inside the block; the block's end sends them with one Sync and reads every
        # answer (one round trip); the rows are then read from the cursors.
        with driver.pipeline() as queue:
            _no_flush_after_sync(queue)
            held_back = _hold_back_sends(queue)
            try:
                _begin_in_pipeline(driver, queue)
                for i, (sql, params) in enumerate(compiled):
                    cursor = driver.cursor(row_factory=dict_row)
                    # as SQLAlchemy does: each listener may rewrite the statement (retval=True);
                    # a listener that keeps state for its after-hook (OpenTelemetry's span) keeps
                    # it on the context, here one object per statement handed to both hooks
                    context = contexts[i]
                    for listener in conn.dispatch.before_cursor_execute:
                        sql, params = listener(conn, cursor, sql, params, context, False)
                    compiled[i] = (sql, params)
                    current = (sql, params, cursor)
                    cursor.execute(sql, params)
                    cursors.append(cursor)
            finally:
                if held_back:
                    # psycopg's own again, whatever happened: the pipeline's end sends what
                    # is queued and reads every answer (else it would wait for ever)
                    del queue._communicate_gen
            _send_with_sync(driver, queue)
        for step, cursor, (sql, params), context in zip(everything, cursors, compiled, contexts[:len(cursors)],
                                                        strict=True):
            current = (sql, params, cursor)
            results.append(cursor.fetchall() if step.fetch else None)
            for after in conn.dispatch.after_cursor_execute:
                after(conn, cursor, sql, params, context, False)
    except psycopg.Error as exc:
        # SQLAlchemy's own translation: a DBAPIError, and the pool told of a lost connection
        conn._handle_dbapi_exception(exc, current[0], current[1], current[2], None)
    finally:
        for cursor in cursors:
            cursor.close()
    return results[len(deferred):]


def in_failed_transaction(session: Session) -> bool:
    """True when the session's transaction is open but failed (a statement of it raised):
    it can still roll back to a savepoint. False when it ended (a COMMIT that failed)."""
    driver = session.connection().connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return True
    return driver.pgconn.transaction_status == psycopg.pq.TransactionStatus.INERROR


def _begin_in_pipeline(driver: psycopg.Connection[Any], queue: psycopg.Pipeline) -> None:
    """Queue the transaction's BEGIN ahead of the statements, in the same round trip.

    psycopg begins a transaction itself before a statement, but in pipeline mode it sends
    its BEGIN with a Sync of its own and waits for it: a round trip for nothing. Queued
    here first (psycopg's own BEGIN command, its answer checked by the pipeline like any
    command's), libpq reports the connection busy, so psycopg sends no second BEGIN. Uses
    two psycopg internals; without them psycopg's own BEGIN goes as before.
    """
    if driver.autocommit or driver.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return
    begin = getattr(driver, "_get_tx_start_command", None)
    results = getattr(queue, "result_queue", None)
    if begin is None or results is None:
        return
    driver.pgconn.send_query_params(begin(), None)
    results.append(None)  # a command's answer: checked, raised if it failed


def _no_flush_after_sync(queue: psycopg.Pipeline) -> None:
    """Read the pipeline's answers without sending a Flush message after its last Sync.

    psycopg ends a pipeline with a Sync, then a Flush request before reading. PostgreSQL
    arms ``idle_in_transaction_session_timeout`` when it answers a Sync, and disarms it when
    the next message arrives; a Flush does not arm it again. So after a pipeline that leaves
    the transaction open (the claim, the set-based read) the backend would sit "idle in
    transaction" with no timeout at all, and a replica frozen there would hold its batch's
    locks until it woke (reliability's partition scenario, REL-13). Every read here follows
    a Sync, which makes the server send everything before it, so no Flush is needed. Uses
    the pipeline's ``_fetch_gen`` (a psycopg internal); without it psycopg reads as before.
    """
    fetch = getattr(queue, "_fetch_gen", None)
    if fetch is None:
        return

    def fetch_after_sync(*, flush: bool) -> Any:
        return fetch(flush=False)

    queue._fetch_gen = fetch_after_sync  # type: ignore[method-assign]


def _hold_back_sends(queue: psycopg.Pipeline) -> bool:
    """Keep psycopg from sending each statement as it is queued (it flushes one by one);
    ``_send_with_sync`` then sends them all with their Sync in one write. True when held."""
    if not hasattr(queue, "_communicate_gen") or not hasattr(queue, "command_queue"):
        return False

    def nothing_yet() -> Any:
        return iter(())

    queue._communicate_gen = nothing_yet  # type: ignore[method-assign]
    return True


def _send_with_sync(driver: psycopg.Connection[Any], queue: psycopg.Pipeline) -> None:
    """Hand every queued statement to libpq and end them with a Sync, flushed in one write.

    psycopg sends a pipeline's commands one at a time, flushing each (held back here by
    ``_hold_back_sends``), and its Sync last; the server runs each statement as it arrives. A replica frozen between the two (a paused VM,
    a partition) would leave its backend in the middle of the pipeline: no Sync, so not
    "idle in transaction", so ``idle_in_transaction_session_timeout`` never ends it and its
    locks stay held (reliability's partition scenario). libpq buffers pipeline commands and
    its Sync flushes them together: the server has the Sync with the statements. psycopg's
    own Sync at the pipeline's end then follows, answered in the same round trip. Uses the
    pipeline's ``command_queue`` and ``result_queue`` (psycopg internals, like the BEGIN).
    """
    commands = getattr(queue, "command_queue", None)
    results = getattr(queue, "result_queue", None)
    if commands is None or results is None:
        return
    while commands:
        commands.popleft()()
    driver.pgconn.pipeline_sync()
    results.append(None)  # the Sync's answer, consumed like psycopg's own


def _compiled(conn: Connection, step: Step) -> tuple[str, Any]:
    """The statement in the driver's parameter style, and its parameters."""
    if step.command is not None:
        return step.command, None
    assert step.name is not None
    compiled = _COMPILED.get((step.name, conn.dialect.name))
    if compiled is None:
        compiled = _COMPILED[(step.name, conn.dialect.name)] = statement(step.name).compile(dialect=conn.dialect)
    return compiled.string, compiled.construct_params(dict(step.params or {}))


# Each named statement compiled once per dialect (SQLAlchemy caches its own executions alike).
_COMPILED: dict[tuple[str, str], Any] = {}


def _one_by_one(conn: Connection, steps: Sequence[Step]) -> list[list[dict[str, Any]] | None]:
    results: list[list[dict[str, Any]] | None] = []
    for step in steps:
        if step.command is not None:
            conn.exec_driver_sql(step.command)
            results.append(None)
            continue
        assert step.name is not None
        result = conn.execute(statement(step.name), dict(step.params or {}))
        results.append([dict(row) for row in result.mappings()] if step.fetch else None)
    return results
