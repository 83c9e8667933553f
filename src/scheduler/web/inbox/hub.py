"""The participant's live inbox, from any replica.

The path of a notification to a browser:

1. A batch (or a live event) commits its notification and delivery (REQ-0066).
2. After that commit, ``StreamPublisher`` gives the notification its stream number
   (``notifications.stream_seq``) and sends ``NOTIFY scheduler_inbox, '<number>'`` in one
   short transaction. The numbering is serialised by an advisory lock held until commit, so
   stream numbers are committed in order: a reader that saw number N has seen every number
   below N, and a ``Last-Event-ID`` replay (``stream_seq > N``) misses nothing.
3. Every replica's ``Inbox`` hears the NOTIFY on the process's one LISTEN connection
   (``scheduler.database.listener``), reads what is new from the table (the payload is only the
   number), and offers each row to the queues of that participant's open streams.
4. Each ``GET /me/notifications/stream`` (``scheduler.web.inbox.routes``) drains its own queue
   as server-sent events (``sse_stream``).

Nothing in that path can hold up the loop or another client: the publisher only runs one
small transaction; the hub never waits for a client (``put_nowait`` into a bounded queue);
a client whose queue is full is dropped (its stream ends after what it already holds, and
its reconnect replays the rest from the table); a vanished client's stream is cancelled by
the server and unsubscribes in ``finally``. Heartbeat comments keep proxies from closing
an idle stream. Where LISTEN is unavailable (a transaction-pooling PgBouncer) the hub reads
the table on a short timer instead: later by at most that interval, nothing lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool

from scheduler.application.ingest import publish_committed
from scheduler.database.database import Database, row_as_json
from scheduler.database.listener import Listener
from scheduler.types import BulkPublisher, OutboundMessage, Publisher
from scheduler.web.http.sse import RETRY_MS

logger = logging.getLogger(__name__)

CHANNEL = "scheduler_inbox"
STREAM_LOCK_KEY = int.from_bytes(hashlib.blake2b(b"nudging-inbox-stream", digest_size=8).digest(), "big", signed=True)
REPLAY_LIMIT = 500


class StreamPublisher(BulkPublisher):
    """After commit: number a delivered web notification for the stream and NOTIFY every
    replica; then hand the messages to ``inner`` (the configured publisher) through the
    core's publish path, whose logger names a failed push (CTX-DELIVERY.3): this one logs
    only the inbox's own failure, the numbering. A ``BulkPublisher``: a committed batch's
    messages are numbered in one transaction."""

    def __init__(self, database: Database, inner: Publisher | None = None,
                 name: str = "scheduler") -> None:
        self.database = database
        self.inner = inner
        self.name = name  # who publishes (the loop's name, or the live path), in a failure's log line

    def publish_many(self, messages: Sequence[OutboundMessage]) -> None:
        """A whole batch's messages: numbered in one transaction, then to ``inner``."""
        try:
            self.number([m.notification_id for m in messages if m.channel == "web"])
        except Exception:
            # Committed and recorded already: the notifications stay readable in
            # GET /me/notifications, and every replica's inbox numbers them on its next
            # read (INBOX-15): late in the stream, never missing from it.
            logger.exception("inbox: numbering %d notifications for the stream failed; "
                             "the inbox numbers them on its next read", len(messages))
        publish_committed(self.inner, messages, self.name)

    def number(self, notification_ids: list[str]) -> list[int]:
        """Give each notification its stream number (once) and announce the newest."""
        if not notification_ids:
            return []
        with self.database() as session:
            # under the stream's order lock, held until commit: numbers commit in the order
            # they are given; the NOTIFY (the newest number) is delivered with the commit. One
            # round trip, BEGIN to COMMIT: the poll that published waits for nothing more
            return self.database.inbox.number_for_stream(session, notification_ids, lock_key=STREAM_LOCK_KEY,
                                                         channel=CHANNEL, commit=True)


