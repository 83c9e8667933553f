"""Benchmark: trigger to delivered. N reminders fall due at one instant, each delivered by
webhook to a local receiver that answers after 100 ms; how long until each arrives?

The receiver is a process of its own (``bench.provider``: it keeps connections alive as a
provider does, answers 204 100 ms after each POST and records when it answered each
``webhook-id`` first; it spends as little CPU as it can, since it stands for a provider on
another machine and runs on the measured one). The reminders are stored through the real
store path (``bench.burst.store_burst``), all due at one wall-clock instant ``T`` a few
seconds ahead; a reminder's latency is the receiver's first 2xx for it minus ``T``. Side by side, in one run:

- **outbox**: two real ``scheduler serve`` replicas (prompt mode) with the webhook channel
  (``SCHEDULER_WEBHOOK_URL``, signed), each running the delivery worker at
  ``--concurrency`` sends at once (``SCHEDULER_DELIVERY_CONCURRENCY``, default 256) and its
  loop at ``--batch-size`` (``SCHEDULER_BATCH_SIZE``, default 100; the service's is 20);
- **publisher**: the in-process path the outbox replaces: two replica processes whose loop
  publishes each notification after its batch commits, one blocking POST at a time on the
  loop's thread (a ``Publisher`` that calls the receiver). At 100 ms a push that is about
  ten a second per replica, so it runs ``--publisher-events`` reminders (default 400) and the
  figures for N are extrapolated from its measured rate (p50 ~ N/2 / rate, p99 ~ 0.99 N / rate);
- **procrastinate** and **pgqueuer**: the same N as jobs scheduled at ``T``, two worker
  processes each at the same concurrency (procrastinate's ``concurrency``, pgqueuer's
  ``max_concurrent_tasks`` and batch), each job making the same HTTP call (the production
  ``WebhookSender`` on the production client, ``DeliveryHttp``, signed, to a receiver of the
  same kind). They poll every second (a NOTIFY at enqueue time cannot wake them at ``T``), as
  in ``bench burst``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import httpx

from bench.burst import _collect, _start, calibrate_store_rate, lead_time, percentile, store_burst
from bench.drain import CTX
from bench.env import Server, bench_engine, libpq_uri, progress
from bench.peers import _pgqueuer_driver, missing
from scheduler.core.clock import SystemClock
from scheduler.delivery.http import DeliveryHttp
from scheduler.delivery.signing import format_secret
from scheduler.delivery.webhook import WebhookSender
from scheduler.types import OutboundDelivery

ROOT = Path(__file__).resolve().parent.parent
SECRET = bytes(range(32))
LATENCY_MS = 100
CONCURRENCY = 256
BATCH_SIZE = 100  # the outbox replicas' SCHEDULER_BATCH_SIZE (the service's default is 20)
PUBLISHER_EVENTS = 400
PEER_POLL_SECONDS = 1.0
TARGET_P99_SECONDS = 5.0


# -- the receiver -----------------------------------------------------------------------------


def _receiver(latency: float, ports: Any, stop: MpEvent) -> None:
    """The receiver process: ``bench.provider``'s server, answering every POST 204 after
    ``latency`` seconds, until ``stop``."""
    from bench.provider import Record, serve

    async def run() -> None:
        server = await serve(Record(), latency)
        async with server:
            ports.put(server.sockets[0].getsockname()[1])
            while not stop.is_set():
                await asyncio.sleep(0.1)

    asyncio.run(run())


class Receiver:
    """The receiver process while entered; ``stats()`` reads what it recorded."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self._stop = CTX.Event()
        ports = CTX.Queue()
        self._process = CTX.Process(target=_receiver, args=(latency, ports, self._stop), daemon=True)
        self._process.start()
        self.port = int(ports.get(timeout=60))
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        # one client for the run: a client made per call builds a TLS context each time (some
        # 25 ms of CPU, four times a second, taken from the system being measured)
        self._client = httpx.Client(timeout=30)

    def stats(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._client.get(f"http://127.0.0.1:{self.port}/stats").json()
        return answer

    def seen(self, prefix: str) -> int:
        """How many keys starting with ``prefix`` the receiver answered."""
        answer = self._client.get(f"http://127.0.0.1:{self.port}/count", params={"prefix": prefix}).json()
        return int(answer["seen"])

    def close(self) -> None:
        self._client.close()
        self._stop.set()
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()


def _wait_for(receiver: Receiver, events: int, *, prefix: str, deadline: float, label: str,
              processes: list[Any] | None = None) -> dict[str, float]:
    """Poll the receiver until ``events`` keys starting with ``prefix`` arrived; progress every
    5 s; a worker process that died ends the wait at once."""
    shown = 0.0
    while True:
        dead = [p.exitcode for p in processes or [] if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"{label}: a worker process exited with {dead}")
        seen = receiver.seen(prefix)
        if seen >= events:
            return {k: v for k, v in receiver.stats()["first"].items() if k.startswith(prefix)}
        now = time.time()
        if now > deadline:
            raise RuntimeError(f"{label}: {seen} of {events} delivered at the deadline")
        if now - shown >= 5:
            progress(f"delivery {label}: {seen:,} of {events:,} delivered")
            shown = now
        time.sleep(0.25)


def _summary(label: str, first: dict[str, float], trigger: float, events: int) -> dict[str, Any]:
    latency = [t - trigger for t in first.values()]
    result = {"system": label, "events": events, "delivered": len(latency),
              "p50_s": percentile(latency, 50), "p99_s": percentile(latency, 99), "max_s": max(latency),
              "mean_s": statistics.fmean(latency), "last_s": max(latency)}
    progress(f"delivery {label}: {events:,} delivered; trigger to delivered p50 {result['p50_s']:.2f}s "
             f"p99 {result['p99_s']:.2f}s max {result['max_s']:.2f}s")
    return result


# -- ours: the outbox, on real `scheduler serve` replicas ------------------------------------


def _serve(url: str, index: int, receiver: Receiver, concurrency: int, batch_size: int,
           workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env.update({
        "DATABASE_URL": libpq_uri(url), "SCHEDULER_JWT_SECRET": "bench-" + "x" * 40,
        "SCHEDULER_DATA_DIR": str(workdir / f"replica-{index}"), "SCHEDULER_MODE": "prompt",
        "SCHEDULER_WEBHOOK_URL": receiver.url, "SCHEDULER_WEBHOOK_SECRET": format_secret(SECRET),
        "SCHEDULER_DELIVERY_CONCURRENCY": str(concurrency), "SCHEDULER_DELIVERY_TIMEOUT_SECONDS": "10",
        "SCHEDULER_BATCH_SIZE": str(batch_size),
        "SCHEDULER_DELIVERY_BACKOFF_SECONDS": "1", "SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS": "5",
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""),
    })
    log = (workdir / f"replica-{index}.log").open("ab")
    process = subprocess.Popen([sys.executable, "-m", "scheduler", "serve", "--host", "127.0.0.1", "--port",
                                str(port), "--log-level", "warning"], env=env, cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return process, port


def _healthy(port: int, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"a replica exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("a replica did not answer /health")


def outbox(server: Server, receiver: Receiver, *, events: int, replicas: int, concurrency: int,
           store_rate: float, workdir: Path, batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """N reminders through ``replicas`` serve processes with the webhook outbox."""
    with server.fresh_database("delivery_outbox") as url:
        processes = [_serve(url, i, receiver, concurrency, batch_size, workdir) for i in range(replicas)]
        try:
            for process, port in processes:
                _healthy(port, process)
            engine = bench_engine(url, pool_size=8)
            trigger = datetime.now(UTC) + timedelta(seconds=lead_time(events, store_rate))
            stored = store_burst(engine, events=events, trigger_at=trigger, prefix="outbox-")
            engine.dispose()
            progress(f"delivery outbox: stored {events:,} reminders in {stored:.1f}s, due at T")
            first = _wait_for(receiver, events, prefix="", deadline=trigger.timestamp() + 1800, label="outbox")
        finally:
            for process, _ in processes:
                process.terminate()
            for process, _ in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
    result = _summary(f"outbox, {replicas} replicas", first, trigger.timestamp(), events)
    result.update(replicas=replicas, concurrency=concurrency, batch_size=batch_size, stored_seconds=stored,
                  target_p99_s=TARGET_P99_SECONDS, meets_target=result["p99_s"] <= TARGET_P99_SECONDS)
    return result


# -- the in-process publisher: one blocking push at a time on the loop's thread --------------


class BlockingWebhookPublisher:
    """The path before the outbox: after each batch commits, the loop POSTs every message, one at a time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(timeout=10)

    def publish(self, message: Any) -> None:
        self.client.post(self.url, content=b"{}", headers={"webhook-id": f"publisher-{message.notification_id}"})


def _publisher_replica(url: str, receiver_url: str, stop_all: MpEvent, barrier: Barrier, out: Any) -> None:
    from scheduler.core.loop import Scheduler
    from scheduler.database.database import Database
    from scheduler.nudging.decision import NudgingPlatform
    from scheduler.nudging.rules import load_catalogue

    engine = bench_engine(url, pool_size=2, max_overflow=2)
    scheduler = Scheduler(Database(engine), NudgingPlatform(load_catalogue(None)), SystemClock(),
                          publisher=BlockingWebhookPublisher(receiver_url), batch_size=20, poll_seconds=0.1,
                          name="publisher")
    stop = threading.Event()
    loop = threading.Thread(target=scheduler.run_blocking, args=(stop,), name="loop")
    barrier.wait()
    loop.start()
    stop_all.wait()
    stop.set()
    loop.join()
    out.put({"dispatched": scheduler.health.dispatched})
    engine.dispose()


def publisher(server: Server, receiver: Receiver, *, events: int, replicas: int, target_events: int,
              store_rate: float) -> dict[str, Any]:
    """``events`` reminders through the in-process publisher path; extrapolated to ``target_events``."""
    with server.fresh_database("delivery_publisher") as url:
        processes, stop_all, out = _start(_publisher_replica, (url, receiver.url), replicas)
        try:
            engine = bench_engine(url, pool_size=8)
            trigger = datetime.now(UTC) + timedelta(seconds=lead_time(events, store_rate))
            store_burst(engine, events=events, trigger_at=trigger, prefix="publisher-user-")
            engine.dispose()
            first = _wait_for(receiver, events, prefix="publisher-", deadline=trigger.timestamp() + 1800,
                              label="publisher", processes=processes)
        finally:
            _collect(processes, stop_all, out)
    result = _summary(f"in-process publisher, {replicas} replicas", first, trigger.timestamp(), events)
    rate = events / max(result["last_s"], 1e-9)
    result.update(replicas=replicas, pushes_per_second=rate, extrapolated_to=target_events,
                  extrapolated_p50_s=target_events / 2 / rate, extrapolated_p99_s=0.99 * target_events / rate,
                  extrapolated_last_s=target_events / rate)
    progress(f"delivery publisher: {rate:.1f} pushes/s; for {target_events:,} reminders about "
             f"p50 {result['extrapolated_p50_s']:.0f}s p99 {result['extrapolated_p99_s']:.0f}s (extrapolated)")
    return result


# -- the peers: the same HTTP call as a job ---------------------------------------------------


def _sender(receiver_url: str, concurrency: int) -> tuple[WebhookSender, DeliveryHttp]:
    client = DeliveryHttp(concurrency)  # the service's own: a kept-alive connection per send slot
    return WebhookSender(receiver_url, client=client, clock=SystemClock(), timeout=10.0, retry_after_cap=5.0,
                         secret=SECRET), client


def _delivery(peer: str, n: int) -> OutboundDelivery:
    return OutboundDelivery(delivery_id=str(n), idempotency_key=f"{peer}-{n}", channel="webhook",
                            notification_id=f"{peer}-n{n}", user_id=f"{peer}-user-{n}", community_id="bench-community",
                            kind="reminder", title="Reminder", body="run the dishwasher at noon",
                            created_at=datetime.now(UTC), attempt=1)


def _peer_worker(peer: str, conninfo: str, receiver_url: str, concurrency: int, stop_all: MpEvent,
                 barrier: Barrier, out: Any) -> None:
    async def work() -> None:
        sender, client = _sender(receiver_url, concurrency)

        async def deliver(n: int) -> None:
            await sender.send(_delivery(peer, n))

        if peer == "procrastinate":
            import procrastinate

            app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

            app.task(name="bench_deliver", queue="bench")(deliver)

            async with app.open_async():
                barrier.wait()
                worker = asyncio.create_task(app.run_worker_async(
                    queues=["bench"], concurrency=concurrency, wait=True, listen_notify=True,
                    fetch_job_polling_interval=PEER_POLL_SECONDS, install_signal_handlers=False,
                    delete_jobs="never"))
                while not stop_all.is_set() and not worker.done():
                    await asyncio.sleep(0.05)
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        else:
            from pgqueuer.qm import QueueManager
            from pgqueuer.queries import Queries
            from pgqueuer.types import QueueExecutionMode

            conn, driver = await _pgqueuer_driver(conninfo)
            manager = QueueManager(Queries(driver))

            async def bench_deliver(job: Any) -> None:
                await deliver(int(job.payload))

            manager.entrypoint("bench_deliver")(bench_deliver)

            async def watch() -> None:
                while not stop_all.is_set():
                    await asyncio.sleep(0.05)
                manager.shutdown.set()

            barrier.wait()
            watcher = asyncio.create_task(watch())
            # pgqueuer wants max_concurrent_tasks at least twice its batch
            await manager.run(batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency,
                              mode=QueueExecutionMode.continuous,
                              dequeue_timeout=timedelta(seconds=PEER_POLL_SECONDS))
            await watcher
            await conn.close()
        await client.aclose()
        out.put({})

    asyncio.run(work())


async def _enqueue(peer: str, conninfo: str, events: int, trigger: datetime) -> None:
    if peer == "procrastinate":
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
        task = app.task(name="bench_deliver", queue="bench")(_never)
        async with app.open_async():
            for start in range(0, events, 5_000):
                size = min(5_000, events - start)
                await task.configure(schedule_at=trigger).batch_defer_async(*({"n": start + i} for i in range(size)))
        return
    from pgqueuer.queries import Queries

    conn, driver = await _pgqueuer_driver(conninfo)
    try:
        queries = Queries(driver)
        for start in range(0, events, 5_000):
            size = min(5_000, events - start)
            after = trigger - datetime.now(UTC)  # pgqueuer stores NOW() + execute_after
            await queries.enqueue(["bench_deliver"] * size, [str(start + i).encode() for i in range(size)],
                                  [0] * size, [after] * size)
    finally:
        await conn.close()


async def _never(n: int) -> None:  # the enqueuing side's task; the workers run their own
    raise RuntimeError("not run here")


async def _install(peer: str, conninfo: str) -> None:
    if peer == "procrastinate":
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        return
    from pgqueuer.queries import Queries

    conn, driver = await _pgqueuer_driver(conninfo)
    try:
        await Queries(driver).install()
    finally:
        await conn.close()


def peer(server: Server, receiver: Receiver, name: str, *, events: int, replicas: int,
         concurrency: int) -> dict[str, Any]:
    """The same N as ``name``'s jobs scheduled at ``T``, each POSTing the webhook."""
    reason = missing(name)
    if reason is not None:
        progress(f"delivery {name}: skipped: {reason}")
        return {"system": name, "skipped": reason}
    with server.fresh_database(f"delivery_{name}") as url:
        conninfo = libpq_uri(url)
        asyncio.run(_install(name, conninfo))
        trigger = datetime.now(UTC) + timedelta(seconds=5 + events / 2_000)
        processes, stop_all, out = _start(_peer_worker, (name, conninfo, receiver.url, concurrency), replicas)
        try:
            asyncio.run(_enqueue(name, conninfo, events, trigger))
            first = _wait_for(receiver, events, prefix=f"{name}-", deadline=trigger.timestamp() + 1800, label=name,
                              processes=processes)
        finally:
            _collect(processes, stop_all, out)
    result = _summary(f"{name}, {replicas} workers", first, trigger.timestamp(), events)
    result.update(replicas=replicas, concurrency=concurrency, poll_seconds=PEER_POLL_SECONDS)
    return result


# -- the benchmark ------------------------------------------------------------------------------


def run(server: Server, *, events: int, replicas: int = 2, concurrency: int = CONCURRENCY,
        batch_size: int = BATCH_SIZE, publisher_events: int = PUBLISHER_EVENTS, latency_ms: int = LATENCY_MS,
        workdir: Path | None = None, rounds: int = 1) -> dict[str, Any]:
    """Every system of the module's list, each run against a receiver of its own (it keeps
    every key's first answer, and the outbox's keys, its idempotency keys, have no prefix to
    count by); the outbox first. With ``rounds`` above one, the outbox and pgqueuer run that
    many times, taking turns at going first (a machine's pace drifts over minutes: one run
    each is a coin toss when the two are close); their rows are then each one's median round
    by p99, and ``rounds`` lists every round. The publisher and procrastinate, far behind, run
    once, in the first round."""
    if rounds < 1:
        raise ValueError(f"at least one round, got {rounds}")
    workdir = workdir or Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-delivery-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    progress("delivery: calibrating the store rate")
    store_rate = calibrate_store_rate(server)

    def against_a_receiver(measure: Callable[[Receiver], dict[str, Any]]) -> dict[str, Any]:
        receiver = Receiver(latency_ms / 1000)
        try:
            return measure(receiver)
        finally:
            receiver.close()

    def ours() -> dict[str, Any]:
        return against_a_receiver(lambda r: outbox(server, r, events=events, replicas=replicas, concurrency=concurrency,
                                                   store_rate=store_rate, workdir=workdir, batch_size=batch_size))

    def theirs(name: str) -> dict[str, Any]:
        try:
            return against_a_receiver(lambda r: peer(server, r, name, events=events, replicas=replicas,
                                                     concurrency=concurrency))
        except Exception as exc:  # noqa: BLE001 - one peer's failure is its row; the others still run
            progress(f"delivery {name} FAILED: {type(exc).__name__}: {exc}")
            return {"system": name, "skipped": f"failed: {type(exc).__name__}: {str(exc).strip()[:200]}"}

    played: list[dict[str, Any]] = []
    once: list[dict[str, Any]] = []
    for number in range(rounds):
        first = "pgqueuer" if number % 2 else "outbox"
        if number:
            progress(f"delivery: round {number + 1} of {rounds}, {first} first")
        if first == "pgqueuer":
            theirs_row = theirs("pgqueuer")
            ours_row = ours()
        else:
            ours_row = ours()
            if number == 0:
                once = [against_a_receiver(lambda r: publisher(server, r, events=min(publisher_events, events),
                                                               replicas=replicas, target_events=events,
                                                               store_rate=store_rate)),
                        theirs("procrastinate")]
            theirs_row = theirs("pgqueuer")
        played.append({"first": first, "outbox": ours_row, "pgqueuer": theirs_row})
    section: dict[str, Any] = {"events": events, "replicas": replicas, "concurrency": concurrency,
                               "batch_size": batch_size, "latency_ms": latency_ms,
                               "target_p99_s": TARGET_P99_SECONDS}
    if rounds == 1:
        return section | {"systems": [played[0]["outbox"], *once, played[0]["pgqueuer"]]}
    section["rounds"] = [{"first": r["first"], "outbox_p99_s": r["outbox"].get("p99_s"),
                          "pgqueuer_p99_s": r["pgqueuer"].get("p99_s")} for r in played]
    return section | {"systems": [_median_round([r["outbox"] for r in played]), *once,
                                  _median_round([r["pgqueuer"] for r in played])]}


def _median_round(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose p99 is the median (the lower of the two middle ones for an even count),
    with every round's p99; a system skipped in any round is that round's row."""
    measured = sorted((r for r in results if "p99_s" in r), key=lambda r: r["p99_s"])
    if len(measured) < len(results):
        return next(r for r in results if "p99_s" not in r)
    return measured[(len(measured) - 1) // 2] | {"rounds_p99_s": [r["p99_s"] for r in results]}


def table(section: dict[str, Any]) -> list[str]:
    """The Markdown table of one run (``bench.report``)."""
    lines = [f"Trigger to delivered, {section['events']:,} reminders due at once, webhook to a receiver answering "
             f"after {section['latency_ms']} ms, {section['replicas']} replicas or workers at "
             f"{section['concurrency']} sends each, the outbox's replicas at batch "
             f"{section.get('batch_size', 20)} (target p99 <= {section['target_p99_s']:g} s):", "",
             "| system | reminders | p50 | p99 | last | note |", "|---|---:|---:|---:|---:|---|"]
    for s in section["systems"]:
        if "skipped" in s:
            lines.append(f"| {s['system']} | | | | | skipped: {s['skipped']} |")
            continue
        note = ""
        if "extrapolated_to" in s:
            note = (f"{s['pushes_per_second']:.1f} pushes/s; for {s['extrapolated_to']:,}: "
                    f"p50 ~{s['extrapolated_p50_s']:.0f} s, "
                    f"p99 ~{s['extrapolated_p99_s']:.0f} s (extrapolated)")
        elif "meets_target" in s:
            note = "meets the target" if s["meets_target"] else "misses the target"
        lines.append(f"| {s['system']} | {s['events']:,} | {s['p50_s']:.2f} s | {s['p99_s']:.2f} s | "
                     f"{s['last_s']:.2f} s | {note} |")
    rounds = section.get("rounds")
    if rounds:
        def p99s(name: str) -> str:
            return " / ".join("-" if r.get(f"{name}_p99_s") is None else f"{r[f'{name}_p99_s']:.2f} s" for r in rounds)

        paired = [r for r in rounds if r.get("outbox_p99_s") is not None and r.get("pgqueuer_p99_s") is not None]
        ahead = sum(r["outbox_p99_s"] <= r["pgqueuer_p99_s"] for r in paired)
        lines += ["", f"{len(rounds)} rounds, the outbox and pgqueuer taking turns at going first (the rows above "
                      f"are each one's median round): outbox p99 {p99s('outbox')}; pgqueuer p99 {p99s('pgqueuer')}; "
                      f"the outbox at or ahead of pgqueuer in {ahead} of {len(paired)}."]
    return lines
