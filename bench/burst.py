"""Benchmark: lateness, the user's measure. N reminders fall due at one instant; how late is each?

A reminder is worth something only near its trigger time, so this benchmark measures what
a participant sees: ``dispatched_at - trigger_at``, per reminder, and the time from the
trigger instant until every reminder is out.

Each run is a fresh database. ``R`` replica processes start the production loop
(``Scheduler.run_blocking``, the real ``NudgingPlatform`` dispatcher, wall-clock
``SystemClock``) and wait; the parent then stores ``N`` reminders through the real store
path (``scheduler.core.store.store_event``, one transaction each, from a few threads, each with
its own ``external_key``), all due at one wall-clock instant ``T`` a few seconds ahead,
chosen so that storing ends before ``T``. From ``T`` on, the parent watches the pending
count until it reaches zero, then stops the loops; lateness comes from the rows themselves.

- ``literal`` mode waits a whole poll interval after every poll (REQ-0065). With the
  default 30 s, 10,000 reminders would take hours, so literal runs use a short interval
  (``--quick`` and the full run alike: 0.1 s) and their drain is checked against the
  README's formula ``polls t_poll + (polls - 1) p`` (plus up to one interval before the
  first poll after ``T``), with ``t_poll`` measured in the same run.
- ``prompt`` mode (``Scheduler(..., mode="prompt")``) polls again at once after a full
  batch and otherwise waits until the interval, the next pending ``trigger_at`` or a
  wake-up; it runs with the default 30 s interval, which it should not depend on. A build
  whose ``Scheduler`` has no ``mode`` skips it and says so.
- The peers drain the same burst as scheduled jobs, each twice: with a no-op handler (the
  queue alone) and with the handler a user writes for a reminder (``bench.peer_work``:
  deduplicate by a unique key, insert the notification and its delivery row, in its own
  transaction), the fair comparison with our full path: pgqueuer
  (``execute_after``, continuous mode, batch 20, asyncpg) and procrastinate
  (``schedule_at``, concurrency 1), ``R`` worker processes each, each polling every second
  (their defaults are 30 s and 5 s; a NOTIFY at enqueue time cannot wake them at ``T``).
  Their lateness is the handler's start minus ``T``.

Then one reminder alone: stored while the replicas wait (after their first poll), due two
seconds later, with the default 30 s interval, in each mode: prompt mode should send it
within a second of its trigger, literal mode up to an interval late.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from sqlalchemy import Engine, text

from bench import peer_work
from bench.drain import CTX, CountingPublisher, TimedScheduler
from bench.env import Server, bench_engine, bench_sql, libpq_uri, progress
from bench.peers import _pgqueuer_driver, missing, pgqueuer_driver_name
from scheduler.core.clock import SystemClock
from scheduler.core.loop import Scheduler
from scheduler.core.store import store_event
from scheduler.database.database import Database

MODES = ("literal", "prompt")
LITERAL_POLL_SECONDS = 0.1
DEFAULT_POLL_SECONDS = 30.0
PEER_POLL_SECONDS = 1.0
BATCH = 20
STORE_THREADS = 4


def available_modes() -> tuple[str, ...]:
    """The modes this build's ``Scheduler`` offers (prompt mode comes with its ``mode`` argument)."""
    return MODES if "mode" in inspect.signature(Scheduler.__init__).parameters else ("literal",)


def reminder_facts(day: str) -> dict[str, Any]:
    """Facts that make the shipped commitment-reminder rule send one notification."""
    return {"facts_version": "1.0", "scenario": "commitment_reminder", "date": day,
            "commitment": "run the dishwasher at noon"}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def lateness_summary(lateness: list[float]) -> dict[str, Any]:
    if not lateness:
        return {"count": 0}
    return {"count": len(lateness), "p50_s": percentile(lateness, 50), "p99_s": percentile(lateness, 99),
            "max_s": max(lateness), "min_s": min(lateness), "mean_s": statistics.fmean(lateness)}


# -- storing ------------------------------------------------------------------------------


def store_burst(engine: Engine, *, events: int, trigger_at: datetime, prefix: str) -> float:
    """Store ``events`` reminders due at ``trigger_at`` through ``store_event``; seconds taken."""
    sessions = Database(engine)
    clock = SystemClock()
    facts = reminder_facts(trigger_at.date().isoformat())

    def store(i: int) -> None:
        store_event(sessions, event_type="commitment_reminder", user_id=f"{prefix}{i}",
                    community_id="bench-community", external_key=f"{prefix}{i}-reminder",
                    trigger_at=trigger_at, facts=facts, now=clock.now())

    started = time.perf_counter()
    with ThreadPoolExecutor(STORE_THREADS) as pool:
        for _ in pool.map(store, range(events)):
            pass
    return time.perf_counter() - started


