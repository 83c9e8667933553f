"""Statements sent together (``scheduler.database.pipeline``): what a poll relies on.

The claim with its BEGIN, the set-based read with its savepoint, the batch's last write with its
COMMIT: each goes as one message. These tests pin what the callers rely on (PERF-6): the statements
run in the session's one transaction, BEGIN included, with their rows in order; SQLAlchemy's
listeners see each of them; a database error is SQLAlchemy's ``DBAPIError`` and leaves the
transaction able to roll back to a savepoint sent in the same message and go on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from scheduler.database import pipeline
from scheduler.database.queries import Statements, load_queries


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with sessionmaker(engine)() as s:
        yield s
        s.rollback()


@pytest.mark.clause("PERF-6")
def test_pipelined_statements_run_in_the_sessions_one_transaction_and_return_their_rows(
    session: Session, engine: Engine
) -> None:
    """PERF-6: a pipeline opens the session's transaction (its BEGIN sent with the statements);
    a deferred command goes first; each statement's rows come back in order; the session's
    later statements run in the same transaction."""
    seen: list[str] = []

    def listen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.split()[0])

    event.listen(engine, "before_cursor_execute", listen)
    try:
        pipeline.defer(session, pipeline.command("SAVEPOINT first"))
        fragment = load_queries()["participant_lock_key"].sql
        sent = pipeline.send(session, [
            pipeline.command("SAVEPOINT second"),
            pipeline.Step(command="SELECT txid_current() AS tx, 1 AS one"),
            Statements.of().step("claim_due_events", {"now": "2026-01-01T00:00:00Z", "batch_size": 5,
                                                "after_due": "0001-01-02T00:00:00Z", "after_id": "",
                                                "busy": []}),
        ])
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert seen[:3] == ["SAVEPOINT", "SAVEPOINT", "SELECT"]  # the deferred command first, then the steps
    assert sent[0] is None and sent[2] == []
    assert sent[1] is not None and sent[1][0]["one"] == 1
    tx = sent[1][0]["tx"]
    assert session.execute(text("SELECT txid_current()")).scalar_one() == tx  # one transaction
    session.execute(text("RELEASE SAVEPOINT first"))  # both savepoints exist in it
    assert session.execute(text(f"SELECT {fragment} AS k FROM (SELECT 'u' AS user_id) AS p")).scalar_one()


@pytest.mark.clause("PERF-6")
def test_a_pipelined_error_is_sqlalchemys_and_the_transaction_rolls_back_to_its_savepoint(session: Session) -> None:
    """PERF-6: a statement that fails in a pipeline raises ``DBAPIError``; the savepoint sent
    ahead of it in the same round trip is there to roll back to, and the transaction goes on."""
    session.execute(text("CREATE TEMPORARY TABLE pipeline_probe (n integer)"))
    pipeline.defer(session, pipeline.command("SAVEPOINT probe"))
    with pytest.raises(DBAPIError) as raised:
        pipeline.send(session, [pipeline.Step(command="INSERT INTO pipeline_probe VALUES (1)", fetch=False),
                                pipeline.Step(command="SELECT 1 / 0", fetch=True)])
    assert not raised.value.connection_invalidated
    session.connection().exec_driver_sql("ROLLBACK TO SAVEPOINT probe")
    assert session.execute(text("SELECT count(*) FROM pipeline_probe")).scalar_one() == 0
    [rows] = pipeline.send(session, [pipeline.Step(command="SELECT 2 AS two")])
    assert rows == [{"two": 2}]


class ListenerFault(RuntimeError):
    """Raised by a statement listener, as the simulation's injected claim fault is."""


@pytest.mark.clause("PERF-6")
@pytest.mark.timeout(60)
def test_a_listener_that_raises_mid_pipeline_fails_the_call_and_leaves_the_session_usable(
    session: Session, engine: Engine
) -> None:
    """PERF-6: a ``before_cursor_execute`` listener that raises while statements are being queued
    (the simulation injects a failing claim so) ends the call with its error, at once: the
    pipeline still sends what it queued and reads the answers, and the session rolls back."""
    def fail_on_second(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "second" in statement:
            raise ListenerFault("injected")

    event.listen(engine, "before_cursor_execute", fail_on_second)
    try:
        with pytest.raises(ListenerFault):
            pipeline.send(session, [pipeline.Step(command="SELECT 'first' AS a"),
                                    pipeline.Step(command="SELECT 'second' AS b")])
    finally:
        event.remove(engine, "before_cursor_execute", fail_on_second)
    session.rollback()
    [rows] = pipeline.send(session, [pipeline.Step(command="SELECT 3 AS three")])
    assert rows == [{"three": 3}]


@pytest.mark.clause("PERF-6")
def test_a_deferred_command_goes_ahead_of_any_statement_and_is_never_sent_when_none_follows(
    session: Session, engine: Engine
) -> None:
    """PERF-6: a deferred savepoint runs just ahead of a statement sent through the session
    (a per-event dispatcher's), in the same transaction, and can be rolled back to; one that no
    statement follows is never sent, and the transaction's end drops it."""
    seen: list[str] = []

    def listen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()[:2]))

    event.listen(engine, "before_cursor_execute", listen)
    try:
        session.execute(text("SELECT 1"))  # the transaction is open
        pipeline.defer(session, pipeline.command("SAVEPOINT checkpoint"))
        session.execute(text("CREATE TEMP TABLE written (n int)"))
        assert seen == ["SELECT 1", "SAVEPOINT checkpoint", "CREATE TEMP"]
        assert pipeline.discard(session) == []  # it was sent
        session.connection().exec_driver_sql("ROLLBACK TO SAVEPOINT checkpoint")
        assert session.execute(text("SELECT to_regclass('pg_temp.written')")).scalar_one() is None
        seen.clear()
        pipeline.defer(session, pipeline.command("SAVEPOINT unused"))
        session.commit()
        session.execute(text("SELECT 2"))
        assert seen == ["SELECT 2"]  # the commit dropped it unsent
    finally:
        event.remove(engine, "before_cursor_execute", listen)
