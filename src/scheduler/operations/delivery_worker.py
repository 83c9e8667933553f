"""The delivery worker (DEC-OUTBOX, OUTBOX-*): sends the outbox's rows, at least once.

The decision writes a row of ``deliveries`` with status ``queued`` for every channel with a
``Sender`` (the webhook, a host's own), in the transaction that records the notification; a
rolled-back decision leaves none. Every replica runs one worker, an asyncio task beside the
loop, off the loop's thread:

- **claim** (``claim_due_deliveries``, a short transaction in a worker thread): due rows,
  ``FOR UPDATE SKIP LOCKED``, each leased to this worker until ``now + lease`` and its attempt
  counted, up to twice ``concurrency`` held (in flight, and claimed ahead so that a slot that
  frees starts its next send at once). A worker that dies holding rows leaves them to
  whichever worker claims after the lease: the send is repeated, with the same idempotency
  key; a worker that stops gives back the rows it claimed ahead (``release_delivery_leases``).
- **send** (``delivery.attempt``): at most ``concurrency`` sends in flight, each bounded by the
  per-send timeout, never raising.
- **record** (``delivery.record.record_attempt``, then ``record_delivery_attempts``):
  ``delivered``, ``retrying`` with ``next_attempt_at`` after the backoff, or ``undeliverable``;
  only while the lease is still this worker's for that attempt. A web push the push service
  answered 404 or 410 (``Gone``) also removes its subscription, as it was when the push was
  sent, in the same transaction (PUSH-8). A record the database refuses (down, restarted) is
  kept and tried again by a later round, ``idle_seconds`` on (OUTBOX-13): what was sent is not
  sent again for a moment's outage; only a worker that stops or dies first leaves it to the
  leases.

A round is a poll: its connection, used a moment ago, is not pinged before use
(``database.engine.polling``); a connection that died meanwhile fails the round, and the next
one takes a fresh connection.

A ``web_push`` row is one subscription's: the claim reads the subscription as it is now, and a
row whose subscription was removed meanwhile has none (its sender answers ``Undeliverable``).

Time is the injected clock's (the claim's ``:now``, the lease, the record); randomness an
injected ``random.Random``. ``run_once`` is one claim, its sends and their records (what a
test steps); ``run`` repeats it, and between claims waits for a free slot, a wake-up
(``wake``: a committed batch queued rows) or ``idle_seconds``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import anyio.to_thread
from anyio import CapacityLimiter

from scheduler.database.database import Database
from scheduler.database.engine import polling
from scheduler.delivery.attempt import attempt
from scheduler.delivery.backoff import RetryPolicy
from scheduler.delivery.record import AttemptRecord, record_attempt
from scheduler.types import Clock, OutboundDelivery, PushTarget, Sender, SendResult, Undeliverable

logger = logging.getLogger(__name__)

IDLE_SECONDS = 1.0  # how long an idle worker waits before it looks again (other replicas' rows)
STOP_RECORD_SECONDS = 5.0  # how long a stopping worker may take to record the sends that finished


def lease_seconds_for(timeout: float) -> float:
    """The lease a claim takes: long past one send's timeout, so a live worker records before
    another may take the row over (DEC-OUTBOX)."""
    return max(30.0, 3.0 * timeout)


@dataclass(frozen=True)
class Claimed:
    """One leased outbox row: the delivery as its sender gets it, and what recording needs."""

    delivery: OutboundDelivery
    previous_delay: float | None
    triggered_at: datetime
    # a web push's subscription as the claim read it (its id, its updated_at): what a 404 or
    # 410 removes
    push_subscription: tuple[int, datetime] | None = None
    # the end of the claim's lease: a record kept past it is left to the lease (OUTBOX-13)
    leased_until: datetime | None = None


@dataclass(frozen=True)
class Recorded:
    """What one attempt became, for the worker's observers (metrics)."""

    claimed: Claimed
    result: SendResult
    record: AttemptRecord
    at: datetime
    kept: bool  # False when the lease had passed to another worker: nothing was written


Observer = Callable[[list[Recorded]], None]


