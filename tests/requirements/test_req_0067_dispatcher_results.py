"""REQ-0067 — a dispatcher that breaks its contract fails one event, never the poll.

In our words: whatever a host's dispatcher returns is checked inside the per-event isolation.
A value that is not a ``DispatchResult`` (``None``, the coroutine an ``async def`` returns)
fails that one event with the reason in ``last_error``, and the batch goes on, on every path:
the first pass under the checkpoint, the replay after a failure, a batch decided set-based.
A live event through such a dispatcher is a 500 whose log line says why. An ``async def``
dispatcher (or an object whose ``__call__`` is one) is refused when the service or the
scheduler is built, with a sentence: dispatchers run synchronously on a sync session.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.types import (
    AsyncDispatcherRefused,
    BatchDispatcher,
    DeclaredDispatcher,
    DigitalTwinEvent,
    DispatchOutcome,
    DispatchResult,
)
from tests.conftest import INGEST, T0
from tests.helpers import event_body, event_row, post_event

NONE_ERROR = "NotADispatchResult: dispatcher returned None; expected a DispatchResult"


def batch_of_five(client: TestClient) -> list[dict[str, Any]]:
    return [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=10 - i)) for i in range(5)]


class ReturnsNoneFor(DeclaredDispatcher):
    """A fake host dispatcher that forgets its ``return`` for chosen participants (from their
    ``after``-th call on) and raises for others; every other event goes through the real one."""

    # declared safe to repeat, so that its batches replay (DEC-1.4)
    safe_to_repeat = True

    def __init__(self, real: Any, none_for: set[str], *, after: int = 0,
                 raise_for: frozenset[str] = frozenset()) -> None:
        self.real, self.none_for, self.after, self.raise_for = real, none_for, after, raise_for
        self.calls: list[str] = []

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.calls.append(event.user_id)
        if event.user_id in self.raise_for:
            raise ValueError("evaluator blew up")
        if event.user_id in self.none_for and self.calls.count(event.user_id) > self.after:
            return None  # type: ignore[return-value]
        result: DispatchResult = self.real(session, event, now)
        return result


@pytest.mark.clause("REQ-0067.8")
def test_a_dispatcher_that_returns_none_fails_that_event_with_the_reason_and_the_batch_goes_on(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.8: the first pass: the third event's dispatcher returns None; it alone fails with
    the reason in last_error, the four others dispatch, and the next poll claims nothing."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = ReturnsNoneFor(service.dispatcher, {"user-2"})
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "failed", "dispatched", "dispatched"]
    failed = event_row(engine, posted[2]["id"])
    assert (failed["status"], failed["dispatched_at"], failed["last_error"]) == ("failed", None, NONE_ERROR)
    assert service.scheduler.poll_once().claimed == 0  # nothing left pending for ever


@pytest.mark.clause("REQ-0067.8")
def test_a_dispatcher_that_returns_none_on_a_replay_fails_that_event_alone(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.8: the replay: user-0 returns a result first, then None when replayed after
    user-2 raised; each fails alone with its own reason, the others dispatch."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = ReturnsNoneFor(service.dispatcher, {"user-0"}, after=1,
                                                  raise_for=frozenset({"user-2"}))
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["failed", "dispatched", "failed", "dispatched", "dispatched"]
    assert event_row(engine, posted[0]["id"])["last_error"] == NONE_ERROR
    assert event_row(engine, posted[2]["id"])["last_error"] == "ValueError: evaluator blew up"


class CoroutineDispatcher:
    """A fake host dispatcher that hands back a coroutine for one participant, as an ``async
    def`` would (it slipped past construction: its ``__call__`` is a plain def)."""

    def __init__(self, real: Any, victim: str) -> None:
        self.real, self.victim = real, victim

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if event.user_id == self.victim:
            async def later() -> DispatchResult:
                return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)
            return later()  # type: ignore[return-value]
        result: DispatchResult = self.real(session, event, now)
        return result


@pytest.mark.clause("REQ-0067.8")
def test_a_dispatcher_that_returns_a_coroutine_fails_that_event_and_says_so(
    client: TestClient, service: SchedulerService, engine: Engine, recwarn: pytest.WarningsRecorder
) -> None:
    """REQ-0067.8: a coroutine is not a result: the event fails naming it, the batch goes on,
    and the coroutine is closed (no "never awaited" warning)."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = CoroutineDispatcher(service.dispatcher, "user-3")
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "dispatched", "failed", "dispatched"]
    error = event_row(engine, posted[3]["id"])["last_error"]
    assert error.startswith("NotADispatchResult: dispatcher returned a coroutine") and "async def" in error
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


