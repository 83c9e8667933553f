"""The scheduler's database, one object per service: its engine, its schema and every
statement it runs, with a repository per concern (DEC-DB).

``Database(engine, schema)`` is built by whoever builds the service (``SchedulerService``, a
command of the CLI, a benchmark, the simulation) and handed explicitly to whatever runs SQL:
the loop, the stores and commands of the application layer, the route modules. Nothing of it
is process-wide: the statements it holds name its own schema (``Statements.of``: parsed once
per schema), so two services with two schemas share a process, each reading and writing its
own tables (EMB-11); and the pipeline's listeners go on the engine it works through, never on
a SQLAlchemy class, so a host's other engines see none of them (EMB-12).

The repositories run the statements of their concern on a session the caller hands them (the caller
owns the transaction: a request's, the batch's): ``events`` (the claim, the outcomes, the next due
row; storing, listing, resetting and cancelling rows, the counts), ``decisions`` (the one read and
the one write of ``nudging.decision``), ``web_sessions`` (the browsers' sessions), ``inbox`` (the
stream's numbers, the participants' notifications), ``deliveries`` (the outbox: its claim, its
records, its list and gauges, DEC-OUTBOX), ``push_subscriptions`` (the participants' web-push
subscriptions) and ``operations`` (heartbeats, metrics, the overview, retention, the audit trail).
``statements`` is every statement by name (the benchmarks' EXPLAIN, a test's witness); the layers
above run none but through a repository.

A ``Database`` is also what those layers open sessions with: ``database.begin()`` and
``database()`` are its sessionmaker's. What its repositories return, the API, the inbox's
stream and the audit trail send as JSON through the one conversion, ``row_as_json`` (the
models of ``scheduler.web.http.answers`` validate the result).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, RowMapping
from sqlalchemy.orm import Session, sessionmaker

from scheduler.config import ConfigError, schema_problem
from scheduler.database import pipeline
from scheduler.database.deliveries import DeliveryRepository
from scheduler.database.engine import database_time, make_sessionmaker
from scheduler.database.events import EventRepository
from scheduler.database.notifications import DecisionRepository, InboxRepository
from scheduler.database.operations import OperationsRepository
from scheduler.database.push_subscriptions import PushSubscriptionRepository
from scheduler.database.queries import DEFAULT_SCHEMA, Statements
from scheduler.database.web_sessions import WebSessionRepository


class Database:
    """One engine of the service, its schema, its statements and its repositories."""

    def __init__(self, engine: Engine, schema: str = DEFAULT_SCHEMA, *, statements: Statements | None = None) -> None:
        problem = schema_problem(schema)
        if problem is not None:
            raise ConfigError(f"schema {schema!r}: {problem}")
        self.engine = engine
        self.schema = schema
        self.statements = statements if statements is not None else Statements.of(schema)
        if self.statements.schema != schema:
            raise ValueError(f"statements of schema {self.statements.schema!r} for a database of schema {schema!r}")
        self.sessions: sessionmaker[Session] = make_sessionmaker(engine)
        # the listeners of a pipelined send, on this engine object only (EMB-12)
        pipeline.attach(engine)
        self.events = EventRepository(self.statements)
        self.decisions = DecisionRepository(self.statements)
        self.web_sessions = WebSessionRepository(self.statements)
        self.inbox = InboxRepository(self.statements)
        self.operations = OperationsRepository(self.statements)
        self.deliveries = DeliveryRepository(self.statements)
        self.push_subscriptions = PushSubscriptionRepository(self.statements)

    def on(self, engine: Engine) -> Database:
        """The same schema and statements through another engine (the loop's own pool)."""
        return self if engine is self.engine else Database(engine, self.schema, statements=self.statements)

    def server_time(self) -> datetime:
        """The database server's current time (what production's clock measures, DEC-10)."""
        return database_time(self.engine)

    def begin(self) -> AbstractContextManager[Session]:
        """A session in a transaction that commits when the block ends (the sessionmaker's ``begin``)."""
        return self.sessions.begin()

    def __call__(self, **kwargs: Any) -> Session:
        """A new session (the sessionmaker's call)."""
        return self.sessions(**kwargs)

    def close(self) -> None:
        """Take the pipeline's listeners off the engine (it stays usable for anything else;
        the engine's owner disposes of it)."""
        pipeline.detach(self.engine)

    def __repr__(self) -> str:
        return f"Database({self.engine!r}, schema={self.schema!r})"


def row_as_json(row: Mapping[str, Any] | RowMapping) -> dict[str, Any]:
    """``row`` as a dict of JSON-ready values: every column as it is, a ``datetime`` as its
    ISO 8601 text."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