class DeliveryWorker:
    """One replica's delivery worker (see the module)."""

    def __init__(self, database: Database, senders: Mapping[str, Sender], clock: Clock, *,
                 policy: RetryPolicy, concurrency: int, timeout: float, rng: random.Random | None = None,
                 lease_seconds: float | None = None, idle_seconds: float = IDLE_SECONDS,
                 worker_id: str | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"at least one send at a time, got {concurrency}")
        self.database = database
        self.senders = dict(senders)
        self.clock = clock
        self.policy = policy
        self.concurrency = concurrency
        self.timeout = timeout
        self.rng = rng or random.Random()
        self.lease = timedelta(seconds=lease_seconds if lease_seconds is not None else lease_seconds_for(timeout))
        self.idle_seconds = idle_seconds
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.observers: list[Observer] = []
        self._limiter = CapacityLimiter(1)  # the worker's own thread: one round at a time
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._done: list[tuple[Claimed, SendResult]] = []  # sent, not yet recorded
        self._ready: collections.deque[Claimed] = collections.deque()  # claimed, not yet sent
        self.ahead = 2 * concurrency  # rows held at most: in flight and claimed ahead
        self._finished: asyncio.Event | None = None  # set when a send joins _done

    # -- the steps ------------------------------------------------------------------------

    def claim(self, limit: int) -> list[Claimed]:
        """Lease up to ``limit`` due rows (synchronous: one short transaction)."""
        now = self.clock.now()
        with self.database() as session:
            found = self.database.deliveries.claim_due(session, now=now, lease_until=now + self.lease,
                                                       worker=self.worker_id, limit=limit, commit=True)
        return [_claimed(row, now + self.lease) for row in found]

    async def attempt_one(self, claimed: Claimed) -> SendResult:
        """One attempt through the row's channel (a channel without a sender is undeliverable)."""
        sender = self.senders.get(claimed.delivery.channel)
        if sender is None:
            return Undeliverable(reason=f"no sender for the channel {claimed.delivery.channel!r}")
        return await attempt(sender, claimed.delivery, timeout=self.timeout)

    def record(self, outcomes: list[tuple[Claimed, SendResult]]) -> list[Recorded]:
        """Record each attempt's result in one statement (synchronous)."""
        if not outcomes:
            return []
        now = self.clock.now()
        records = [(claimed, result, record_attempt(result, attempt=claimed.delivery.attempt, now=now,
                                                    policy=self.policy, rng=self.rng,
                                                    previous_delay=claimed.previous_delay))
                   for claimed, result in outcomes]
        document = [_record_json(claimed.delivery.delivery_id, record, now) for claimed, _, record in records]
        gone = [claimed.push_subscription for claimed, _, record in records
                if record.remove_subscription and claimed.push_subscription is not None]
        with self.database() as session:
            # one round trip, BEGIN to COMMIT, unless a subscription is gone too
            kept = self.database.deliveries.record_attempts(session, document, worker=self.worker_id,
                                                            commit=not gone)
            if gone:
                # the push service's 404/410 is the subscription's end, whoever holds the lease (PUSH-8)
                self.database.push_subscriptions.remove_gone(session, gone)
                session.commit()
        recorded = [Recorded(c, r, rec, now, c.delivery.delivery_id in kept) for c, r, rec in records]
        for observer in self.observers:
            try:
                observer(recorded)
            except Exception:
                logger.exception("delivery worker %s: an observer failed", self.worker_id)
        return recorded

    async def run_once(self, limit: int | None = None) -> list[Recorded]:
        """One claim (up to ``limit``, by default the concurrency), every send at once, one record."""
        claimed = await self._thread(self.claim, limit or self.concurrency)
        if not claimed:
            return []
        results = await asyncio.gather(*(self.attempt_one(c) for c in claimed))
        recorded: list[Recorded] = await self._thread(self.record, list(zip(claimed, results, strict=True)))
        return recorded

    # -- the task ---------------------------------------------------------------------------

    def wake(self) -> None:
        """Look for due rows now (thread-safe: a committed batch queued some)."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def run(self, stop: asyncio.Event) -> None:
        """Claim, send and record until ``stop`` is set; then cancel the sends in flight (their
        leases run out and another claim sends them again, with the same keys), record those
        that finished and give back the rows claimed ahead.

        One round at a time, in the worker's thread: the records of every send that finished
        since the last round in one statement, then one claim for what the worker may hold
        (``ahead``: its sends in flight and as many claimed ahead). A send that finishes starts
        the next claimed row's at once, so no slot waits for a round. The round batches by
        itself: the sends that finish while one round runs are the next one's, so a busy worker
        writes few, large statements, and an idle one answers at once. A claim runs only when it
        may find rows: after a wake, after a claim that got all it asked for, or after
        ``idle_seconds`` (another replica's rows, a retry come due)."""
        self._loop = loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        self._finished = asyncio.Event()
        look = True  # whether a claim may find due rows
        retry_at: float | None = None  # after a refused record: when the next record is tried
        kept: list[tuple[Claimed, SendResult]] = []  # the refused records, tried again at retry_at
        try:
            while not stop.is_set():
                if wake.is_set():
                    wake.clear()
                    look = True
                if retry_at is not None and loop.time() >= retry_at:
                    retry_at = None
                # held: in flight, and claimed ahead for the slots that free up before the next
                # round (a slot never waits for a round trip to the database)
                held = len(self._inflight) + len(self._ready)
                finished: list[tuple[Claimed, SendResult]] = []
                again: list[tuple[Claimed, SendResult]] = []
                if retry_at is None:
                    finished, self._done = self._done, []
                    again, kept = kept, []
                self._finished.clear()
                want = self.ahead - held if look and held < self.ahead else 0
                if finished or want or again:
                    claimed, unrecorded = await self._thread(self._round, finished, want, None, again)
                    if unrecorded:
                        # the database refused the record: kept, and tried again after
                        # idle_seconds (no hot loop against a database that is down)
                        kept = unrecorded
                        retry_at = loop.time() + self.idle_seconds
                    if want:
                        # a claim that got all it asked for may have left more due rows (a round
                        # that only recorded knows nothing new: what it thought stands)
                        look = len(claimed) == want
                    self._ready.extend(claimed)
                    self._start_ready()
                    continue
                # nothing to record and no claim worth making: wait for a finished send (unless
                # records wait for their retry), a wake or the stop; after idle_seconds (or at the
                # retry) look again
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
                if retry_at is None:
                    waits.append(asyncio.ensure_future(self._finished.wait()))
                timeout = self.idle_seconds if retry_at is None else max(0.0, retry_at - loop.time())
                _, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for future in pending:
                    future.cancel()
                if len(pending) == len(waits):
                    look = True
        finally:
            unsent, self._ready = list(self._ready), collections.deque()
            for task in list(self._inflight):
                task.cancel()
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
            finished, self._done = kept + self._done, []
            if finished or unsent:
                # what was sent before the stop is recorded now, and what was claimed ahead is
                # given back, not left to a lease; bounded, so a database that is gone does not
                # hold the stop
                with anyio.move_on_after(STOP_RECORD_SECONDS):
                    await self._thread(self._round, finished, 0, unsent, abandon=True)
            self._wake = None

    def release(self, claimed: list[Claimed]) -> set[str]:
        """Give back rows claimed and never sent (synchronous: one short transaction)."""
        rows = [{"id": c.delivery.delivery_id, "attempts": c.delivery.attempt} for c in claimed]
        with self.database.begin() as session:
            return self.database.deliveries.release(session, rows, worker=self.worker_id)

    def _round(self, finished: list[tuple[Claimed, SendResult]], want: int,
               unsent: list[Claimed] | None = None, again: list[tuple[Claimed, SendResult]] | None = None,
               ) -> tuple[list[Claimed], list[tuple[Claimed, SendResult]]]:
        """Record ``again`` (records refused before) and ``finished``, each in its own statement,
        give back ``unsent`` (a stopping worker's), then lease up to ``want`` rows: what it
        leased, and what it could not record. A step that fails is logged and the round goes
        on: the caller keeps the unrecorded for a later round while their leases last
        (OUTBOX-13), ungiven rows wait for their leases, and the next round claims again."""
        unrecorded: list[tuple[Claimed, SendResult]] = []
        with polling():  # a round's connection was used a moment ago: no ping first
            # apart: a record that keeps failing (a row the statement cannot take) never holds
            # back the records of the sends that finished since
            for outcomes in (again, finished):
                if outcomes and self._step(self.record, outcomes, "recording %d deliveries failed; kept for a "
                                           "later round", len(outcomes)) is None:
                    unrecorded.extend(outcomes)
            if unsent:
                self._step(self.release, unsent, "giving back %d claimed deliveries failed; their leases run out",
                           len(unsent))
            claimed: list[Claimed] | None = (self._step(self.claim, want, "claim failed; trying again")
                                             if want else None)
        return claimed or [], self._within_lease(unrecorded)

    def _within_lease(self, unrecorded: list[tuple[Claimed, SendResult]]) -> list[tuple[Claimed, SendResult]]:
        """The refused records whose lease still holds; the others are left to their leases
        (another claim sends them again, with the same keys)."""
        now = self.clock.now()
        kept = [(c, r) for c, r in unrecorded if c.leased_until is None or c.leased_until > now]
        if len(kept) < len(unrecorded):
            logger.warning("delivery worker %s: %d refused records outlived their leases; they are sent again",
                           self.worker_id, len(unrecorded) - len(kept))
        return kept

    def _step(self, fn: Callable[[Any], Any], arg: Any, failed: str, *args: object) -> Any:
        """``fn(arg)``, or None with ``failed`` logged (per-round isolation: ``Exception`` only)."""
        try:
            return fn(arg)
        except Exception:
            logger.exception("delivery worker %s: " + failed, self.worker_id, *args)
            return None

    def _start_ready(self) -> None:
        """Start claimed rows' sends while a slot is free."""
        while self._ready and len(self._inflight) < self.concurrency:
            one = self._ready.popleft()
            task = asyncio.create_task(self._one(one), name=f"delivery-{one.delivery.delivery_id}")
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _one(self, claimed: Claimed) -> None:
        result = await self.attempt_one(claimed)
        self._done.append((claimed, result))
        task = asyncio.current_task()
        if task is not None:
            self._inflight.discard(task)  # its slot is free: the next claimed row's send starts now
        self._start_ready()
        if self._finished is not None:
            self._finished.set()

    async def _thread(self, fn: Callable[..., Any], *args: Any, abandon: bool = False) -> Any:
        """``fn(*args)`` in the worker's thread (``abandon``: a cancel does not wait for it)."""
        return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon, limiter=self._limiter)


