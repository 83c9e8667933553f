"""Peers: procrastinate and pgqueuer draining the same number of no-op jobs.

Both are optional (``pip install -e '.[bench]'``) and imported only here, lazily: when
one is missing its row says so and the run goes on. Each runs in its own fresh database
with its own schema, ``R`` worker processes with one job at a time each (equal
concurrency with our ``R`` replicas), timed like ours from the barrier to the last
worker's exit on an empty queue.

- procrastinate: ``run_worker_async(concurrency=1, wait=False)``, which exits once no job
  is left; LISTEN/NOTIFY off and polling every 10 ms (our loop polls at 0 s); it fetches
  one job per round trip by design.
- pgqueuer: ``QueueManager.run(mode=drain, batch_size=B)``, one consumer per process,
  on asyncpg when installed (see ``_pgqueuer_driver``); it dequeues a batch in one
  statement and logs completions in batches.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from datetime import timedelta
from multiprocessing.synchronize import Barrier
from typing import Any

from bench.drain import run_processes, summarise
from bench.env import Server, libpq_uri, progress

PEERS = ("procrastinate", "pgqueuer")


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here, or ``None`` when it is installed."""
    if importlib.util.find_spec(peer) is None:
        return f"{peer} is not installed (pip install -e '.[bench]')"
    return None


# -- procrastinate --------------------------------------------------------------------


def _procrastinate_app(conninfo: str) -> tuple[Any, Any, dict[str, int]]:
    """A procrastinate app with one no-op task: (app, task, counter of jobs run)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    counter = {"done": 0}

    async def bench_noop() -> None:
        counter["done"] += 1

    task = app.task(name="bench_noop", queue="bench")(bench_noop)
    return app, task, counter


async def _procrastinate_prepare(conninfo: str, events: int) -> None:
    app, task, _ = _procrastinate_app(conninfo)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, events, 5_000):
            await task.batch_defer_async(*({} for _ in range(min(5_000, events - start))))


def _procrastinate_worker(conninfo: str, batch: int, barrier: Barrier, out: Any) -> None:
    async def work() -> None:
        app, _, counter = _procrastinate_app(conninfo)
        async with app.open_async():
            barrier.wait()
            started = time.time()
            await app.run_worker_async(queues=["bench"], concurrency=1, wait=False, listen_notify=False,
                                       fetch_job_polling_interval=0.01, install_signal_handlers=False,
                                       delete_jobs="never")
            out.put((started, time.time(), counter["done"]))

    asyncio.run(work())


# -- pgqueuer -------------------------------------------------------------------------


def pgqueuer_driver_name() -> str:
    """asyncpg when installed (pgqueuer's primary driver), else psycopg."""
    return "asyncpg" if importlib.util.find_spec("asyncpg") is not None else "psycopg"


async def _pgqueuer_driver(conninfo: str) -> tuple[Any, Any]:
    """A connection and pgqueuer driver for it.

    With asyncpg, pgqueuer drains thousands of jobs a second; its psycopg driver, in the
    version measured, waits out the dequeue timeout between batches, which would make the
    comparison unfair to it, so asyncpg is used when present and the row is labelled.
    """
    if pgqueuer_driver_name() == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from sqlalchemy import make_url

        url = make_url(conninfo)
        socket_dir = url.query.get("host")
        conn = await asyncpg.connect(
            host=socket_dir if isinstance(socket_dir, str) else (url.host or "localhost"),
            port=url.port or 5432, user=url.username or "postgres", password=url.password or None,
            database=url.database,
        )
        return conn, AsyncpgDriver(conn)
    import psycopg
    from pgqueuer.db import PsycopgDriver

    pconn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    return pconn, PsycopgDriver(pconn)


async def _pgqueuer_prepare(conninfo: str, events: int) -> None:
    from pgqueuer.queries import Queries

    conn, driver = await _pgqueuer_driver(conninfo)
    try:
        queries = Queries(driver)
        await queries.install()
        for start in range(0, events, 5_000):
            size = min(5_000, events - start)
            await queries.enqueue(["bench_noop"] * size, [None] * size, [0] * size)
    finally:
        await conn.close()


def _pgqueuer_worker(conninfo: str, batch: int, barrier: Barrier, out: Any) -> None:
    async def work() -> None:
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        conn, driver = await _pgqueuer_driver(conninfo)
        counter = {"done": 0}
        manager = QueueManager(Queries(driver))

        async def bench_noop(job: Any) -> None:
            counter["done"] += 1

        manager.entrypoint("bench_noop")(bench_noop)

        barrier.wait()
        started = time.time()
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain,
                          dequeue_timeout=timedelta(seconds=0.05))
        out.put((started, time.time(), counter["done"]))
        await conn.close()

    asyncio.run(work())


PREPARE = {"procrastinate": _procrastinate_prepare, "pgqueuer": _pgqueuer_prepare}
WORKER = {"procrastinate": _procrastinate_worker, "pgqueuer": _pgqueuer_worker}


def drain(server: Server, peer: str, *, events: int, replicas: int, batch: int, timeout: float = 600) -> dict[str, Any]:
    """``events`` no-op jobs drained by ``replicas`` worker processes of ``peer``."""
    reason = missing(peer)
    if reason is not None:
        progress(f"drain {peer}: skipped: {reason}")
        return {"kind": peer, "replicas": replicas, "skipped": reason}
    with server.fresh_database(f"peer_{peer}") as url:
        conninfo = libpq_uri(url)
        asyncio.run(PREPARE[peer](conninfo, events))
        results = run_processes(WORKER[peer], (conninfo, batch), replicas, timeout)
    summary = summarise(results, events)
    summary.update(kind=peer, replicas=replicas, batch_size=batch if peer == "pgqueuer" else 1)
    if peer == "pgqueuer":
        summary["driver"] = pgqueuer_driver_name()
    if not summary["complete"]:
        raise RuntimeError(f"{peer} drained {summary['events']} of {events} jobs")
    progress(f"drain {peer}: {events:,} jobs, {replicas} worker(s): {summary['events_per_second']:.0f} jobs/s "
             f"({summary['seconds']:.2f}s)")
    return summary
