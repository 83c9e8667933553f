"""Fault injection at the true edges: the dispatcher each replica is handed, and its connection.

Nothing here changes scheduler code. An event's own facts say how its dispatch fails
(``sim_fault``); a replica can be armed so that its next poll raises outside any event
(when it claims, or when it commits); the loop is stopped through its own stop event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session

from scheduler.core.dispatch_contract import repeatable
from scheduler.database.queries import current_schema
from scheduler.types import DigitalTwinEvent, Dispatcher, DispatchResult

# A statement that always fails inside the database, aborting the transaction it runs in.
FAILING_STATEMENT = text("SELECT 1 / 0 AS deliberate_division_by_zero")
# A slow dispatcher: it holds its savepoint in the database a while before it returns. Real
# time, not the run's clock (the clock is the reference every recorded time is judged by).
SLOW_STATEMENT = text("SELECT pg_sleep(0.02) AS deliberately_slow_dispatcher")


class InjectedEventFault(RuntimeError):
    """Raised by the dispatcher wrapper for an event whose facts ask for a Python error."""


class InjectedPollFault(RuntimeError):
    """Raised on a replica's connection so that a whole poll fails outside any event."""


def is_claim_statement(statement: str) -> bool:
    return f"FROM {current_schema()}.scheduled_events" in statement and "FOR UPDATE" in statement


class FaultyDispatcher:
    """Wraps the run's dispatcher (the production platform, or a host's): runs it, records
    the call, then applies the fault.

    The fault is applied *after* the real dispatcher wrote its rows, so a failing event
    always has effects to roll back; the harness checks they vanish (and a host's own check,
    SIM-12, that its rows do). ``slow`` delays the return and changes nothing else.
    """

    def __init__(self, inner: Dispatcher, replica: int) -> None:
        self.inner = inner
        self.replica = replica
        # called as often as the dispatcher it wraps may be (DEC-1.4)
        self.safe_to_repeat = repeatable(inner)
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.on_call: Callable[[], None] | None = None  # the run step's "stop after k"

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        facts = event.facts
        record: dict[str, Any] = {
            "event_id": event.scheduled_event_id,
            "version": int(facts.get("sim_version", -1)),
            "result": "raised",
            "outcome": None,
            "notification_ids": (),
        }
        with self._lock:
            self.calls.append(record)
        try:
            result = self.inner(session, event, now)
            record["outcome"] = result.outcome
            record["notification_ids"] = tuple(str(n["id"]) for n in result.notifications)
            fault = facts.get("sim_fault")
            if fault == "python":
                raise InjectedEventFault(f"injected failure of event {event.scheduled_event_id}")
            if fault == "database":
                session.execute(FAILING_STATEMENT)
            if fault == "slow":
                session.execute(SLOW_STATEMENT)
            record["result"] = "refused" if result.refusal is not None else "ok"
            return result
        finally:
            if self.on_call is not None:
                self.on_call()

    def take_calls(self) -> list[dict[str, Any]]:
        with self._lock:
            calls, self.calls = self.calls, []
            return calls


class PollBudget(threading.Event):
    """The production loop's stop event, set after a given number of polls.

    ``Scheduler.run_blocking`` waits on its stop event between polls; this event counts
    those waits instead of sleeping, so one step runs exactly ``polls`` polls.
    """

    def __init__(self, polls: int) -> None:
        super().__init__()
        self.remaining = polls

    def wait(self, timeout: float | None = None) -> bool:
        self.remaining -= 1
        if self.remaining <= 0:
            self.set()
        return self.is_set()


class ArmedFaults:
    """One-shot poll faults on a replica's engine: ``claim`` or ``commit``."""

    def __init__(self, engine: Engine) -> None:
        self.armed: str | None = None
        self.fired: list[str] = []
        event.listen(engine, "before_cursor_execute", self._before_execute)
        event.listen(engine, "commit", self._on_commit)

    def arm(self, where: str) -> None:
        if where not in ("claim", "commit"):
            raise ValueError(f"a poll fault is 'claim' or 'commit', not {where!r}")
        self.armed = where

    def _before_execute(self, conn: Any, cursor: Any, statement: str, params: Any,
                        context: Any, executemany: bool) -> None:
        if self.armed == "claim" and is_claim_statement(statement):
            self.armed = None
            self.fired.append("claim")
            raise InjectedPollFault("injected failure of the poll while claiming")
        if self.armed == "commit" and statement.strip().upper() == "COMMIT":
            # the batch's COMMIT travels as a statement, with its last write (DEC-1): fail it
            # before it leaves, as a COMMIT that fails commits nothing
            self._fail_commit()

    def _on_commit(self, conn: Any) -> None:
        # a transaction SQLAlchemy commits itself (no COMMIT statement went first)
        self._fail_commit()

    def _fail_commit(self) -> None:
        if self.armed == "commit":
            self.armed = None
            self.fired.append("commit")
            raise InjectedPollFault("injected failure of the poll while committing")


Rewrite = Callable[[str, Any], tuple[str, Any]]


def install_rewrites(engine: Engine, rewrites: list[Rewrite]) -> None:
    """Rewrite every statement a broken replica sends (its bug lives at the driver edge)."""
    if not rewrites:
        return

    def rewrite(conn: Any, cursor: Any, statement: str, params: Any,
                context: Any, executemany: bool) -> tuple[str, Any]:
        for fn in rewrites:
            statement, params = fn(statement, params)
        return statement, params

    event.listen(engine, "before_cursor_execute", rewrite, retval=True)
