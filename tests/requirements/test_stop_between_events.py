"""DEC-7 — a stop is honoured between every two events, on every path of a batch.

In our words: a stop that arrives while an event is in hand lets that event finish, and no
further dispatcher call starts: not in the first pass, not in the replay that follows a
failure under the checkpoint, not in the per-event run that follows a failed set-based
write. What was done commits; the rest stays pending for the next poll. With a dispatcher
that takes seconds per event, this is the difference between a prompt exit and one past a
container's grace period.

The dispatcher here is a slow fake: from a chosen call on it waits, with a deadline, until
the test has set the stop and lets it finish; the poll runs in a thread joined with a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.service import SchedulerService
from scheduler.types import (
    BatchDispatcher,
    DeclaredDispatcher,
    DigitalTwinEvent,
    DispatchOutcome,
    DispatchResult,
    PollReport,
)
from tests.conftest import T0
from tests.helpers import DEADLINE_SECONDS, event_row, post_event

USERS = [f"user-{i}" for i in range(5)]


class SlowFakeDispatcher(DeclaredDispatcher):
    """A fake at the dispatcher edge: from its ``slow_from``-th call on, each call says it
    started and waits until the test releases it (a deadline turns a hang into a failure);
    it raises for the participants in ``fail_for``."""

    # declared safe to repeat, so that its batches replay (DEC-1.4)
    safe_to_repeat = True

    def __init__(self, *, slow_from: int, fail_for: frozenset[str] = frozenset()) -> None:
        self.slow_from, self.fail_for = slow_from, fail_for
        self.calls: list[str] = []
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.calls.append(event.user_id)
        if len(self.calls) >= self.slow_from:
            self.reached.set()
            if not self.release.wait(DEADLINE_SECONDS):
                raise AssertionError("the test never let the slow call finish")
        if event.user_id in self.fail_for:
            raise ValueError("evaluator blew up")
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


class SlowSetBasedDispatcher(SlowFakeDispatcher, BatchDispatcher):
    """The slow fake as a set-based dispatcher whose batch write fails (a time PostgreSQL
    cannot read), so that the batch falls back to calling it once per event."""

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Any = None) -> Any:
        class FailingWrite:
            results: ClassVar[list[DispatchResult]] = [
                DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED) for _ in events]

            def write_statement(self, outcomes: dict[str, list[Any]]) -> tuple[str, dict[str, Any]]:
                return "record_outcomes", {**outcomes, "times": ["not a time" for _ in outcomes["times"]]}

        return FailingWrite()


def stop_during_the_slow_call(service: SchedulerService, dispatcher: SlowFakeDispatcher) -> PollReport:
    """Poll in a thread; when the slow call has started, set the stop, then let it finish."""
    service.scheduler.dispatcher = dispatcher
    stop = threading.Event()
    done: list[PollReport | BaseException] = []

    def poll() -> None:
        try:
            done.append(service.scheduler.poll_once(stop.is_set))
        except BaseException as exc:  # noqa: BLE001  # handed to the test thread, which fails with it
            done.append(exc)

    thread = threading.Thread(target=poll, name="poll")
    thread.start()
    try:
        assert dispatcher.reached.wait(DEADLINE_SECONDS), "the slow call never started"
        stop.set()
    finally:
        dispatcher.release.set()
        thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive(), "the poll did not end after the stop"
    [result] = done
    if isinstance(result, BaseException):
        raise result
    return result


def five_due(client: TestClient) -> list[str]:
    return [post_event(client, user_id=u, trigger_at=T0 - timedelta(minutes=10 - i))["id"] for i, u in enumerate(USERS)]


@pytest.mark.clause("DEC-7.1")
def test_a_stop_during_the_first_pass_starts_no_further_dispatch(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-7.1: the stop arrives during the second event: it finishes, nothing else starts."""
    ids = five_due(client)
    dispatcher = SlowFakeDispatcher(slow_from=2)
    report = stop_during_the_slow_call(service, dispatcher)
    assert dispatcher.calls == ["user-0", "user-1"]
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched"]
    assert [event_row(engine, i)["status"] for i in ids] == [
        "dispatched", "dispatched", "pending", "pending", "pending"]


@pytest.mark.clause("DEC-7.1")
def test_a_stop_during_the_checkpoint_replay_starts_no_further_dispatch(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-7.1: user-2 fails under the checkpoint, the replay begins with user-0; the stop arrives
    during that call: it finishes, user-1 is not replayed and user-2 does not run again. The
    replayed event commits; the events rolled back with the checkpoint and those never reached
    stay pending, untouched (no last_error)."""
    ids = five_due(client)
    dispatcher = SlowFakeDispatcher(slow_from=4, fail_for=frozenset({"user-2"}))
    report = stop_during_the_slow_call(service, dispatcher)
    assert dispatcher.calls == ["user-0", "user-1", "user-2", "user-0"]
    assert [o.status for o in report.outcomes] == ["dispatched"]
    stored = [event_row(engine, i) for i in ids]
    assert [(r["status"], r["last_error"]) for r in stored] == [("dispatched", None)] + [("pending", None)] * 4
    assert service.scheduler.poll_once().claimed == 4  # the next poll takes them


@pytest.mark.clause("DEC-7.1")
def test_a_stop_during_the_set_based_fallback_starts_no_further_dispatch(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-7.1: the set-based write fails at the batch's end and the batch runs per event; the
    stop arrives during the second of those calls: it finishes, nothing else starts."""
    ids = five_due(client)
    dispatcher = SlowSetBasedDispatcher(slow_from=2)
    report = stop_during_the_slow_call(service, dispatcher)
    assert dispatcher.calls == ["user-0", "user-1"]
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched"]
    assert [event_row(engine, i)["status"] for i in ids] == [
        "dispatched", "dispatched", "pending", "pending", "pending"]
