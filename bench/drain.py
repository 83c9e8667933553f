"""Benchmarks 2 and 3: how fast replicas drain a backlog that falls due at once.

Each run is a fresh database holding ``N`` due pending rows (distinct users, facts that
trigger the shipped commitment reminder). ``R`` replicas start as separate processes,
connect, meet at a barrier, and then drain: each runs production's ``Scheduler.poll_once``
back to back (the loop with a poll interval of 0) until a claim comes back empty. The
rate is ``N / (last replica's exit - barrier release)``; afterwards every row must be
``dispatched`` (nothing lost, nothing left over).

Workers:
- ``ours``: the production loop with a no-op dispatcher (queue mechanics only);
- ``full``: the production loop with the real ``NudgingPlatform`` (rules, deduplication,
  preferences, cap, notification and delivery rows);
- ``raw``: the ceiling: psycopg alone, the same claim statement and the same per-row
  ``mark_dispatched`` in one transaction per batch, no Python dispatch, savepoints or
  participant locks;
- ``raw_same``: psycopg alone sending exactly the statements ours sends (claim,
  participant try-locks, the batch's checkpoint SAVEPOINT, one ``record_outcomes`` and
  its RELEASE): it splits ours' distance from the ceiling into the design's statements
  and Python's overhead. Ours sends fewer statements per batch than the ceiling's
  per-row pattern (one status update per batch instead of one per row), so it can pass it.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from multiprocessing.synchronize import Barrier
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from bench.env import (
    NOW,
    Server,
    bench_engine,
    bench_sql,
    libpq_uri,
    load_events,
    progress,
    psycopg_sql,
)
from scheduler.core.clock import ManualClock
from scheduler.core.loop import PollReport, Scheduler, claim_params
from scheduler.database.database import Database
from scheduler.database.queries import sql
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult, OutboundMessage

# A worker's result: (barrier release time, exit time, events it finished).
WorkerResult = tuple[float, float, int]
CTX = multiprocessing.get_context("spawn")


def noop_dispatcher(session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
    """Dispatches nothing: what is left is the queue's own cost."""
    return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


class CountingPublisher:
    """Counts notifications instead of pushing them (a fake at the true edge)."""

    def __init__(self) -> None:
        self.published = 0

    def publish(self, message: OutboundMessage) -> None:
        self.published += 1


class TimedScheduler(Scheduler):
    """The production loop, unchanged, with the time of its non-empty polls added up."""

    poll_time = 0.0
    timed_polls = 0

    def poll_once(self, should_stop: Callable[[], bool] | None = None) -> PollReport:
        started = time.perf_counter()
        report = super().poll_once(should_stop)
        if report.claimed:
            self.poll_time += time.perf_counter() - started
            self.timed_polls += 1
        return report


def make_scheduler(engine: Engine, kind: str, batch: int, poll_seconds: float = 0.0) -> TimedScheduler:
    """The production loop wired to ``engine`` with the dispatcher ``kind`` names."""
    from scheduler.nudging.decision import NudgingPlatform
    from scheduler.nudging.rules import load_catalogue

    dispatcher = NudgingPlatform(load_catalogue(None)) if kind == "full" else noop_dispatcher
    # The clock is frozen at NOW: every row is due, and the cap's "today" is one day.
    return TimedScheduler(Database(engine), dispatcher, ManualClock(NOW), publisher=CountingPublisher(),
                          batch_size=batch, poll_seconds=poll_seconds, name=f"bench-{kind}")


def _ours_worker(url: str, kind: str, batch: int, barrier: Barrier, out: Any) -> None:
    engine = bench_engine(url, pool_size=1, max_overflow=0)
    scheduler = make_scheduler(engine, kind, batch)
    with engine.connect() as conn:  # open the pooled connection before the clock starts
        conn.exec_driver_sql("SELECT 1")
    barrier.wait()
    started = time.time()
    done = 0
    while True:
        report = scheduler.poll_once()
        done += report.dispatched
        if report.claimed == 0:
            break
    out.put((started, time.time(), done))
    engine.dispose()


