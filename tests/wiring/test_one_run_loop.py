"""WIRE-RUN-1: one run loop serves both runners: the asyncio task and a thread of its own.

The same prompt-mode scenario is played against ``Scheduler.run`` and
``Scheduler.run_blocking``; both go through the same polls and waits, wake on the same
announcements and rechecks, and return when stopped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.core.runner import run_to_completion
from scheduler.service import SchedulerService
from scheduler.types import SchedulerMode
from tests.conftest import T0
from tests.helpers import DEADLINE_SECONDS, statuses
from tests.reliability.support import store_due

HOUR = 3600.0


@contextmanager
def in_asyncio(scheduler: Scheduler) -> Iterator[threading.Thread]:
    """``Scheduler.run`` on an event loop in a thread; stopped (with a deadline) on exit."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        ready.set()
        await scheduler.run(stop[0])

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), name="asyncio-runner", daemon=True)
    thread.start()
    assert ready.wait(DEADLINE_SECONDS)
    try:
        yield thread
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(DEADLINE_SECONDS)
        if not thread.is_alive():
            loop.close()


@contextmanager
def in_thread(scheduler: Scheduler) -> Iterator[threading.Thread]:
    """``Scheduler.run_blocking`` in a thread of its own; stopped (with a deadline) on exit."""
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_blocking, args=(stop,), name="thread-runner", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(DEADLINE_SECONDS)


RUNNERS: dict[str, Callable[[Scheduler], AbstractContextManager[threading.Thread]]] = {
    "asyncio": in_asyncio, "thread": in_thread}


@pytest.mark.clause("WIRE-RUN-1")
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_both_runners_poll_and_wait_alike_in_prompt_mode(
    service: SchedulerService, engine: Engine, clock: ManualClock, runner: str
) -> None:
    """WIRE-RUN-1: a full batch, at once a short one, then a wait until the next trigger; an
    announcement polls at once; a recheck at the trigger polls it; stop returns: the same
    sequence, whichever runner."""
    scheduler = service.scheduler
    scheduler.mode, scheduler.batch_size, scheduler.poll_seconds = SchedulerMode.PROMPT, 2, HOUR
    due = store_due(engine, ["a", "b", "c"], T0)
    [later] = store_due(engine, ["d"], T0 + timedelta(minutes=5, seconds=1))
    claimed: list[int] = []
    scheduler.poll_hooks.append(lambda s: claimed.append(s.last_report.claimed if s.last_report else -1))
    with RUNNERS[runner](scheduler) as thread:
        assert scheduler.wait_for(lambda: scheduler.waiting and scheduler.waiting_until == T0 + timedelta(minutes=5),
                                  DEADLINE_SECONDS)
        assert claimed == [2, 1]
        scheduler.announce(None)  # another replica: something may have changed, look now
        assert scheduler.wait_for(lambda: len(claimed) == 3 and scheduler.waiting, DEADLINE_SECONDS)
        assert claimed == [2, 1, 0] and scheduler.waiting_until == T0 + timedelta(minutes=5)
        clock.advance(timedelta(minutes=5))
        scheduler.recheck()
        assert scheduler.wait_for(lambda: len(claimed) == 4 and scheduler.waiting, DEADLINE_SECONDS)
        assert claimed == [2, 1, 0, 1] and scheduler.waiting_until is None
    assert not thread.is_alive(), f"the {runner} runner did not return after stop"
    assert scheduler.health.running is False and scheduler.health.polls == 4
    assert statuses(engine) == {i: "dispatched" for i in [*due, later]}


@pytest.mark.clause("WIRE-RUN-1")
def test_the_thread_runner_refuses_a_loop_that_would_suspend() -> None:
    """WIRE-RUN-1: run_blocking drives the loop's coroutine in its own thread, which works only
    because ThreadWaits never suspends; a strategy that did is an error, not a silent stop."""

    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_to_completion(suspends())