@dataclass(eq=False)
class Subscriber:
    """One open stream: a participant's bounded queue of rows (stream order)."""

    user_id: str
    queue: asyncio.Queue[dict[str, Any]]
    dropped: bool = False

    def offer(self, row: dict[str, Any]) -> bool:
        """Queue a row without waiting; False (and the client is dropped) when full."""
        if self.dropped:
            return False
        try:
            self.queue.put_nowait(row)
        except asyncio.QueueFull:
            self.dropped = True
            return False
        return True


@dataclass
class InboxStats:
    notifies: int = 0
    reads: int = 0
    offered: int = 0
    dropped_clients: int = 0
    streams_opened: int = 0
    streams_closed: int = 0


def _read_tail(database: Database, after: int, limit: int) -> list[dict[str, Any]]:
    with database.begin() as session:
        return database.inbox.stream_tail(session, after=after, limit=limit)


def number_unnumbered(database: Database, limit: int) -> int:
    """Number what a failed numbering left unnumbered (INBOX-15); how many it numbered."""
    with database.begin() as session:
        return len(database.inbox.number_unnumbered(session, lock_key=STREAM_LOCK_KEY, channel=CHANNEL,
                                                    limit=limit))


def stream_head(database: Database) -> int:
    with database.begin() as session:
        return database.inbox.stream_head(session)


def _replay(database: Database, user_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    with database.begin() as session:
        return database.inbox.participant_stream_after(session, user_id=user_id, after=after, limit=limit)


class Inbox:
    """This process's fan-out hub: LISTEN wake-ups in, per-client bounded queues out."""

    def __init__(
        self,
        database: Database,
        *,
        listener: Listener | None = None,
        queue_size: int = 100,
        heartbeat_seconds: float = 15.0,
        fallback_seconds: float = 0.5,
        safety_seconds: float = 5.0,
        read_limit: int = 1000,
    ) -> None:
        self.database = database
        self.listener = listener
        self.queue_size = queue_size
        self.heartbeat_seconds = heartbeat_seconds
        self.fallback_seconds = fallback_seconds
        self.safety_seconds = safety_seconds
        self.read_limit = read_limit
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.cursor: int | None = None  # the last stream number the hub has read
        self.stats = InboxStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._subscribed = False
        self._starting: asyncio.Lock | None = None
        if listener is not None and listener.has_subscribers:
            # The service starts this listener anyway (prompt mode): be in it from the start.
            self._listen_on(listener)
        # Otherwise the first stream subscribes and starts it (see _ensure_listening), so a
        # replica no browser connects to keeps no LISTEN connection open for the inbox.

    def _listen_on(self, listener: Listener) -> None:
        if not self._subscribed:
            listener.subscribe(CHANNEL, self._on_notify)
            self._subscribed = True

    async def _ensure_listening(self) -> None:
        listener = self.listener
        if listener is None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            self._listen_on(listener)
            if not listener.running:
                await run_in_threadpool(listener.start)

    @property
    def listening(self) -> bool:
        return self.listener is not None and self.listener.available

    def _on_notify(self, payload: str) -> None:
        """On the listener thread: only wake the hub (quick, never blocks)."""
        self.stats.notifies += 1
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)

    async def subscribe(self, user_id: str) -> Subscriber:
        """Register a stream; start the hub on this event loop if it is not running."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._wake is None:
            # a new event loop (a restarted server in the same process): a new hub task
            self._loop, self._wake, self._task, self._starting = loop, asyncio.Event(), None, None
        await self._ensure_listening()
        if self.cursor is None:
            self.cursor = await run_in_threadpool(stream_head, self.database)
        subscriber = Subscriber(user_id, asyncio.Queue(maxsize=self.queue_size))
        self.subscribers.setdefault(user_id, set()).add(subscriber)
        self.stats.streams_opened += 1
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="inbox-hub")
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        group = self.subscribers.get(subscriber.user_id)
        if group is not None:
            group.discard(subscriber)
            if not group:
                del self.subscribers[subscriber.user_id]
        self.stats.streams_closed += 1

    async def _run(self) -> None:
        """Read what is new whenever woken (or on a timer), until no stream is open."""
        assert self._wake is not None
        while self.subscribers:
            timeout = self.safety_seconds if self.listening else self.fallback_seconds
            notified = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                notified = True
            self._wake.clear()
            try:
                # a NOTIFY means a numbering committed; only the timer's wake looks for a
                # numbering that failed (INBOX-15), so a busy stream costs no extra read
                await self.pump(repair=not notified)
            except Exception:
                logger.exception("inbox: reading new notifications failed; retrying")
        self.cursor = None  # nobody listens: the next stream starts from the head again

    async def pump(self, repair: bool = True) -> int:
        """Number what a failed numbering left behind (``repair``), then read every row after
        the cursor and offer each to its participant's streams."""
        offered = 0
        if repair and self.subscribers:
            # Retried until it holds (INBOX-15): a numbering that failed after its batch
            # committed (a failover, a lost connection) is done here, by whichever replica
            # reads next on its timer; a failure is logged by the hub and retried then.
            await run_in_threadpool(number_unnumbered, self.database, self.read_limit)
        while self.subscribers and self.cursor is not None:
            rows = await run_in_threadpool(_read_tail, self.database, self.cursor, self.read_limit)
            self.stats.reads += 1
            for row in rows:
                self.cursor = max(self.cursor, int(row["stream_seq"]))
                for subscriber in list(self.subscribers.get(row["user_id"], ())):
                    if subscriber.offer(row):
                        offered += 1
                    else:
                        # a slow client: drop it (its stream ends; a reconnect replays the rest)
                        self.stats.dropped_clients += 1
                        self.unsubscribe(subscriber)
            if len(rows) < self.read_limit:
                break
        self.stats.offered += offered
        return offered

    def snapshot(self) -> dict[str, Any]:
        return {"streams": sum(len(g) for g in self.subscribers.values()), "listening": self.listening,
                "cursor": self.cursor, **self.stats.__dict__}