def _raw_worker(url: str, kind: str, batch: int, barrier: Barrier, out: Any) -> None:
    import psycopg

    claim = psycopg_sql(sql("claim_due_events"))
    mark = psycopg_sql(sql("mark_dispatched"))
    with psycopg.connect(libpq_uri(url)) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        barrier.wait()
        started = time.time()
        done = 0
        while True:
            with conn.transaction():
                rows = conn.execute(claim, claim_params(NOW, batch)).fetchall()
                for row in rows:
                    conn.execute(mark, {"id": row[0], "now": NOW})
            done += len(rows)
            if not rows:
                break
        out.put((started, time.time(), done))


def _raw_same_worker(url: str, kind: str, batch: int, barrier: Barrier, out: Any) -> None:
    """The ceiling for ours' exact statements: the claim (with the participant try-locks in
    it), the batch's checkpoint SAVEPOINT, one ``record_outcomes`` for the batch and its
    RELEASE, from psycopg with no SQLAlchemy and no dispatch."""
    import psycopg

    claim = psycopg_sql(sql("claim_due_events"))
    record = psycopg_sql(sql("record_outcomes"))
    with psycopg.connect(libpq_uri(url)) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        barrier.wait()
        started = time.time()
        done = 0
        while True:
            with conn.transaction():
                rows = conn.execute(claim, claim_params(NOW, batch)).fetchall()
                if rows:
                    conn.execute("SAVEPOINT bench_checkpoint")
                    conn.execute(record, {"ids": [row[0] for row in rows], "statuses": ["dispatched"] * len(rows),
                                          "errors": [None] * len(rows), "times": [NOW] * len(rows),
                                          "not_befores": [None] * len(rows)})
                    conn.execute("RELEASE SAVEPOINT bench_checkpoint")
            done += len(rows)
            if not rows:
                break
        out.put((started, time.time(), done))


WORKERS: dict[str, Callable[[str, str, int, Barrier, Any], None]] = {
    "ours": _ours_worker,
    "full": _ours_worker,
    "raw": _raw_worker,
    "raw_same": _raw_same_worker,
}


def run_processes(target: Callable[..., None], args: tuple[Any, ...], replicas: int,
                  timeout: float) -> list[WorkerResult]:
    """Start ``replicas`` processes of ``target(*args, barrier, queue)``; collect their results."""
    barrier = CTX.Barrier(replicas)
    out = CTX.Queue()
    processes = [CTX.Process(target=target, args=(*args, barrier, out), daemon=True) for _ in range(replicas)]
    for process in processes:
        process.start()
    results: list[WorkerResult] = []
    deadline = time.monotonic() + timeout
    try:
        while len(results) < replicas:
            try:
                results.append(out.get(timeout=0.5))
            except queue.Empty:
                # A worker that died (an exception, a peer's missing schema) never reports:
                # say so at once instead of waiting out the timeout.
                dead = [p.exitcode for p in processes if p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"a worker process failed (exit codes {dead})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the workers did not finish within {timeout:.0f}s") from None
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
    if any(p.exitcode not in (0, None) for p in processes):
        raise RuntimeError(f"a worker exited with {[p.exitcode for p in processes]}")
    return results


def summarise(results: list[WorkerResult], expected: int) -> dict[str, Any]:
    started = min(r[0] for r in results)
    ended = max(r[1] for r in results)
    done = sum(r[2] for r in results)
    seconds = ended - started
    return {"events": done, "seconds": seconds, "events_per_second": done / seconds if seconds else None,
            "complete": done == expected}