class SetBasedReturningNone(BatchDispatcher):
    """A fake set-based dispatcher whose batch decision holds None for one event."""

    def __init__(self, victim: str) -> None:
        self.victim = victim

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Any = None) -> Any:
        victim = self.victim

        class Decisions:
            results: ClassVar[list[Any]] = [None if e.user_id == victim
                                            else DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)
                       for e in events]

            def write_statement(self, outcomes: dict[str, list[Any]]) -> tuple[str, dict[str, Any]]:
                return "record_outcomes", outcomes

        return Decisions()


@pytest.mark.clause("REQ-0067.8")
def test_a_set_based_decision_that_is_not_a_dispatch_result_fails_that_event_alone(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.8: the set-based path: the batch decision's None for user-1 fails user-1 with
    the reason; the others are dispatched by the same set-based write."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = SetBasedReturningNone("user-1")
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched", "failed", "dispatched", "dispatched", "dispatched"]
    assert event_row(engine, posted[1]["id"])["last_error"] == NONE_ERROR
    assert [event_row(engine, p["id"])["status"] for p in posted] == [
        "dispatched", "failed", "dispatched", "dispatched", "dispatched"]


@pytest.mark.clause("REQ-0067.8")
def test_a_live_event_through_a_dispatcher_that_returns_none_is_a_500_whose_log_says_why(
    settings: Settings, engine: Engine, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """REQ-0067.8: the live path has no row to record it on: a 500, and the log line names the cause."""
    service = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False,
                               dispatcher=lambda session, event, now: None)  # type: ignore[arg-type]
    with TestClient(service.app, raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
        live = {k: v for k, v in event_body().items() if k != "trigger_at"}
        response = client.post("/admin/ingest-event", headers=INGEST, json=live)
    assert response.status_code == 500
    assert any("dispatcher returned None; expected a DispatchResult" in r.getMessage() for r in caplog.records)


async def async_dispatcher(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
    return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


class AsyncCallable:
    async def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


class AsyncDecider(BatchDispatcher):
    """A batch dispatcher whose declared batch decision is an ``async def``."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)

    async def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent],  # type: ignore[override]
                           now: datetime, stop: Any = None) -> None:
        return None


@pytest.mark.clause("REQ-0067.9")
@pytest.mark.parametrize("dispatcher", [async_dispatcher, AsyncCallable(), AsyncDecider()],
                         ids=["async-def", "async-call", "async-decide-batch"])
def test_an_async_dispatcher_is_refused_when_the_service_or_scheduler_is_built(
    settings: Settings, engine: Engine, clock: ManualClock, dispatcher: Any
) -> None:
    """REQ-0067.9: SchedulerService, Scheduler and a later assignment all refuse it, saying why."""
    with pytest.raises(AsyncDispatcherRefused, match="called synchronously"):
        SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False, dispatcher=dispatcher)
    with pytest.raises(AsyncDispatcherRefused, match="async def"):
        Scheduler(Database(engine), dispatcher, clock, publisher=RecordingPublisher())
    service = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    with pytest.raises(AsyncDispatcherRefused):
        service.scheduler.dispatcher = dispatcher
