"""Benchmark: how long a delivered notification takes to reach a browser on another replica.

Replica B is a real ``uvicorn`` server (no loop of its own) with one participant's SSE stream
open; "replica A" is this process's ``Scheduler`` on its own connection pool. For each of N
reminders, A polls (claim, dispatch, commit, then the stream numbering and its NOTIFY) and
the clock starts when the poll returns; it stops when the event arrives on B's stream. Run
with LISTEN (the default) and with ``SCHEDULER_LISTEN=false`` (the hub's 0.5 s timer, as
behind a transaction-pooling PgBouncer).
"""

from __future__ import annotations

import contextlib
import queue
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from bench.env import NOW, Server, bench_engine, progress
from scheduler.config import Settings
from scheduler.core import store
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.rules import load_catalogue
from scheduler.service import SchedulerService
from scheduler.web.http.auth import mint_token
from scheduler.web.inbox.hub import StreamPublisher

SECRET = "benchmark-secret-0123456789-abcdefghijklmnopqrstuvwxyz"


@contextlib.contextmanager
def _served(service: SchedulerService) -> Iterator[str]:
    app = Starlette(routes=[Mount("/", app=service.app)], lifespan=lambda app: service.lifespan(app))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _reader(base: str, headers: dict[str, str], arrivals: queue.Queue[tuple[float, str]],
            connected: threading.Event, stop: threading.Event) -> None:
    with httpx.Client(timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", f"{base}/me/notifications/stream", headers=headers) as response:
        for line in response.iter_lines():
            if line == ": connected":
                connected.set()
            elif line.startswith("data: "):
                arrivals.put((time.perf_counter(), line))
            if stop.is_set():
                return


def _latencies(url: str, events: int, listen: bool) -> list[float]:
    clock = ManualClock(NOW)
    engine_b, engine_a = bench_engine(url), bench_engine(url)
    settings = Settings(jwt_secret=SECRET, listen=listen)
    replica_b = SchedulerService(settings, engine=engine_b, clock=clock, run_scheduler=False)
    sessions = Database(engine_a)
    replica_a = Scheduler(sessions, NudgingPlatform(load_catalogue(None)), clock,
                          publisher=StreamPublisher(sessions))
    headers = {"Authorization": f"Bearer {mint_token(SECRET, scope=None, subject='bench-user')}"}
    arrivals: queue.Queue[tuple[float, str]] = queue.Queue()
    connected, stop = threading.Event(), threading.Event()
    latencies: list[float] = []
    try:
        with _served(replica_b) as base:
            reader = threading.Thread(target=_reader, args=(base, headers, arrivals, connected, stop), daemon=True)
            reader.start()
            if not connected.wait(30):
                raise RuntimeError("the stream did not connect")
            for i in range(events):
                clock.advance(timedelta(days=1))  # one a day: neither dedup nor the cap suppresses
                day = clock.now().date().isoformat()
                store.store_event(sessions, event_type="reminder", user_id="bench-user", community_id=None,
                                  external_key=None, trigger_at=clock.now(), now=clock.now(),
                                  facts={"facts_version": "1", "scenario": "commitment_reminder", "date": day,
                                         "commitment": f"bench {i}"})
                if replica_a.poll_once().dispatched != 1:
                    raise RuntimeError("the reminder was not dispatched")
                published = time.perf_counter()
                arrived, _ = arrivals.get(timeout=30)
                latencies.append((arrived - published) * 1000)
            stop.set()
    finally:
        engine_a.dispose()
        engine_b.dispose()
    return latencies


def run(server: Server, *, events: int) -> dict[str, Any]:
    """Publish-to-browser latency across replicas (ms), with LISTEN and on the timer."""
    results: dict[str, Any] = {"events": events, "modes": {}}
    for label, listen in (("listen", True), ("timer", False)):
        with server.fresh_database(f"inbox_{label}") as url:
            values = _latencies(url, events, listen)
        ordered = sorted(values)
        summary = {"median_ms": statistics.median(values), "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
                   "max_ms": ordered[-1]}
        results["modes"][label] = summary
        progress(f"inbox: {label}: median {summary['median_ms']:.1f} ms, p90 {summary['p90_ms']:.1f} ms, "
                 f"max {summary['max_ms']:.1f} ms from A's commit to B's stream ({events} notifications)")
    return results