def _claimed(row: Mapping[str, Any], leased_until: datetime) -> Claimed:
    message = row["message"] or {}
    created = message.get("created_at")
    delivery = OutboundDelivery(
        delivery_id=str(row["id"]), idempotency_key=row["idempotency_key"], channel=row["channel"],
        notification_id=row["notification_id"], user_id=row["user_id"],
        community_id=message.get("community_id"), kind=message.get("kind", ""),
        title=message.get("title", ""), body=message.get("body", ""),
        created_at=datetime.fromisoformat(created) if isinstance(created, str) else row["created_at"],
        attempt=int(row["attempts"]),
        push=_push_target(row),
    )
    subscription = row.get("push_subscription_id")
    pushed = (int(subscription), row["push_subscribed_at"]) if subscription is not None else None
    return Claimed(delivery, row["last_delay_seconds"], row["triggered_at"], pushed, leased_until)


def _push_target(row: Mapping[str, Any]) -> PushTarget | None:
    """A web push row's subscription as the claim read it; None without one (removed, or
    another channel's row)."""
    if row.get("push_subscription_id") is None:
        return None
    return PushTarget(endpoint=row["push_endpoint"], p256dh=bytes(row["push_p256dh"]), auth=bytes(row["push_auth"]),
                      subscription_id=str(row["push_subscription_id"]))


def _record_json(delivery_id: str, record: AttemptRecord, now: datetime) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {"id": delivery_id, "status": str(record.status), "attempts": record.attempts,
            "next_attempt_at": iso(record.next_attempt_at), "last_error": record.last_error,
            "delay_seconds": record.delay_seconds, "delivered_at": iso(record.delivered_at),
            "provider_status": record.provider_status, "provider_answer": record.provider_answer,
            "at": iso(now)}