def calibrate_store_rate(server: Server, events: int = 300) -> float:
    """Reminders stored per second by ``store_burst`` on this machine now (sizes the lead time)."""
    with server.fresh_database("burst_calibrate") as url:
        engine = bench_engine(url, pool_size=STORE_THREADS)
        try:
            seconds = store_burst(engine, events=events, trigger_at=datetime.now(UTC) + timedelta(days=1),
                                  prefix="calibrate-")
        finally:
            engine.dispose()
    return events / seconds


def lead_time(events: int, store_rate: float) -> float:
    """Seconds from now to ``T``: storing at two thirds of the calibrated rate, plus two seconds."""
    return 2.0 + 1.5 * events / store_rate


# -- our replicas ---------------------------------------------------------------------------


def make_loop(engine: Engine, mode: str, poll_seconds: float) -> TimedScheduler:
    from scheduler.nudging.decision import NudgingPlatform
    from scheduler.nudging.rules import load_catalogue

    options: dict[str, Any] = {"mode": mode} if mode != "literal" else {}
    return TimedScheduler(Database(engine), NudgingPlatform(load_catalogue(None)), SystemClock(),
                          publisher=CountingPublisher(), batch_size=BATCH, poll_seconds=poll_seconds,
                          name=f"burst-{mode}", **options)


def prompt_listener(engine: Engine, scheduler: Scheduler) -> Any:
    """Prompt mode's LISTEN connection, wired as ``SchedulerService`` wires it: every store's
    NOTIFY announces its trigger time to the loop."""
    from scheduler.core.loop import DUE_CHANNEL
    from scheduler.database.listener import Listener, conninfo_of

    def on_due(payload: str) -> None:
        try:
            when: datetime | None = datetime.fromisoformat(payload) if payload else None
        except ValueError:
            when = None
        scheduler.announce(when)

    listener = Listener(conninfo_of(engine), name=scheduler.name, probe_engine=engine)
    listener.subscribe(DUE_CHANNEL, on_due)
    listener.start()
    return listener


def _replica(url: str, mode: str, poll_seconds: float, stop_all: MpEvent, barrier: Barrier, out: Any) -> None:
    """One replica process: the production loop until the parent says the burst is over."""
    # Two connections: prompt mode may keep one for LISTEN besides the batch's.
    engine = bench_engine(url, pool_size=2, max_overflow=2)
    scheduler = make_loop(engine, mode, poll_seconds)
    listener = prompt_listener(engine, scheduler) if mode == "prompt" else None
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    stop = threading.Event()
    loop = threading.Thread(target=scheduler.run_blocking, args=(stop,), name="loop")
    barrier.wait()
    loop.start()
    stop_all.wait()
    stop.set()
    loop.join()
    if listener is not None:
        listener.stop()
    out.put({"dispatched": scheduler.health.dispatched, "failed": scheduler.health.failed,
             "poll_time": scheduler.poll_time, "timed_polls": scheduler.timed_polls,
             "polls": scheduler.health.polls, "last_error": scheduler.health.last_error})
    engine.dispose()


def _wait_until_drained(engine: Engine, *, expected: int, deadline: float) -> float:
    """Watch the pending count (every 20 ms) until no due row is left; the time.time() it was seen."""
    count = bench_sql("count_pending")
    with engine.connect() as conn:
        while True:
            pending = conn.execute(count).scalar_one()
            conn.rollback()
            if pending == 0:
                return time.time()
            if time.time() > deadline:
                raise RuntimeError(f"{pending} of {expected} reminders still pending at the deadline")
            time.sleep(0.02)


def _start(target: Callable[..., None], args: tuple[Any, ...], replicas: int) -> tuple[list[Any], MpEvent, Any]:
    """Start ``replicas`` processes of ``target(*args, stop_all, barrier, out)``; return when all are ready."""
    stop_all = CTX.Event()
    barrier = CTX.Barrier(replicas + 1)
    out = CTX.Queue()
    processes = [CTX.Process(target=target, args=(*args, stop_all, barrier, out), daemon=True) for _ in range(replicas)]
    for process in processes:
        process.start()
    barrier.wait(timeout=120)
    return processes, stop_all, out