def drain(server: Server, kind: str, *, events: int, replicas: int, batch: int, timeout: float = 600) -> dict[str, Any]:
    """One drain of ``events`` rows by ``replicas`` processes of worker ``kind``."""
    with server.fresh_database(f"drain_{kind}") as url:
        engine = bench_engine(url)
        try:
            load_events(engine, pending=events)
            results = run_processes(WORKERS[kind], (url, kind, batch), replicas, timeout)
            with engine.connect() as conn:
                statuses = dict(conn.execute(bench_sql("count_by_status")).tuples().all())
                notifications = (
                    dict(conn.execute(bench_sql("count_notifications")).tuples().all()) if kind == "full" else None
                )
        finally:
            engine.dispose()
    summary = summarise(results, events)
    summary.update(kind=kind, replicas=replicas, batch_size=batch, statuses=statuses)
    if notifications is not None:
        summary["notifications"] = notifications
    if statuses != {"dispatched": events}:
        raise RuntimeError(f"{kind} drain left {statuses}, expected {events} dispatched")
    progress(f"drain {kind}: {events:,} events, {replicas} replica(s), batch {batch}: "
             f"{summary['events_per_second']:.0f} events/s ({summary['seconds']:.2f}s)")
    return summary


def _loop_worker(url: str, batch: int, poll_seconds: float, stop_all: Any, barrier: Barrier, out: Any) -> None:
    """The production ``run_blocking`` loop, stopped by the parent once the queue is empty."""
    engine = bench_engine(url, pool_size=1, max_overflow=0)
    scheduler = make_scheduler(engine, "ours", batch, poll_seconds)
    stop = threading.Event()
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    barrier.wait()
    started = time.time()
    loop = threading.Thread(target=scheduler.run_blocking, args=(stop,))
    loop.start()
    stop_all.wait()
    stop.set()
    loop.join()
    out.put((started, time.time(), scheduler.health.dispatched, scheduler.poll_time, scheduler.timed_polls))
    engine.dispose()


def formula_check(server: Server, *, events: int, replicas: int, batch: int, poll_seconds: float,
                  poll_cost_seconds: float) -> dict[str, Any]:
    """Drain with a real poll interval and compare with ``P t_poll + (P - 1) p``, ``P = ceil(N / (R b))``.

    ``poll_cost_seconds`` (t_poll) is one full poll's cost, taken from the interval-0 drain
    of the same run. The loop waits a whole interval after every poll, full or not.
    """
    stop_all = CTX.Event()
    with server.fresh_database("formula") as url:
        engine = bench_engine(url)
        try:
            load_events(engine, pending=events)
            barrier = CTX.Barrier(replicas + 1)
            out = CTX.Queue()
            processes = [CTX.Process(target=_loop_worker, args=(url, batch, poll_seconds, stop_all, barrier, out),
                                     daemon=True) for _ in range(replicas)]
            for process in processes:
                process.start()
            barrier.wait()
            started = time.time()
            count = bench_sql("count_pending")
            with engine.connect() as conn:
                while conn.execute(count).scalar_one() > 0:
                    conn.rollback()
                    time.sleep(0.005)
                    if time.time() - started > 600:
                        raise RuntimeError("the drain did not finish in 600 s")
            ended = time.time()
            stop_all.set()
            results = [out.get(timeout=60) for _ in processes]
            for process in processes:
                process.join(timeout=10)
        finally:
            engine.dispose()
    polls_each = -(-events // (replicas * batch))
    predicted = polls_each * poll_cost_seconds + (polls_each - 1) * poll_seconds
    run_cost = sum(r[3] for r in results) / max(1, sum(r[4] for r in results))
    predicted_with_run_cost = polls_each * run_cost + (polls_each - 1) * poll_seconds
    measured = ended - started
    result = {
        "events": events, "replicas": replicas, "batch_size": batch, "poll_seconds": poll_seconds,
        "polls_per_replica": polls_each, "poll_cost_seconds": poll_cost_seconds, "predicted_seconds": predicted,
        "run_poll_cost_seconds": run_cost, "predicted_with_run_cost_seconds": predicted_with_run_cost,
        "measured_seconds": measured, "measured_over_predicted": measured / predicted,
        "measured_over_predicted_with_run_cost": measured / predicted_with_run_cost,
        "dispatched": sum(r[2] for r in results),
    }
    if result["dispatched"] != events:
        raise RuntimeError(f"formula drain dispatched {result['dispatched']} of {events}")
    progress(f"drain formula: {events} events, {replicas} replica(s), p={poll_seconds}s: predicted "
             f"{predicted:.2f}s ({predicted_with_run_cost:.2f}s with this run's t_poll), measured {measured:.2f}s")
    return result
