"""The two runners of the one run loop (``Scheduler.run_loop``): an asyncio task
(``Scheduler.run``) and a thread of its own (``Scheduler.run_blocking``).

The loop body is written once, as a coroutine over a ``Waits`` strategy: the strategy runs
a poll and waits for the earliest of stop, a wake-up and a deadline; nothing else differs.
``AsyncioWaits`` awaits for real. ``ThreadWaits`` blocks inside methods that never suspend,
so ``run_to_completion`` drives the very same coroutine with a single ``send``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
import anyio.to_thread

from scheduler.types import PollReport, SchedulerMode

# ThreadWaits in prompt mode checks its stop event at least this often (see ThreadWaits).
STOP_SLICE_SECONDS = 0.02

Poll = Callable[[Callable[[], bool]], PollReport | None]


class LoopState:
    """Whether the loop is between polls, announced on a condition so that nobody (a test,
    the simulation) has to sleep to see a change."""

    def __init__(self) -> None:
        self.waiting = False
        self._condition = threading.Condition()

    def changed(self, *, waiting: bool | None = None) -> None:
        with self._condition:
            if waiting is not None:
                self.waiting = waiting
            self._condition.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self._condition:
            return self._condition.wait_for(predicate, timeout)


class Waits(Protocol):
    """How one runner polls and waits: the only part of the loop that differs."""

    def stopped(self) -> bool: ...

    def interrupt(self) -> None:
        """End the current wait early (thread-safe; a wake-up or a recheck)."""

    def clear(self) -> None:
        """Forget interrupts that came before the wait about to be computed."""

    async def poll(self, poll: Poll) -> PollReport | None: ...

    async def yield_to_loop(self) -> None:
        """Between two polls with no wait between them: let whatever shares the loop run."""

    async def wait(self, seconds: float) -> bool:
        """Wait until stop, an interrupt, or ``seconds``; False when the time ran out."""


class AsyncioWaits:
    """Waits of an asyncio task: the poll runs in a worker thread, every wait is on ``stop``
    itself, so shutdown is immediate however long the wait."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        # A thread limiter of its own: requests that fill the default threadpool (their
        # limiter) cannot keep a poll waiting for a thread.
        self._limiter = anyio.CapacityLimiter(1)

    def stopped(self) -> bool:
        return self.stop.is_set()

    def interrupt(self) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    def clear(self) -> None:
        self._wake.clear()

    async def poll(self, poll: Poll) -> PollReport | None:
        return await anyio.to_thread.run_sync(poll, self.stop.is_set, limiter=self._limiter)

    async def yield_to_loop(self) -> None:
        await asyncio.sleep(0)  # the event loop's other tasks run between two batches

    async def wait(self, seconds: float) -> bool:
        waiters = {asyncio.ensure_future(self.stop.wait()), asyncio.ensure_future(self._wake.wait())}
        try:
            done, _ = await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return bool(done)


class ThreadWaits:
    """Waits of a thread of its own. Its methods block and never suspend.

    A thread cannot wait on two events at once, and ``stop`` belongs to the caller (it may
    be any ``threading.Event``). Where wake-ups matter (prompt mode) the wait is on the
    wake-up event, in slices of at most ``STOP_SLICE_SECONDS`` with ``stop`` checked in
    between; in literal mode, which has no wake-ups, it is one ``stop.wait`` per wait, so a
    stop ends it at once (and a stop event that counts its waits, the simulation's
    ``PollBudget``, sees exactly one per poll).
    """

    def __init__(self, stop: threading.Event, mode: Callable[[], SchedulerMode]) -> None:
        self.stop = stop
        self._mode = mode
        self._wake = threading.Event()

    def stopped(self) -> bool:
        return self.stop.is_set()

    def interrupt(self) -> None:
        self._wake.set()

    def clear(self) -> None:
        self._wake.clear()

    async def poll(self, poll: Poll) -> PollReport | None:
        return poll(self.stop.is_set)

    async def yield_to_loop(self) -> None:
        return None  # a thread of its own shares no event loop

    async def wait(self, seconds: float) -> bool:
        if self._mode() is SchedulerMode.LITERAL:
            return self.stop.wait(seconds)
        # One slice; the loop checks stop and computes the wait afresh after it.
        return self._wake.wait(min(seconds, STOP_SLICE_SECONDS))


def run_to_completion(coroutine: Coroutine[Any, Any, None]) -> None:
    """Drive a coroutine that never suspends (the run loop over ``ThreadWaits``) in this thread."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the run loop suspended in a thread of its own")