def _event(row: dict[str, Any]) -> str:
    data = json.dumps(row_as_json(row), separators=(",", ":"))
    return f"id: {row['stream_seq']}\nevent: notification\ndata: {data}\n\n"


async def sse_stream(inbox: Inbox, user_id: str, after: int, closing: anyio.Event | None = None,
                     still_open: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
    """The stream of one client: what it missed after ``after``, then live rows, heartbeats;
    it returns as soon as ``closing`` is set (the server stops: see scheduler.web.http.sse).
    ``still_open`` (a stream opened by a session cookie) is asked before each live row and
    heartbeat: the stream of a session that has ended (signed out, ended, expired) stops."""
    closing = closing or anyio.Event()
    subscriber = await inbox.subscribe(user_id)  # first, so nothing committed from now on is missed
    closer: asyncio.Future[Any] = asyncio.ensure_future(closing.wait())
    getter: asyncio.Future[dict[str, Any]] | None = None
    try:
        yield f"retry: {RETRY_MS}\n: connected\n\n"
        last = after
        while not closing.is_set():  # the replay: everything after the client's last id, from the table
            rows = await run_in_threadpool(_replay, inbox.database, user_id, last, REPLAY_LIMIT)
            for row in rows:
                last = int(row["stream_seq"])
                yield _event(row)
            if len(rows) < REPLAY_LIMIT:
                break
        while not closing.is_set():
            if subscriber.dropped and subscriber.queue.empty():
                return  # too slow: end; the client reconnects with Last-Event-ID
            if getter is None:
                getter = asyncio.ensure_future(subscriber.queue.get())
            waiting: set[asyncio.Future[Any]] = {getter, closer}
            done, _ = await asyncio.wait(waiting, timeout=inbox.heartbeat_seconds,
                                         return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                if closer not in done:
                    if still_open is not None and not await still_open():
                        return
                    yield ": heartbeat\n\n"
                continue
            row, getter = getter.result(), None
            if still_open is not None and not await still_open():
                return
            if int(row["stream_seq"]) > last:  # the replay may already have sent it
                last = int(row["stream_seq"])
                yield _event(row)
    finally:
        for task in (getter, closer):
            if task is not None:
                task.cancel()
        inbox.unsubscribe(subscriber)


__all__ = ["CHANNEL", "STREAM_LOCK_KEY", "Inbox", "StreamPublisher", "sse_stream"]
