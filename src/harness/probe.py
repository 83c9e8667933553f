"""The rollback probe: what a dispatch the harness rolls back on purpose left behind (SIM-HOST-8).

A host's dispatcher must write only through the session it is handed, so that a rolled-back
event leaves nothing. The harness checks that itself, with nothing from the host: for every
event that carries an injected failure (``python`` or ``database``: the scheduler rolls back
its savepoint), the probe reads, on a connection of its own that sees committed state only,
every table outside the scheduler's schema, and the outbox (``scheduler.deliveries``), just
before the host's dispatcher is called and just after it returned (or raised). The batch has
not committed in between, so a committed change there was made outside the scheduler's
transaction: a row written on a connection of the dispatcher's own, an outbox row queued
the same way. A message of that dispatch handed to a replica's ``Publisher`` is the other
outbound effect the probe looks for (by identity: the very ``OutboundMessage`` the rolled-back
dispatch returned).

A table is summed up by its row count and the digest of its rows' ``(xmin, ctid)``: an
insert, an update or a delete changes it. Another replica may commit a batch while the
dispatcher runs (one waiting on a row lock the host's own writes took, released by that
commit): every replica's commit is counted, and a window in which one committed tells
nothing (it is counted as ``inconclusive``, never a violation). A table the probe cannot
read within ``LOCK_TIMEOUT`` (the dispatcher holds an exclusive lock on it) is left out of
that window.

The findings are collected in the replicas' threads and raised by the oracle after the step
(the run's ``Violation``, naming the event and the table).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

from scheduler.database.queries import DEFAULT_SCHEMA
from scheduler.nudging.publishers import RecordingPublisher
from scheduler.types import OutboundMessage

OUTBOX = f"{DEFAULT_SCHEMA}.deliveries"
# Every ordinary table a host may own: outside the scheduler's schema and PostgreSQL's own.
TABLES = text(
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind = 'r' AND n.nspname <> :schema"
    " AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"
    " ORDER BY 1"
)
LOCK_TIMEOUT = text("SET lock_timeout = '200ms'")
# The faults after which the scheduler rolls the event's work back (its savepoint).
ROLLED_BACK = ("python", "database")


@dataclass(frozen=True)
class TableState:
    rows: int
    digest: str


@dataclass(frozen=True)
class Finding:
    """A committed change (or a pushed message) left by a dispatch rolled back on purpose."""

    event_id: str
    fault: str
    what: str  # "public.host_deliveries: 1 row more", "a message pushed by replica-0"

    def sentence(self) -> str:
        return (f"the dispatch of event {self.event_id}, rolled back on purpose (an injected {self.fault} "
                f"failure), left {self.what}: the host's dispatcher wrote outside the scheduler's transaction")


def _snapshot_statement(tables: Sequence[str]) -> Any:
    parts = [f"SELECT {i} AS i, count(*) AS n, coalesce(md5(string_agg(t.xmin::text || t.ctid::text, ','"
             f" ORDER BY t.ctid)), '') AS h FROM {name} AS t" for i, name in enumerate(tables)]
    return text(" UNION ALL ".join(parts))


class RollbackProbe:
    """One run's probe: its own autocommit connection, shared by the replicas' threads."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)
        self._lock = threading.Lock()
        self._commits = 0
        self.findings: list[Finding] = []
        self.rolled_back_messages: list[tuple[str, str, OutboundMessage]] = []
        self.windows = 0
        self.inconclusive = 0

    def watch(self, engines: Iterable[Engine]) -> None:
        """Count every commit of these engines (the replicas'): a window with one tells nothing."""
        for engine in engines:
            event.listen(engine, "commit", self._committed)
            event.listen(engine, "before_cursor_execute", self._statement)

    def _committed(self, conn: Any) -> None:
        with self._lock:
            self._commits += 1

    def _statement(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any,
                   executemany: bool) -> None:
        if statement.strip().upper() == "COMMIT":  # the pipeline's COMMIT travels as a statement
            self._committed(conn)

    def close(self) -> None:
        self.engine.dispose()

    def snapshot(self) -> tuple[int, dict[str, TableState | None]]:
        """The replicas' commits so far, and each table's state (``None``: unreadable now)."""
        with self._lock:
            commits = self._commits
        with self.engine.connect() as conn:
            conn.execute(LOCK_TIMEOUT)
            tables = [*conn.execute(TABLES, {"schema": DEFAULT_SCHEMA}).scalars(), OUTBOX]
            states: dict[str, TableState | None] = dict.fromkeys(tables)
            try:
                for i, n, digest in conn.execute(_snapshot_statement(tables)):
                    states[tables[i]] = TableState(int(n), str(digest))
            except DBAPIError:  # a table locked exclusively by the dispatcher: read them one by one
                for name in tables:
                    try:
                        _, n, digest = conn.execute(_snapshot_statement([name])).one()
                    except DBAPIError:
                        continue
                    states[name] = TableState(int(n), str(digest))
        return commits, states

    def compare(self, before: tuple[int, dict[str, TableState | None]], event_id: str, fault: str) -> None:
        """Record what committed between ``before`` and now, unless another replica committed."""
        commits_after, after = self.snapshot()
        commits_before, states = before
        with self._lock:
            self.windows += 1
            if commits_after != commits_before:
                self.inconclusive += 1
                return
            for name in sorted(set(states) | set(after)):
                was, now = states.get(name), after.get(name)
                if now is None or was == now:
                    continue  # unreadable now, or unchanged
                if name not in states:
                    self.findings.append(Finding(event_id, fault, f"a new table {name} ({now.rows} rows)"))
                    continue
                if was is None:
                    continue  # unreadable before
                more = now.rows - was.rows
                change = (f"{more} row{'s' if abs(more) != 1 else ''} more" if more > 0
                          else f"{-more} row{'s' if more != -1 else ''} fewer" if more < 0 else "rows changed")
                self.findings.append(Finding(event_id, fault, f"a committed change in {name} ({change})"))

    def rolled_back(self, event_id: str, fault: str, messages: Sequence[OutboundMessage]) -> None:
        """The messages a rolled-back dispatch returned: none of them may ever be pushed."""
        with self._lock:
            self.rolled_back_messages.extend((event_id, fault, m) for m in messages)

    def pushed(self, publishers: Iterable[tuple[str, object]]) -> None:
        """Record a rolled-back dispatch's message that a replica's publisher was handed."""
        with self._lock:
            rolled = {id(m): (event_id, fault) for event_id, fault, m in self.rolled_back_messages}
            if not rolled:
                return
            for name, publisher in publishers:
                messages = publisher.messages if isinstance(publisher, RecordingPublisher) else []
                for m in messages:
                    if id(m) in rolled:
                        event_id, fault = rolled[id(m)]
                        self.findings.append(Finding(event_id, fault, f"a message pushed by {name} "
                                                                      f"(notification {m.notification_id})"))

    def first_finding(self) -> Finding | None:
        with self._lock:
            return self.findings[0] if self.findings else None
