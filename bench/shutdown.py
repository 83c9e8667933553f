"""Benchmark 5: how long a stop takes to end the loop when the poll interval is an hour.

REQ-0065 asks that the loop wait on its stop event rather than sleep, so that shutdown
is immediate however long the interval. Three ways in: ``run_blocking`` in a thread (a
worker process), the asyncio ``run`` task, and the service's own lifespan
(``SchedulerService.start``/``stop``, what uvicorn calls). Each sample waits until the
first poll is done and the loop is idle in its hour-long wait, then times the stop.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from typing import Any

from bench.drain import make_scheduler, noop_dispatcher
from bench.env import Server, bench_engine, progress
from scheduler.config import Settings
from scheduler.core.clock import SystemClock
from scheduler.core.loop import Scheduler

HOUR = 3600.0


def _wait_for_first_poll(scheduler: Scheduler, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while scheduler.health.polls < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the loop did not complete a poll")
        time.sleep(0.002)
    time.sleep(0.05)  # let it settle into its wait


def _blocking(scheduler: Scheduler) -> float:
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_blocking, args=(stop,))
    scheduler.health.polls = 0
    thread.start()
    _wait_for_first_poll(scheduler)
    started = time.perf_counter()
    stop.set()
    thread.join(timeout=HOUR)
    return (time.perf_counter() - started) * 1000


async def _async(scheduler: Scheduler) -> float:
    stop = asyncio.Event()
    scheduler.health.polls = 0
    task = asyncio.create_task(scheduler.run(stop))
    while scheduler.health.polls < 1:
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    stop.set()
    await task
    return (time.perf_counter() - started) * 1000


async def _service(url: str) -> float:
    from scheduler.service import SchedulerService

    settings = Settings(jwt_secret="bench-shutdown-secret-0123456789abcdef", poll_seconds=HOUR)
    engine = bench_engine(url)
    try:
        service = SchedulerService(settings, engine=engine, clock=SystemClock(), dispatcher=noop_dispatcher,
                                   run_scheduler=True)
        await service.start()
        while service.scheduler.health.polls < 1:
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        await service.stop()
        elapsed = (time.perf_counter() - started) * 1000
        if service.loop_alive:
            raise RuntimeError("the loop is still alive after stop()")
        return elapsed
    finally:
        engine.dispose()


def _summary(samples: list[float]) -> dict[str, Any]:
    return {"samples": len(samples), "median_ms": statistics.median(samples), "max_ms": max(samples)}


def run(server: Server, *, repeats: int) -> dict[str, Any]:
    """Stop-to-exit times (ms) for each way of running the loop, with a one-hour interval."""
    # Each service built here warns that it runs in development mode: once is enough.
    logging.getLogger("scheduler.service.policy").setLevel(logging.ERROR)
    with server.fresh_database("shutdown") as url:
        engine = bench_engine(url)
        try:
            scheduler = make_scheduler(engine, "ours", 20, poll_seconds=HOUR)
            blocking = [_blocking(scheduler) for _ in range(repeats)]
            async_task = [asyncio.run(_async(scheduler)) for _ in range(repeats)]
            lifespan = [asyncio.run(_service(url)) for _ in range(repeats)]
        finally:
            engine.dispose()
    result: dict[str, Any] = {"poll_seconds": HOUR, "run_blocking": _summary(blocking),
              "async_run": _summary(async_task),
              "service_lifespan": _summary(lifespan)}
    for name in ("run_blocking", "async_run", "service_lifespan"):
        progress(f"shutdown {name}: median {result[name]['median_ms']:.2f} ms, max {result[name]['max_ms']:.2f} ms "
                 f"(poll interval {HOUR:.0f}s)")
    return result
