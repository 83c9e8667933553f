"""REQ-0067 — a host's dispatcher is called once per event per poll, each event in a savepoint of its own.

In our words: a dispatcher that does not declare itself safe to repeat (a host's, which may
send a push or call a service from inside) is never called twice for one event in one poll:
each event runs in its own savepoint, a failure rolls back that event's work alone, and
nothing is replayed (DEC-1.4). The savepoint travels ahead of the dispatcher's first
statement, so a dispatcher that writes nothing costs no round trip; the built-in platform,
which declares ``safe_to_repeat`` (a ``DeclaredDispatcher``), keeps the optimistic batch with
its replay (DEC-1). A plain callable declares nothing, whatever attributes it carries.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.core.strategies import SavepointPerEvent
from scheduler.nudging.decision import NudgingPlatform
from scheduler.service import SchedulerService
from scheduler.types import (
    UNDECLARED,
    Capabilities,
    DeclaredDispatcher,
    DigitalTwinEvent,
    DispatchOutcome,
    DispatchResult,
    capabilities_of,
)
from tests.conftest import T0
from tests.helpers import post_event, rows

CREATE = "CREATE TABLE host_deliveries (event_id text NOT NULL, user_id text NOT NULL)"


class FakeHostDispatcher:
    """A fake host dispatcher: writes a ``host_deliveries`` row in the transaction it is handed
    and counts its calls per event; for the chosen participants it then raises, or sends a
    statement that aborts the transaction (a database error), or refuses the event."""

    def __init__(self, *, raise_for: frozenset[str] = frozenset(), database_error_for: frozenset[str] = frozenset(),
                 refuse_for: frozenset[str] = frozenset()) -> None:
        self.calls: Counter[str] = Counter()
        self.raise_for, self.database_error_for, self.refuse_for = raise_for, database_error_for, refuse_for

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.calls[event.user_id] += 1
        session.execute(text("INSERT INTO public.host_deliveries (event_id, user_id) VALUES (:e, :u)"),
                        {"e": event.scheduled_event_id, "u": event.user_id})
        if event.user_id in self.raise_for:
            raise RuntimeError(f"the host's push service refused {event.user_id}")
        if event.user_id in self.database_error_for:
            session.execute(text("SELECT 1 / 0"))
        if event.user_id in self.refuse_for:
            return DispatchResult(outcome=DispatchOutcome.INVALID_EVENT, refusal=f"{event.user_id} is unknown")
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)


def _five(client: TestClient, engine: Engine) -> dict[str, str]:
    with engine.begin() as conn:
        conn.execute(text(CREATE))
    posted = [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=10 - i)) for i in range(5)]
    return {row["user_id"]: row["id"] for row in posted}


@pytest.mark.clause("DEC-1.4")
@pytest.mark.clause("REQ-0067.2")
def test_a_hosts_dispatcher_is_called_once_per_event_when_others_in_the_batch_fail(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-1.4, REQ-0067.2: in a batch of five whose second event raises, whose third aborts the
    transaction with a database error and whose fourth is refused, every event is called exactly
    once; the failing three keep none of their writes and end failed with their reason, the other
    two keep exactly their one row and end dispatched."""
    ids = _five(client, engine)
    host = FakeHostDispatcher(raise_for=frozenset({"user-1"}), database_error_for=frozenset({"user-2"}),
                              refuse_for=frozenset({"user-3"}))
    service.scheduler.dispatcher = host
    report = service.scheduler.poll_once()
    assert (report.dispatched, report.failed) == (2, 3)
    assert host.calls == Counter({f"user-{i}": 1 for i in range(5)})
    kept = rows(engine, "SELECT event_id, user_id FROM public.host_deliveries ORDER BY user_id")
    assert kept == [{"event_id": ids["user-0"], "user_id": "user-0"}, {"event_id": ids["user-4"], "user_id": "user-4"}]
    stored = {r["user_id"]: r for r in rows(engine, "SELECT user_id, status, last_error FROM scheduled_events")}
    assert {u: r["status"] for u, r in stored.items()} == {
        "user-0": "dispatched", "user-1": "failed", "user-2": "failed", "user-3": "failed", "user-4": "dispatched"}
    assert "push service refused user-1" in stored["user-1"]["last_error"]
    assert "division by zero" in stored["user-2"]["last_error"]
    assert stored["user-3"]["last_error"] == "user-3 is unknown"


