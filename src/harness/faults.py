"""Fault injection at the true edges: the dispatcher each replica is handed, and its connection.

Nothing here changes scheduler code. An event's own facts say how its dispatch fails
(``sim_fault``), whether it is dispatched alone or decided with its batch; a replica can be
armed so that its next poll raises outside any event (when it claims, or when it commits);
the loop is stopped through its own stop event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from harness.probe import ROLLED_BACK, RollbackProbe
from scheduler.database import pipeline
from scheduler.database.queries import DEFAULT_SCHEMA
from scheduler.nudging.decision import BatchDecisions
from scheduler.nudging.dispatch import NudgingPlatform
from scheduler.types import (
    BatchDispatcher,
    DigitalTwinEvent,
    Dispatcher,
    DispatchResult,
    capabilities_of,
)

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
    """Whether ``statement`` is the claim's (the simulation's database is in the default schema)."""
    return f"FROM {DEFAULT_SCHEMA}.scheduled_events" in statement and "FOR UPDATE" in statement


class FaultyDispatcher(BatchDispatcher):
    """Wraps the run's dispatcher (the production platform, or a host's): runs it, records
    the call, then applies the fault. It declares what the dispatcher it wraps declares: safe
    to repeat when that one is, and a batch decided whole only for the platform (its
    ``decide_batch`` is ``None`` otherwise: the batch runs per event).

    The fault is applied *after* the real dispatcher decided, so a failing event always has
    effects to undo; the harness checks they vanish (and a host's own check, SIM-12, that its
    rows do). An event the dispatcher refused (raising, or returning its refusal) gets no
    fault: the dispatcher's own failure comes first (SIM-HOST-5). ``slow`` delays the return
    and changes nothing else. A claimed batch is decided whole, as production decides it
    (``decide_batch``): each event's call is recorded once its rules ran, and its fault fails
    it alone after its decision, as the batch's ``check``.
    """

    def __init__(self, inner: Dispatcher, replica: int) -> None:
        self.inner = inner
        self.replica = replica
        # called as often as the dispatcher it wraps may be (DEC-1.4)
        self.safe_to_repeat = capabilities_of(inner).safe_to_repeat
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.on_call: Callable[[], None] | None = None  # the run step's "stop after k"
        # False: every batch runs per event, as for a host's dispatcher that cannot decide a
        # batch (and production's fallback), the path where each event's savepoint matters
        self.decides_batches = True
        # a host's run: what an event rolled back on purpose left committed (SIM-HOST-8)
        self.probe: RollbackProbe | None = None

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        record = self._record(event)
        planned = event.facts.get("sim_fault")
        probed = self.probe.snapshot() if self.probe is not None and planned in ROLLED_BACK else None
        try:
            try:
                result = self.inner(session, event, now)
            finally:
                if probed is not None and self.probe is not None:
                    self.probe.compare(probed, str(event.scheduled_event_id), str(planned))
            if probed is not None and self.probe is not None:
                self.probe.rolled_back(str(event.scheduled_event_id), str(planned), getattr(result, "outbound", ()))
            fault = self._decided(event, result, record)
            if fault == "python":
                raise InjectedEventFault(f"injected failure of event {event.scheduled_event_id}")
            if fault == "database":
                session.execute(FAILING_STATEMENT)  # aborts the transaction: the caller's savepoint confines it
            if fault == "slow":
                session.execute(SLOW_STATEMENT)
            return result
        finally:
            if self.on_call is not None:
                self.on_call()

    @property
    def replays_on_failure(self) -> bool:
        """Whether a failing event makes the loop roll back to its checkpoint and replay: the
        optimistic per-event path (DEC-1), not a batch decided whole (DEC-1.5) nor a
        dispatcher called once per event (DEC-1.4)."""
        return self.safe_to_repeat and not (self.decides_batches and isinstance(self.inner, NudgingPlatform))

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None) -> BatchDecisions | None:
        """The platform's batch decision with the events' faults applied, each to its own
        event after its decision (``None``, the per-event path, for a dispatcher that is not
        the platform). A call is recorded (and ``on_call`` told) for each event whose rules
        ran, in order, as the per-event path records one per dispatch."""
        if not self.decides_batches or not isinstance(self.inner, NudgingPlatform):
            return None
        records: list[dict[str, Any]] = []

        def ran(count: int) -> None:
            while len(records) < count:
                records.append(self._record(events[len(records)]))
                if self.on_call is not None:
                    self.on_call()

        def evaluated() -> bool:
            ran(len(records) + 1)
            return stop is not None and stop()

        def fault(index: int, result: DispatchResult) -> Exception | None:
            ran(index + 1)
            event = events[index]
            kind = self._decided(event, result, records[index])
            if kind == "python":
                return InjectedEventFault(f"injected failure of event {event.scheduled_event_id}")
            if kind == "database":
                return _failing_statement_in_savepoint(session)
            return None

        decisions = self.inner.decide_batch(session, events, now, evaluated, fault)
        ran(len(decisions.results))
        return decisions

    def _record(self, event: DigitalTwinEvent) -> dict[str, Any]:
        record: dict[str, Any] = {
            "event_id": event.scheduled_event_id,
            "version": int(event.facts.get("sim_version", -1)),
            "result": "raised",
            "outcome": None,
            "notification_ids": (),
        }
        with self._lock:
            self.calls.append(record)
        return record

    def _decided(self, event: DigitalTwinEvent, result: DispatchResult, record: dict[str, Any]) -> str | None:
        """Record what the dispatcher decided; return the event's fault (``python``, ``database``,
        ``slow``), or None for an event the dispatcher refused.

        A refusal the dispatcher returns (``DispatchResult(refusal=...)``) is its own failure
        as much as one it raises: it comes first, and no fault applies to it (SIM-HOST-5), so
        the row fails with the dispatcher's reason, as the model expects."""
        record["outcome"] = result.outcome
        record["notification_ids"] = tuple(str(n["id"]) for n in result.notifications)
        if result.refusal is not None:
            record["result"] = "refused"
            return None
        fault = event.facts.get("sim_fault")
        if fault in ("python", "database"):
            return str(fault)
        record["result"] = "ok"
        return "slow" if fault == "slow" else None  # slow: it dispatches, a while later

    def take_calls(self, through: str | None = None) -> list[dict[str, Any]]:
        """The calls recorded so far, up to the last one of event ``through`` when given: the
        calls of events a batch decided ahead of their dispatch wait for theirs."""
        with self._lock:
            ids = [c["event_id"] for c in self.calls]
            end = len(ids) - ids[::-1].index(through) if through in ids else len(ids)
            calls, self.calls = self.calls[:end], self.calls[end:]
            return calls


def _failing_statement_in_savepoint(session: Session) -> DBAPIError:
    """A database error inside a batch decided whole: the failing statement in a savepoint of
    its own, which confines it to its event as a savepoint does one event's work. When the
    savepoint did not confine it (the transaction is left failed: a savepoint that does not
    work), the error is the batch's, and it propagates."""
    try:
        with session.begin_nested():
            session.execute(FAILING_STATEMENT)
    except DBAPIError as exc:
        if exc.connection_invalidated or pipeline.in_failed_transaction(session):
            raise
        return exc
    raise AssertionError("the failing statement did not fail")


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
