"""Provider down: the webhook provider is unreachable for a while under load, then back.

Two `scheduler serve` replicas (``SCHEDULER_WEBHOOK_URL`` and a ``SCHEDULER_WEBHOOK_SECRET``
set) drain a backlog; every sent notification is an outbox row the replicas' delivery workers
send to a local receiver in this process, which checks each message's Standard Webhooks
signature. Once the first deliveries have arrived the provider goes down for ``--down-seconds``
(default 60): the first half its port refuses connections (nothing listens), the second half
it answers 503. Meanwhile a second backlog is stored, so notifications keep being decided and
queued while nothing can be delivered. Then it is back, and the backlog drains.

What must hold: the scheduled events end as planned (``workload.audit_backlog``); every sent
notification has exactly one webhook row and every row ends ``delivered`` (none given up,
none stuck); ``sorted(set(keys the receiver accepted)) == sorted(the rows' keys)``; the
receiver never got more requests for a key than its row counts attempts; and the outbox was
retried with backoff: rows went ``retrying`` during the outage with the error recorded, the
rows that waited out the outage counted several attempts, and the requests sent during the
outage per waiting delivery stay far below what sending without a backoff would have made.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from reliability.cluster import ScenarioError, cluster, free_port, log, wait_for
from reliability.report import report
from reliability.workload import audit_backlog, joined, pending_count, plan_backlog, seed_backlog
from scheduler.delivery.signing import WebhookVerificationError, format_secret, verify
from scheduler.testing.loopback import Answer, LoopbackServer, Reply, Request

OUTBOX = text("SELECT d.idempotency_key, d.status, d.attempts, d.last_error, d.created_at, d.delivered_at"
              " FROM deliveries AS d WHERE d.channel = 'webhook'")
SENT = text("SELECT count(*) FROM notifications WHERE status = 'sent'")
WAITING = text("SELECT count(*) FILTER (WHERE status = 'retrying') AS retrying,"
               " count(*) FILTER (WHERE status = 'queued') AS queued, coalesce(max(attempts), 0) AS max_attempts"
               " FROM deliveries WHERE channel = 'webhook' AND status IN ('queued', 'retrying')")
ERRORS = text("SELECT DISTINCT split_part(last_error, ':', 1) AS error FROM deliveries"
              " WHERE channel = 'webhook' AND status = 'retrying' AND last_error IS NOT NULL")
PATH = "/hooks"


class _FixedPortServer(LoopbackServer):
    """``LoopbackServer`` on a port chosen by the scenario, so the provider comes back where it was."""

    def __init__(self, handler: Any, port: int) -> None:
        super().__init__(handler)
        self._fixed = port

    async def __aenter__(self) -> _FixedPortServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._fixed, reuse_address=True)
        self.port = self._fixed
        return self


@dataclass
class Arrival:
    at: float  # time.monotonic()
    key: str
    status: int


@dataclass
class Provider:
    """The webhook receiver, on a thread of its own: ``up``, ``refused`` (nothing listens on its
    port) or ``503`` (it answers every message 503)."""

    secret: bytes
    port: int = field(default_factory=free_port)
    mode: str = "up"
    arrivals: list[Arrival] = field(default_factory=list)
    refused_signatures: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="provider", daemon=True)
        self._server: _FixedPortServer | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PATH}"

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=30)

    async def _handle(self, request: Request) -> Answer:
        key = request.headers.get("webhook-id", "")
        try:
            verify(self.secret, request.headers, request.body, now=datetime.now(UTC))
        except WebhookVerificationError:
            with self._lock:
                self.refused_signatures += 1
            return Reply.of(401, "bad signature")
        status = 503 if self.mode == "503" else 204
        with self._lock:
            self.arrivals.append(Arrival(time.monotonic(), key, status))
        return Reply.of(status, "down for maintenance" if status == 503 else b"")

    async def _listen(self) -> None:
        self._server = _FixedPortServer(self._handle, self.port)
        await self._server.__aenter__()

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.__aexit__(None, None, None)
            self._server = None

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    def set_mode(self, mode: str) -> None:
        """``up``, ``refused`` or ``503``: listening again when it leaves ``refused``."""
        if mode == "refused":
            self._call(self._close())
        elif self._server is None:
            self._call(self._listen())
        self.mode = mode
        log(f"provider: {mode}")

    def stop(self) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def snapshot(self) -> list[Arrival]:
        with self._lock:
            return list(self.arrivals)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=2000,
                        help="due events, half stored before the outage and half during it (default 2000)")
    parser.add_argument("--replicas", type=int, default=2, help="scheduler serve processes (default 2)")
    parser.add_argument("--down-seconds", type=float, default=60.0,
                        help="how long the provider is down: half refusing connections, half 503 (default 60)")
    parser.add_argument("--backoff-seconds", type=float, default=1.0, help="SCHEDULER_DELIVERY_BACKOFF_SECONDS (1)")
    parser.add_argument("--backoff-cap-seconds", type=float, default=10.0,
                        help="SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS (default 10)")
    parser.add_argument("--concurrency", type=int, default=16, help="SCHEDULER_DELIVERY_CONCURRENCY (default 16)")
    parser.add_argument("--timeout", type=float, default=600, help="give up draining after this many seconds")


def _outbox(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(OUTBOX).all())


def run(args: argparse.Namespace) -> int:
    problems: list[str] = []
    figures: dict[str, object] = {"seed": args.seed, "replicas": args.replicas, "down_seconds": args.down_seconds}
    first = plan_backlog(args.seed, args.events // 2, prefix=f"before-{args.seed}")
    second = plan_backlog(args.seed + 1, args.events - args.events // 2, prefix=f"during-{args.seed}")
    database = f"rel_provider_{args.seed}"
    secret = bytes(range(32))
    provider = Provider(secret)
    provider.start()
    try:
        with cluster(Path(args.pgdata), database, Path(args.workdir) / database, keep=args.keep) as c:
            env = {"SCHEDULER_POLL_SECONDS": "0.1", "SCHEDULER_WEBHOOK_URL": provider.url,
                   "SCHEDULER_WEBHOOK_SECRET": format_secret(secret),
                   "SCHEDULER_DELIVERY_BACKOFF_SECONDS": str(args.backoff_seconds),
                   "SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS": str(args.backoff_cap_seconds),
                   "SCHEDULER_DELIVERY_MAX_ATTEMPTS": "100", "SCHEDULER_DELIVERY_TIMEOUT_SECONDS": "2",
                   "SCHEDULER_DELIVERY_CONCURRENCY": str(args.concurrency)}
            replicas = [c.add_replica(i + 1, **env) for i in range(args.replicas)]
            seed_backlog(c.engine, first)
            log(f"seeded {len(first.events)} due events; starting {args.replicas} replicas")
            for replica in replicas:
                replica.start(wait=False)
            for replica in replicas:
                replica.wait_healthy(60)
            wait_for(lambda: len(provider.snapshot()) >= 5, 120, "the first deliveries to arrive")
            outage = _outage(c.engine, provider, args, second, figures)
            back = time.monotonic()
            try:
                wait_for(lambda: pending_count(c.engine) == 0, args.timeout, "the backlog to drain", interval=0.5)
                wait_for(lambda: all(r.status in ("delivered", "undeliverable") for r in _outbox(c.engine)),
                         args.timeout, "the outbox to drain", interval=0.5)
            except ScenarioError as exc:
                problems.append(str(exc))
            figures["outbox_drained_after_back_seconds"] = round(time.monotonic() - back, 1)
            audit = audit_backlog(c.engine, joined(first, second))
            problems.extend(audit.problems)
            figures.update(audit.figures)
            figures["lost"] = audit.lost + _check_deliveries(c.engine, provider, outage, figures, problems)
            if problems:
                args.keep = c.keep = True
    finally:
        provider.stop()
    reproduce = (f"python -m reliability provider-down --seed {args.seed} --events {args.events} "
                 f"--replicas {args.replicas} --down-seconds {args.down_seconds:g}")
    return report("provider-down", figures, problems, reproduce)


@dataclass
class Outage:
    began: float
    ended: float
    max_retrying: int = 0
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (retrying, queued, max attempts)
    errors: set[str] = field(default_factory=set)  # what retrying rows' last_error began with


def _outage(engine: Engine, provider: Provider, args: argparse.Namespace, second: Any,
            figures: dict[str, object]) -> Outage:
    """The provider down: refusing, then 503; the second backlog stored meanwhile; sampled each second."""
    began = time.monotonic()
    half = began + args.down_seconds / 2
    provider.set_mode("refused")
    stored = False
    outage = Outage(began, began)
    while (now := time.monotonic()) < began + args.down_seconds:
        if now >= half and provider.mode == "refused":
            provider.set_mode("503")
        if not stored and now >= began + args.down_seconds / 4:
            seed_backlog(engine, second)  # load arriving while nothing can be delivered
            stored = True
            log(f"stored {len(second.events)} more due events during the outage")
        with engine.connect() as conn:
            row = conn.execute(WAITING).one()
            outage.errors |= {e.error for e in conn.execute(ERRORS)}
        outage.samples.append((int(row.retrying), int(row.queued), int(row.max_attempts)))
        outage.max_retrying = max(outage.max_retrying, int(row.retrying))
        time.sleep(min(1.0, max(0.0, began + args.down_seconds - time.monotonic())))
    if not stored:
        seed_backlog(engine, second)
    outage.ended = time.monotonic()
    provider.set_mode("up")
    figures["retrying_at_most_during_outage"] = outage.max_retrying
    figures["errors_recorded_during_outage"] = sorted(outage.errors)
    return outage


def _check_deliveries(engine: Engine, provider: Provider, outage: Outage, figures: dict[str, object],
                      problems: list[str]) -> int:
    """The outbox's checks (the module's list); returns how many deliveries were lost."""
    rows = _outbox(engine)
    with engine.connect() as conn:
        sent = int(conn.execute(SENT).scalar_one())
    arrivals = provider.snapshot()
    accepted = sorted({a.key for a in arrivals if a.status == 204})
    keys = sorted(r.idempotency_key for r in rows)
    counts = Counter(a.key for a in arrivals)
    statuses = Counter(r.status for r in rows)
    attempts = [r.attempts for r in rows]
    during = [a for a in arrivals if outage.began <= a.at < outage.ended]
    waited = [r for r in rows if r.attempts > 1]
    figures.update(
        sent_notifications=sent, webhook_rows=len(rows), delivered=statuses.get("delivered", 0),
        undeliverable=statuses.get("undeliverable", 0),
        stuck=sum(n for status, n in statuses.items() if status not in ("delivered", "undeliverable")),
        requests=len(arrivals), requests_503=sum(1 for a in arrivals if a.status == 503),
        requests_during_outage=len(during), retried_rows=len(waited),
        attempts_max=max(attempts, default=0), attempts_mean=round(statistics.fmean(attempts), 2) if attempts else 0,
        refused_attempts=sum(attempts) - len(arrivals), bad_signatures=provider.refused_signatures,
    )
    if len(rows) != sent:
        problems.append(f"{sent} sent notifications but {len(rows)} webhook rows")
    not_delivered = [r for r in rows if r.status != "delivered"]
    if not_delivered:
        r = not_delivered[0]
        problems.append(f"{len(not_delivered)} webhook rows not delivered, e.g. {r.idempotency_key} "
                        f"{r.status} after {r.attempts} attempts: {r.last_error}")
    if accepted != keys:
        missing = sorted(set(keys) - set(accepted))
        problems.append(f"keys the receiver accepted differ from the outbox's: {len(missing)} missing, "
                        f"{len(set(accepted) - set(keys))} extra")
    over = [r for r in rows if counts[r.idempotency_key] > r.attempts]
    if over:
        problems.append(f"{len(over)} rows got more requests than they count attempts, e.g. {over[0].idempotency_key}")
    if provider.refused_signatures:
        problems.append(f"{provider.refused_signatures} messages failed the signature check")
    if outage.max_retrying == 0:
        problems.append("no row was ever retrying during the outage: the outage was not seen")
    for error in ("connection error", "HTTP 503"):
        if error not in outage.errors:
            problems.append(f"no retrying row recorded {error!r} during the outage (saw {sorted(outage.errors)})")
    if not waited:
        problems.append("no row counted more than one attempt: nothing was retried")
    # Without a backoff a worker would resend each waiting row about every second (a refused
    # connection answers at once); with it, the outage costs a few requests per row.
    waiting_rows = max(outage.max_retrying, 1)
    per_row = len(during) / waiting_rows
    figures["requests_during_outage_per_waiting_row"] = round(per_row, 2)
    seconds = outage.ended - outage.began
    if per_row > max(4.0, seconds / 4):
        problems.append(f"{per_row:.1f} requests per waiting row in a {seconds:.0f} s outage: no backoff")
    return len(set(keys) - set(accepted))  # an undeliverable row's key is among them: never accepted