def _collect(processes: list[Any], stop_all: MpEvent, out: Any) -> list[Any]:
    stop_all.set()
    try:
        return [out.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()


def ours(server: Server, *, mode: str, replicas: int, events: int, store_rate: float) -> dict[str, Any]:
    """One burst through ``replicas`` production loops in ``mode``."""
    poll = LITERAL_POLL_SECONDS if mode == "literal" else DEFAULT_POLL_SECONDS
    with server.fresh_database(f"burst_{mode}") as url:
        engine = bench_engine(url, pool_size=STORE_THREADS + 1)
        try:
            processes, stop_all, out = _start(_replica, (url, mode, poll), replicas)
            try:
                trigger = datetime.now(UTC) + timedelta(seconds=lead_time(events, store_rate))
                stored_in = store_burst(engine, events=events, trigger_at=trigger, prefix="burst-")
                margin = (trigger - datetime.now(UTC)).total_seconds()
                drained_at = _wait_until_drained(engine, expected=events, deadline=trigger.timestamp() + 3600)
            except BaseException:
                stop_all.set()
                raise
            results = _collect(processes, stop_all, out)
            with engine.connect() as conn:
                lateness = [float(x) for x in conn.execute(text(
                    "SELECT EXTRACT(EPOCH FROM dispatched_at - trigger_at) FROM scheduler.scheduled_events "
                    "WHERE status = 'dispatched'")).scalars()]
                statuses = dict(conn.execute(bench_sql("count_by_status")).tuples().all())
                sent = conn.execute(
                    text("SELECT count(*) FROM scheduler.notifications WHERE status = 'sent'")).scalar_one()
        finally:
            engine.dispose()
    if statuses != {"dispatched": events} or sent != events:
        raise RuntimeError(f"burst {mode} x{replicas}: rows {statuses}, sent notifications {sent}, expected {events}")
    timed = sum(r["timed_polls"] for r in results)
    t_poll = sum(r["poll_time"] for r in results) / timed if timed else None
    result: dict[str, Any] = {
        "system": "ours", "mode": mode, "replicas": replicas, "events": events, "poll_seconds": poll,
        "batch_size": BATCH, "stored_seconds": stored_in, "store_margin_seconds": margin,
        "drain_seconds": drained_at - trigger.timestamp(), "lateness": lateness_summary(lateness),
        "polls": sum(r["polls"] for r in results), "t_poll_seconds": t_poll,
        "poll_errors": [r["last_error"] for r in results if r["last_error"]],
    }
    if mode == "literal" and t_poll is not None:
        polls_each = -(-events // (replicas * BATCH))
        low = polls_each * t_poll + (polls_each - 1) * poll
        result["formula"] = {"polls_per_replica": polls_each, "predicted_low_seconds": low,
                             "predicted_high_seconds": low + poll,  # the first poll after T: within one interval
                             "measured_over_predicted_mid": result["drain_seconds"] / (low + poll / 2)}
    progress(f"burst ours {mode}: {events:,} reminders, {replicas} replica(s): all out {result['drain_seconds']:.1f}s "
             f"after the trigger, lateness p50 {result['lateness']['p50_s']:.2f}s "
             f"p99 {result['lateness']['p99_s']:.2f}s "
             f"max {result['lateness']['max_s']:.2f}s (stored in {stored_in:.1f}s, {margin:.1f}s before it)")
    return result


def single(server: Server, *, mode: str, replicas: int = 2) -> dict[str, Any]:
    """One reminder stored while the loops wait (default interval), due two seconds later."""
    with server.fresh_database(f"single_{mode}") as url:
        engine = bench_engine(url, pool_size=2)
        try:
            processes, stop_all, out = _start(_replica, (url, mode, DEFAULT_POLL_SECONDS), replicas)
            try:
                time.sleep(1.0)  # let every loop finish its first poll and start waiting
                trigger = datetime.now(UTC) + timedelta(seconds=2)
                store_burst(engine, events=1, trigger_at=trigger, prefix="single-")
                _wait_until_drained(engine, expected=1, deadline=trigger.timestamp() + 3 * DEFAULT_POLL_SECONDS)
            except BaseException:
                stop_all.set()
                raise
            _collect(processes, stop_all, out)
            with engine.connect() as conn:
                late = conn.execute(text("SELECT EXTRACT(EPOCH FROM dispatched_at - trigger_at) "
                                         "FROM scheduler.scheduled_events WHERE status = 'dispatched'")).scalar_one()
        finally:
            engine.dispose()
    progress(f"single reminder, {mode}, {replicas} replicas, {DEFAULT_POLL_SECONDS:.0f}s interval: "
             f"dispatched {float(late):.2f}s after its trigger")
    return {"mode": mode, "replicas": replicas, "poll_seconds": DEFAULT_POLL_SECONDS, "lateness_seconds": float(late)}


# -- peers --------------------------------------------------------------------------------


def _pgqueuer_worker(conninfo: str, trigger_ts: float, handler: str, stop_all: MpEvent, barrier: Barrier,
                     out: Any) -> None:
    async def work() -> None:
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        conn, driver = await _pgqueuer_driver(conninfo)
        manager = QueueManager(Queries(driver))
        lateness: list[float] = []
        handler_conn = await peer_work.connect(conninfo, peer_work.PGQUEUER_POOL) if handler == "work" else None

        async def bench_noop(job: Any) -> None:
            lateness.append(time.time() - trigger_ts)

        async def bench_work(job: Any) -> None:
            # Lateness is when the work is done (ours: dispatched_at, in the batch's commit).
            assert handler_conn is not None
            await handler_conn.store_notification(int(job.payload))
            lateness.append(time.time() - trigger_ts)

        manager.entrypoint(f"bench_{handler}")(bench_work if handler == "work" else bench_noop)

        async def watch() -> None:
            while not stop_all.is_set():
                await asyncio.sleep(0.05)
            manager.shutdown.set()

        barrier.wait()
        watcher = asyncio.create_task(watch())
        await manager.run(batch_size=BATCH, mode=QueueExecutionMode.continuous,
                          dequeue_timeout=timedelta(seconds=PEER_POLL_SECONDS))
        await watcher
        out.put(lateness)
        if handler_conn is not None:
            await handler_conn.close()
        await conn.close()

    asyncio.run(work())


async def _pgqueuer_enqueue(conninfo: str, events: int, trigger: datetime, handler: str) -> None:
    from pgqueuer.queries import Queries

    conn, driver = await _pgqueuer_driver(conninfo)
    try:
        queries = Queries(driver)
        for start in range(0, events, 5_000):
            size = min(5_000, events - start)
            after = trigger - datetime.now(UTC)  # pgqueuer stores NOW() + execute_after
            payloads = [str(start + i).encode() for i in range(size)] if handler == "work" else [None] * size
            await queries.enqueue([f"bench_{handler}"] * size, payloads, [0] * size, [after] * size)
    finally:
        await conn.close()


def _procrastinate_app(conninfo: str, lateness: list[float], trigger_ts: float, handler: str = "noop",
                       state: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """The app and its one task; ``work`` runs on ``state["conn"]`` (the worker's own connection)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    conn_of = state if state is not None else {}

    async def bench_noop() -> None:
        lateness.append(time.time() - trigger_ts)

    async def bench_work(n: int) -> None:
        await conn_of["conn"].store_notification(n)
        lateness.append(time.time() - trigger_ts)

    if handler == "work":
        return app, app.task(name="bench_work", queue="bench")(bench_work)
    return app, app.task(name="bench_noop", queue="bench")(bench_noop)


def _procrastinate_worker(conninfo: str, trigger_ts: float, handler: str, stop_all: MpEvent, barrier: Barrier,
                          out: Any) -> None:
    async def work() -> None:
        lateness: list[float] = []
        state: dict[str, Any] = {"conn": await peer_work.connect(conninfo) if handler == "work" else None}
        app, _ = _procrastinate_app(conninfo, lateness, trigger_ts, handler, state)
        async with app.open_async():
            barrier.wait()
            worker = asyncio.create_task(app.run_worker_async(
                queues=["bench"], concurrency=1, wait=True, listen_notify=True,
                fetch_job_polling_interval=PEER_POLL_SECONDS, install_signal_handlers=False, delete_jobs="never"))
            while not stop_all.is_set() and not worker.done():
                await asyncio.sleep(0.05)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        out.put(lateness)
        if state["conn"] is not None:
            await state["conn"].close()

    asyncio.run(work())


async def _procrastinate_enqueue(conninfo: str, events: int, trigger: datetime, handler: str) -> None:
    app, task = _procrastinate_app(conninfo, [], 0.0, handler)
    async with app.open_async():
        for start in range(0, events, 5_000):
            size = min(5_000, events - start)
            args = ({"n": start + i} for i in range(size)) if handler == "work" else ({} for _ in range(size))
            await task.configure(schedule_at=trigger).batch_defer_async(*args)


async def _procrastinate_schema(conninfo: str) -> None:
    app, _ = _procrastinate_app(conninfo, [], 0.0)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


PEER_WORKERS = {"pgqueuer": _pgqueuer_worker, "procrastinate": _procrastinate_worker}


def peer(server: Server, name: str, *, replicas: int, events: int, handler: str = "noop") -> dict[str, Any]:
    """The same burst as ``name``'s scheduled jobs, drained by ``replicas`` worker processes running ``handler``."""
    label = name if handler == "noop" else f"{name} + work"
    reason = missing(name)
    if reason is not None:
        progress(f"burst {label}: skipped: {reason}")
        return {"system": label, "handler": handler, "replicas": replicas, "skipped": reason}
    written: dict[str, int] = {}
    with server.fresh_database(f"burst_{name}_{handler}") as url:
        conninfo = libpq_uri(url)
        if handler == "work":
            asyncio.run(peer_work.create_schema(conninfo))
        if name == "procrastinate":
            asyncio.run(_procrastinate_schema(conninfo))
        else:
            asyncio.run(_pgqueuer_install(conninfo))
        # Enqueueing 10,000 jobs takes about a second for either peer; five seconds of lead.
        trigger = datetime.now(UTC) + timedelta(seconds=5 + events / 2_000)
        processes, stop_all, out = _start(PEER_WORKERS[name], (conninfo, trigger.timestamp(), handler), replicas)
        try:
            started = time.perf_counter()
            if name == "procrastinate":
                asyncio.run(_procrastinate_enqueue(conninfo, events, trigger, handler))
            else:
                asyncio.run(_pgqueuer_enqueue(conninfo, events, trigger, handler))
            stored_in = time.perf_counter() - started
            margin = (trigger - datetime.now(UTC)).total_seconds()
            drained_at = _wait_for_peer(conninfo, name, events, deadline=trigger.timestamp() + 3600)
        except BaseException:
            stop_all.set()
            raise
        results = _collect(processes, stop_all, out)
        if handler == "work":
            written = peer_work.counts(conninfo)
    lateness = [x for r in results for x in r]
    if len(lateness) != events:
        raise RuntimeError(f"burst {label} x{replicas}: {len(lateness)} jobs ran, expected {events}")
    if written and set(written.values()) != {events}:
        raise RuntimeError(f"burst {label} x{replicas}: wrote {written}, expected {events} of each")
    result: dict[str, Any] = {"system": label, "handler": handler, "mode": f"poll {PEER_POLL_SECONDS:.0f}s",
              "replicas": replicas, "events": events,
              "stored_seconds": stored_in, "store_margin_seconds": margin,
              "drain_seconds": drained_at - trigger.timestamp(), "lateness": lateness_summary(lateness)}
    if name == "pgqueuer":
        result["driver"] = pgqueuer_driver_name()
    if written:
        result["written"] = written
    progress(f"burst {label}: {events:,} jobs, {replicas} worker(s): all done {result['drain_seconds']:.1f}s after "
             f"the trigger, lateness p50 {result['lateness']['p50_s']:.2f}s p99 {result['lateness']['p99_s']:.2f}s")
    return result


async def _pgqueuer_install(conninfo: str) -> None:
    from pgqueuer.queries import Queries

    conn, driver = await _pgqueuer_driver(conninfo)
    try:
        await Queries(driver).install()
    finally:
        await conn.close()


def _wait_for_peer(conninfo: str, name: str, events: int, *, deadline: float) -> float:
    """Watch the peer's own job table until every job has run; the time.time() it was seen."""
    import psycopg

    query = ("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')" if name == "procrastinate"
             else "SELECT count(*) FROM pgqueuer")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            row = conn.execute(query).fetchone()
            left = int(row[0]) if row else 0
            if left == 0:
                return time.time()
            if time.time() > deadline:
                raise RuntimeError(f"{name}: {left} of {events} jobs left at the deadline")
            time.sleep(0.02)


# -- the benchmark ------------------------------------------------------------------------


def run(server: Server, *, events: int, replicas: tuple[int, ...], single_modes: tuple[str, ...],
        peers: tuple[str, ...] = ("pgqueuer", "procrastinate")) -> dict[str, Any]:
    """Every mode this build offers and every peer, at each replica count; then one reminder alone."""
    modes = available_modes()
    store_rate = calibrate_store_rate(server)
    progress(f"burst: storing runs at about {store_rate:.0f} reminders/s here; modes available: {', '.join(modes)}")
    runs: list[dict[str, Any]] = []
    for n in replicas:
        for mode in modes:
            runs.append(ours(server, mode=mode, replicas=n, events=events, store_rate=store_rate))
        for name in peers:
            for handler in peer_work.HANDLERS:
                runs.append(peer(server, name, replicas=n, events=events, handler=handler))
    singles = [single(server, mode=mode) for mode in single_modes if mode in modes]
    skipped = [m for m in MODES if m not in modes]
    return {"events": events, "replicas": list(replicas), "modes": list(modes), "store_rate": store_rate,
            "runs": runs, "single": singles,
            "skipped_modes": {m: "this build's Scheduler has no mode argument" for m in skipped}}
