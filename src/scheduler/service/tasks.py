"""The service's tasks on the event loop: production's clock kept measured (DEC-10), the
polling loop and the delivery worker. Each is started once and stopped by its own event or
cancellation; the loop is never cancelled, only told to stop between events."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import anyio.to_thread
from anyio import CapacityLimiter
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from scheduler.core.clock import DatabaseClock
from scheduler.core.loop import Scheduler
from scheduler.observability.observer import replica_context
from scheduler.operations.delivery_worker import DeliveryWorker

logger = logging.getLogger(__name__)

# How often production's clock measures the database's time again (DEC-10), and how soon
# it tries again while it has never succeeded (the database unreachable at start).
CLOCK_SYNC_SECONDS = 5.0
CLOCK_RETRY_SECONDS = 1.0


class Tasks:
    """The clock's, the loop's and the delivery worker's tasks, each ``None`` while not running.
    Each runs in a context of its own whose log lines name ``replica_id`` (OBS-8)."""

    def __init__(self, replica_id: str | None = None) -> None:
        self.replica_id = replica_id
        self.clock: asyncio.Task[None] | None = None
        self.loop: asyncio.Task[None] | None = None
        self._loop_stop: asyncio.Event | None = None
        self.delivery: asyncio.Task[None] | None = None
        self._delivery_stop: asyncio.Event | None = None

    @property
    def loop_alive(self) -> bool:
        return self.loop is not None and not self.loop.done()

    async def start_clock(self, clock: DatabaseClock) -> None:
        """The first reading before the loop's first claim; then every few seconds."""
        if self.clock is None:
            await _sync_clock(clock, CapacityLimiter(1))
            self.clock = asyncio.create_task(_keep_clock_synced(clock), name="scheduler-clock",
                                             context=replica_context(self.replica_id))

    def start_loop(self, scheduler: Scheduler) -> None:
        self._loop_stop = asyncio.Event()
        context = replica_context(self.replica_id)
        self.loop = asyncio.create_task(scheduler.run(self._loop_stop), name="scheduler-loop", context=context)
        self.loop.add_done_callback(_report_exit, context=context)

    def start_delivery(self, worker: DeliveryWorker) -> None:
        self._delivery_stop = asyncio.Event()
        context = replica_context(self.replica_id)
        self.delivery = asyncio.create_task(worker.run(self._delivery_stop), name="scheduler-delivery",
                                            context=context)
        self.delivery.add_done_callback(_report_delivery_exit, context=context)

    async def stop_clock(self) -> None:
        if self.clock is not None:
            self.clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.clock
            self.clock = None

    async def stop_loop(self) -> bool:
        """Set the loop's stop event and wait for it to return; whether it was running."""
        if self.loop is None or self._loop_stop is None:
            return False
        self._loop_stop.set()
        with contextlib.suppress(Exception):
            await self.loop
        self.loop = None
        return True

    async def stop_delivery(self) -> None:
        """Sends in flight are cancelled: their leases run out and another claim sends them
        again, with the same keys."""
        if self.delivery is not None and self._delivery_stop is not None:
            self._delivery_stop.set()
            with contextlib.suppress(Exception):
                await self.delivery
            self.delivery = None


async def _sync_clock(clock: DatabaseClock, limiter: CapacityLimiter) -> bool:
    try:
        await anyio.to_thread.run_sync(clock.sync, limiter=limiter)
    except (DBAPIError, PoolTimeout) as exc:
        # Unreachable database: the loop's polls fail too and say why; keep trying.
        logger.debug("reading the database's clock failed: %s", type(exc).__name__)
        return False
    return True


async def _keep_clock_synced(clock: DatabaseClock) -> None:
    """Measure the database's time every CLOCK_SYNC_SECONDS, on a thread limiter of its own
    (requests filling the threadpool cannot hold it up); cancelled by ``stop_clock``."""
    limiter = CapacityLimiter(1)
    while True:
        await asyncio.sleep(CLOCK_SYNC_SECONDS if clock.synced else CLOCK_RETRY_SECONDS)
        await _sync_clock(clock, limiter)


def _report_delivery_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("delivery worker died: deliveries wait until the process restarts", exc_info=task.exception())


def _report_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        logger.warning("scheduler loop cancelled: reminders stop until the process restarts")
    elif task.exception() is not None:
        logger.error("scheduler loop died: reminders stop until the process restarts", exc_info=task.exception())
