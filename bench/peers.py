"""Peers: procrastinate and pgqueuer draining the same number of jobs.

Each runs with one of two handlers (``bench.peer_work``): ``noop`` (the queue's
mechanics alone, compared with ours in ``mechanics``) and ``work`` (the handler a user
writes for a reminder: deduplicate by a unique key, insert the notification and its
delivery row, in its own transaction; compared with our full path in ``fullpath``).

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

from bench import peer_work
from bench.drain import run_processes, summarise
from bench.env import Server, libpq_uri, progress

PEERS = ("procrastinate", "pgqueuer")


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here, or ``None`` when it is installed."""
    if importlib.util.find_spec(peer) is None:
        return f"{peer} is not installed (pip install -e '.[bench]')"
    return None


# -- procrastinate --------------------------------------------------------------------


def _procrastinate_app(conninfo: str, handler: str = "noop") -> tuple[Any, Any, dict[str, Any]]:
    """A procrastinate app with one task running ``handler``: (app, task, state).

    ``state["done"]`` counts jobs run; for ``work`` the worker puts its own connection in
    ``state["conn"]`` before it starts.
    """
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    state: dict[str, Any] = {"done": 0, "conn": None}

    async def bench_noop() -> None:
        state["done"] += 1

    async def bench_work(n: int) -> None:
        await state["conn"].store_notification(n)
        state["done"] += 1

    if handler == "work":
        task = app.task(name="bench_work", queue="bench")(bench_work)
    else:
        task = app.task(name="bench_noop", queue="bench")(bench_noop)
    return app, task, state


async def _procrastinate_prepare(conninfo: str, events: int, handler: str) -> None:
    app, task, _ = _procrastinate_app(conninfo, handler)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, events, 5_000):
            size = min(5_000, events - start)
            if handler == "work":
                await task.batch_defer_async(*({"n": start + i} for i in range(size)))
            else:
                await task.batch_defer_async(*({} for _ in range(size)))


def _procrastinate_worker(conninfo: str, batch: int, handler: str, barrier: Barrier, out: Any) -> None:
    async def work() -> None:
        app, _, state = _procrastinate_app(conninfo, handler)
        if handler == "work":
            state["conn"] = await peer_work.connect(conninfo)
        async with app.open_async():
            barrier.wait()
            started = time.time()
            await app.run_worker_async(queues=["bench"], concurrency=1, wait=False, listen_notify=False,
                                       fetch_job_polling_interval=0.01, install_signal_handlers=False,
                                       delete_jobs="never")
            out.put((started, time.time(), state["done"]))
        if state["conn"] is not None:
            await state["conn"].close()

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


async def _pgqueuer_prepare(conninfo: str, events: int, handler: str) -> None:
    from pgqueuer.queries import Queries

    conn, driver = await _pgqueuer_driver(conninfo)
    try:
        queries = Queries(driver)
        await queries.install()
        for start in range(0, events, 5_000):
            size = min(5_000, events - start)
            payloads = [str(start + i).encode() for i in range(size)] if handler == "work" else [None] * size
            await queries.enqueue([f"bench_{handler}"] * size, payloads, [0] * size)
    finally:
        await conn.close()


def _pgqueuer_worker(conninfo: str, batch: int, handler: str, barrier: Barrier, out: Any) -> None:
    async def work() -> None:
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        conn, driver = await _pgqueuer_driver(conninfo)
        counter = {"done": 0}
        manager = QueueManager(Queries(driver))

        handler_conn = await peer_work.connect(conninfo, peer_work.PGQUEUER_POOL) if handler == "work" else None

        async def bench_noop(job: Any) -> None:
            counter["done"] += 1

        async def bench_work(job: Any) -> None:
            assert handler_conn is not None
            await handler_conn.store_notification(int(job.payload))
            counter["done"] += 1

        manager.entrypoint(f"bench_{handler}")(bench_work if handler == "work" else bench_noop)

        barrier.wait()
        started = time.time()
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain,
                          dequeue_timeout=timedelta(seconds=0.05))
        out.put((started, time.time(), counter["done"]))
        if handler_conn is not None:
            await handler_conn.close()
        await conn.close()

    asyncio.run(work())


PREPARE = {"procrastinate": _procrastinate_prepare, "pgqueuer": _pgqueuer_prepare}
WORKER = {"procrastinate": _procrastinate_worker, "pgqueuer": _pgqueuer_worker}


def drain(server: Server, peer: str, *, events: int, replicas: int, batch: int, timeout: float = 600,
          handler: str = "noop") -> dict[str, Any]:
    """``events`` jobs drained by ``replicas`` worker processes of ``peer``, each running ``handler``.

    The ``work`` handler's tables are counted after the drain: exactly one key,
    notification and delivery per job, or the run is refused.
    """
    if handler not in peer_work.HANDLERS:
        raise ValueError(f"handler must be one of {peer_work.HANDLERS}, got {handler!r}")
    reason = missing(peer)
    if reason is not None:
        progress(f"drain {peer} ({handler}): skipped: {reason}")
        return {"kind": peer, "handler": handler, "replicas": replicas, "skipped": reason}
    written: dict[str, int] = {}
    with server.fresh_database(f"peer_{peer}_{handler}") as url:
        conninfo = libpq_uri(url)
        if handler == "work":
            asyncio.run(peer_work.create_schema(conninfo))
        asyncio.run(PREPARE[peer](conninfo, events, handler))
        results = run_processes(WORKER[peer], (conninfo, batch, handler), replicas, timeout)
        if handler == "work":
            written = peer_work.counts(conninfo)
    summary = summarise(results, events)
    summary.update(kind=peer, handler=handler, replicas=replicas, batch_size=batch if peer == "pgqueuer" else 1)
    if written:
        summary["written"] = written
        if set(written.values()) != {events}:
            raise RuntimeError(f"{peer} ({handler}) wrote {written}, expected {events} of each")
    if peer == "pgqueuer":
        summary["driver"] = pgqueuer_driver_name()
    if not summary["complete"]:
        raise RuntimeError(f"{peer} drained {summary['events']} of {events} jobs")
    progress(f"drain {peer} ({handler}): {events:,} jobs, {replicas} worker(s): "
             f"{summary['events_per_second']:.0f} jobs/s "
             f"({summary['seconds']:.2f}s)")
    return summary