class StatementKinds:
    """Every statement the engine sends, by its first word (SAVEPOINT, RELEASE, ROLLBACK, ...)."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = statement.split()
        kind = " ".join(words[:2]).upper() if words[0].upper() in ("ROLLBACK", "RELEASE") else words[0].upper()
        self.kinds[kind] += 1


@pytest.mark.clause("DEC-1.4")
def test_each_event_of_a_writing_host_dispatcher_costs_one_savepoint_and_one_that_writes_nothing_none(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-1.4: a host's dispatcher that writes sends a savepoint ahead of its event's first
    statement and releases it ahead of the next event's (the COMMIT ends the last): five events,
    five savepoints, four releases, no rollback; one that writes nothing sends no savepoint."""
    _five(client, engine)
    service.scheduler.publisher = None
    log = StatementKinds()
    event.listen(service.scheduler.sessions.kw["bind"], "before_cursor_execute", log)
    try:
        service.scheduler.dispatcher = FakeHostDispatcher()
        assert service.scheduler.poll_once().dispatched == 5
        assert (log.kinds["SAVEPOINT"], log.kinds["RELEASE SAVEPOINT"], log.kinds["ROLLBACK TO"]) == (5, 4, 0)
        for i in range(5):
            post_event(client, user_id=f"quiet-{i}", trigger_at=T0 - timedelta(minutes=1))
        log.kinds.clear()

        def writes_nothing(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
            return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)

        service.scheduler.dispatcher = writes_nothing
        assert service.scheduler.poll_once().dispatched == 5
        assert log.kinds["SAVEPOINT"] == log.kinds["RELEASE SAVEPOINT"] == 0
    finally:
        event.remove(service.scheduler.sessions.kw["bind"], "before_cursor_execute", log)


@pytest.mark.clause("DEC-1.4")
@pytest.mark.clause("DEC-1.6")
def test_only_a_dispatcher_that_declares_itself_safe_to_repeat_is_replayed() -> None:
    """DEC-1.4, DEC-1.6: the built-in platform declares both capabilities (a ``BatchDispatcher``
    with ``safe_to_repeat``); a plain function, a host's class, a ``DeclaredDispatcher`` whose
    ``safe_to_repeat`` is merely truthy, and a class that carries the attribute and the method
    without subclassing declare neither."""

    class Truthy(DeclaredDispatcher):
        safe_to_repeat = "yes"  # type: ignore[assignment]  # not a bool: not a declaration

        def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
            return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)

    platform = NudgingPlatform.__new__(NudgingPlatform)
    assert capabilities_of(platform) == Capabilities(safe_to_repeat=True, batch=platform)
    assert capabilities_of(lambda session, event, now: DispatchResult(outcome=DispatchOutcome.DELIVERED)) == UNDECLARED
    assert capabilities_of(FakeHostDispatcher()) == UNDECLARED
    assert capabilities_of(Truthy()) == UNDECLARED
    assert capabilities_of(FakeUndeclaredDispatcher()) == UNDECLARED


class FakeUndeclaredDispatcher(FakeHostDispatcher):
    """A fake host dispatcher that carries ``safe_to_repeat = True`` and a ``decide_batch``
    without subclassing ``DeclaredDispatcher``: names on a plain callable, not declarations."""

    safe_to_repeat = True

    def __init__(self, **kwargs: frozenset[str]) -> None:
        super().__init__(**kwargs)
        self.batches = 0

    def decide_batch(self, session: Session, events: Any, now: datetime, stop: Any = None) -> None:
        self.batches += 1
        raise AssertionError("a plain callable's decide_batch is never called")


@pytest.mark.clause("DEC-1.4")
@pytest.mark.clause("DEC-1.6")
def test_a_plain_callable_is_called_once_per_event_whatever_names_it_carries(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-1.4, DEC-1.6: a dispatcher that is not a ``DeclaredDispatcher`` declares nothing,
    whatever attributes it has: with ``safe_to_repeat = True`` and a ``decide_batch`` on it, a
    batch whose second event fails calls every event exactly once (no replay), never asks it to
    decide the batch, and runs a savepoint per event."""
    _five(client, engine)
    host = FakeUndeclaredDispatcher(raise_for=frozenset({"user-1"}))
    service.scheduler.dispatcher = host
    batch = service.scheduler.claim()
    try:
        while service.scheduler.dispatch_next(batch) is not None:
            pass
        assert isinstance(batch.strategy, SavepointPerEvent) and type(batch.strategy) is SavepointPerEvent
        report = service.scheduler.finish(batch)
    finally:
        service.scheduler.abort(batch)
    assert (report.dispatched, report.failed, batch.replayed) == (4, 1, 0)
    assert host.calls == Counter({f"user-{i}": 1 for i in range(5)}) and host.batches == 0
