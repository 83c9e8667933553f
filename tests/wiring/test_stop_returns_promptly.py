"""WIRE-4: the loop returns promptly once its stop event is set, by itself, never cancelled.

The interval is an hour, so a loop that sleeps through it instead of waiting on its stop
event cannot return within the deadline: the deadline only turns that hang into a failure.
Run directly (``Scheduler.run`` with an asyncio event, ``run_blocking`` with a thread's
event) and through the service's lifespan; stopped while waiting and while polling.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.core.loop import Scheduler
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, DispatchResult, SchedulerMode
from tests.helpers import DEADLINE_SECONDS, bounded, eventually, post_event, running, statuses

HOUR = 3600.0


async def _returns_by_itself(task: asyncio.Task[None]) -> None:
    done, _ = await asyncio.wait({task}, timeout=DEADLINE_SECONDS)
    assert task in done, f"the loop did not return within {DEADLINE_SECONDS:g}s of stop: it sleeps through its interval"
    assert not task.cancelled()
    assert task.exception() is None


MODES = pytest.mark.parametrize("mode", list(SchedulerMode), ids=[str(m) for m in SchedulerMode])


@pytest.mark.clause("WIRE-4")
@MODES
def test_run_returns_by_itself_when_stop_is_set_during_the_wait(service: SchedulerService, mode: SchedulerMode) -> None:
    """WIRE-4: stop set while the loop waits out a one-hour interval: run returns, uncancelled."""
    scheduler = service.scheduler
    scheduler.poll_seconds = HOUR
    scheduler.mode = mode

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(scheduler.run(stop))
        await eventually(lambda: scheduler.health.polls >= 1, "the first poll")
        await asyncio.sleep(0)  # let the loop reach its wait
        stop.set()
        await _returns_by_itself(task)

    asyncio.run(scenario())
    assert scheduler.health.polls == 1 and scheduler.health.running is False


@pytest.mark.clause("WIRE-4")
def test_run_stops_between_events_and_does_not_wait_an_interval_when_stopped_mid_poll(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """WIRE-4: stop set while the first of three events dispatches: that event completes, the
    batch commits with the other two still pending, and run returns without waiting."""
    for user in ("a", "b", "c"):
        post_event(client, user_id=user)
    scheduler = service.scheduler
    scheduler.poll_seconds = HOUR
    real = scheduler.dispatcher

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def stopping(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
            loop.call_soon_threadsafe(stop.set)
            stopped = threading.Event()
            loop.call_soon_threadsafe(stopped.set)
            assert stopped.wait(DEADLINE_SECONDS)  # the stop is set before this event returns
            return real(session, event, now)

        scheduler.dispatcher = stopping
        await _returns_by_itself(asyncio.create_task(scheduler.run(stop)))

    asyncio.run(scenario())
    assert sorted(statuses(engine).values()) == ["dispatched", "pending", "pending"]


@pytest.mark.clause("WIRE-4")
@MODES
def test_run_blocking_returns_when_its_thread_event_is_set(service: SchedulerService, mode: SchedulerMode) -> None:
    """WIRE-4: the same loop in a thread of its own returns once its threading.Event is set."""
    scheduler: Scheduler = service.scheduler
    scheduler.poll_seconds = HOUR
    scheduler.mode = mode
    polled = threading.Event()
    scheduler.poll_hooks.append(lambda _: polled.set())
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_blocking, args=(stop,), name="run-blocking", daemon=True)
    thread.start()
    assert polled.wait(DEADLINE_SECONDS), "no poll"
    stop.set()
    thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive(), "run_blocking slept through its interval"


@pytest.mark.clause("WIRE-4")
def test_the_service_lifespan_stops_its_loop_without_cancelling_it(
    service: SchedulerService, caplog: pytest.LogCaptureFixture
) -> None:
    """WIRE-4: leaving service.app's lifespan sets the stop event and the loop returns by itself."""
    service.run_scheduler = True
    service.scheduler.poll_seconds = HOUR

    def serve_and_stop() -> None:
        with running(service.app):
            asyncio.run(eventually(lambda: service.scheduler.health.polls >= 1, "the first poll"))

    with caplog.at_level(logging.WARNING, logger="scheduler.service.tasks"):
        bounded(serve_and_stop, DEADLINE_SECONDS, "the lifespan's shutdown")
    assert "cancelled" not in caplog.text
    assert service.scheduler.health.running is False and service.loop_alive is False
