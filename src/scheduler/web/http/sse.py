"""Server-sent event streams that end at once when the server stops.

A stream never ends by itself, so a server that stops waits for it: uvicorn waits its
graceful-shutdown timeout (10 s in ``scheduler serve``), then cancels the stream's task,
which logs an ERROR with a ``CancelledError`` traceback, on every deploy of a replica with
a participant connected. Here every open stream has a ``closing`` event; when the server
begins to stop, the events are set, each stream sends a ``retry:`` hint and a comment and
returns, and the response completes normally. The client reconnects (to another replica,
behind a load balancer) with ``Last-Event-ID`` and the replay sends what it missed.

The response is sse-starlette's ``EventSourceResponse`` (decision DEC-SSE): it watches for
the client's disconnect, answers ``HEAD`` without opening the stream, and detects uvicorn's
shutdown by itself, which covers an app embedded in a uvicorn we do not start (it checks
every half second, then sets the same ``closing`` event). ``scheduler serve`` does not wait
for that check: its server calls ``Streams.close_all`` from the signal handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import anyio
from sse_starlette import EventSourceResponse

RETRY_MS = 1000
# What a stream sends last when the server stops: reconnect in a second (to any replica).
CLOSING = f"retry: {RETRY_MS}\n: server stopping; reconnect with Last-Event-ID\n\n"
# How long sse-starlette lets a stream finish after it detected the shutdown itself.
GRACE_SECONDS = 1.0

StreamBody = Callable[[anyio.Event], AsyncIterator[str]]


class Streams:
    """The open streams of one service, and the switch that ends them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[tuple[asyncio.AbstractEventLoop, anyio.Event]] = set()
        self.closing = False
        self.opened = 0
        self.closed_by_shutdown = 0

    @contextlib.contextmanager
    def track(self, closing: anyio.Event) -> Iterator[anyio.Event]:
        """Register an open stream's ``closing`` event for as long as the stream runs."""
        entry = (asyncio.get_running_loop(), closing)
        with self._lock:
            self._open.add(entry)
            self.opened += 1
            if self.closing:
                closing.set()  # the server is already stopping: end at once
        try:
            yield closing
        finally:
            with self._lock:
                self._open.discard(entry)

    def close_all(self) -> int:
        """End every open stream (and any opened from now on); safe from a signal handler
        or another thread. Returns how many were open."""
        with self._lock:
            self.closing = True
            entries = list(self._open)
        for loop, event in entries:
            with contextlib.suppress(RuntimeError):  # that loop has closed meanwhile
                loop.call_soon_threadsafe(event.set)
        self.closed_by_shutdown += len(entries)
        return len(entries)

    def reopen(self) -> None:
        """The service starts again (a restarted server in the same process)."""
        with self._lock:
            self.closing = False

    @property
    def open_count(self) -> int:
        return len(self._open)

    def response(self, body: StreamBody, headers: Mapping[str, str] | None = None) -> EventSourceResponse:
        """An SSE response running ``body(closing)``: ``body`` yields the stream's text
        and returns soon after ``closing`` is set; ``CLOSING`` then ends the stream."""
        closing = anyio.Event()

        async def chunks() -> AsyncIterator[bytes]:
            with self.track(closing):
                async for text in body(closing):
                    yield text.encode()
                if closing.is_set():
                    yield CLOSING.encode()

        # ping=0: the bodies send their own heartbeat comments when idle.
        return EventSourceResponse(chunks(), headers=dict(headers or {}), ping=0,
                                   shutdown_event=closing, shutdown_grace_period=GRACE_SECONDS)


async def wait_or_close(closing: anyio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``closing`` is set first; True when it is."""
    with anyio.move_on_after(seconds):
        await closing.wait()
    return closing.is_set()


__all__ = ["CLOSING", "RETRY_MS", "Streams", "wait_or_close"]
