"""The delivery benchmark's provider: answers every POST ``204`` after a fixed latency, and
records when it first answered each ``webhook-id``.

It stands for a push provider on another machine, yet runs on the measured one: every
microsecond of CPU it spends is taken from the system being measured, and most from the one
that is CPU-bound. So it is an ``asyncio.Protocol`` with a timer per request, no task, no
stream and no future (``scheduler.testing.loopback``'s server, built for the tests' fakes,
spends about three times as much per request). HTTP/1.1 with keep-alive, one request at a
time per connection (a request pipelined behind another waits for its answer); a body only
with ``Content-Length``; anything else is answered ``400`` and the connection closed.

``GET /count?prefix=`` answers how many keys with that prefix it answered (what a waiting
driver asks, four times a second); ``GET /stats`` its whole record (read once, at the end).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024


@dataclass
class Record:
    """What the provider answered: each key's first 2xx (epoch seconds), and the POSTs received."""

    first: dict[str, float] = field(default_factory=dict)
    requests: int = 0

    def answer_get(self, target: str) -> bytes:
        """The JSON body of a ``GET``: ``/count?prefix=`` or, for any other path, the whole record."""
        parts = urlsplit(target)
        if parts.path == "/count":
            prefix = parse_qs(parts.query).get("prefix", [""])[0]
            seen = sum(1 for key in self.first if key.startswith(prefix))
            return json.dumps({"seen": seen, "requests": self.requests}).encode()
        return json.dumps({"first": self.first, "requests": self.requests}).encode()


class _Malformed(Exception):
    pass


class ProviderProtocol(asyncio.Protocol):
    """One connection: reads a request, answers it (a POST after ``latency`` seconds), then the next."""

    def __init__(self, record: Record, latency: float) -> None:
        self._record = record
        self._latency = latency
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False  # a request read and not yet answered
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def _next(self) -> None:
        """Take the next whole request from the buffer, if there is one, and start answering it."""
        try:
            request = self._request()
        except _Malformed as why:
            self._answer(400, str(why).encode(), close=True)
            return
        if request is None:
            return
        method, target, key, close = request
        self._busy = True
        if method == "GET":
            self._answer(200, self._record.answer_get(target), close=close)
            return
        self._record.requests += 1
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._latency, self._answer_post, key, close)

    def _request(self) -> tuple[str, str, str, bool] | None:
        """(method, target, webhook-id, close after it) of a whole request at the buffer's start,
        removed from it; None while it is not all here."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise _Malformed("request head too large")
            return None
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Malformed("not an HTTP/1.x request line")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise _Malformed("malformed header line")
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise _Malformed("send a Content-Length, not a Transfer-Encoding")
        length_text = headers.get("content-length", "0")
        if not length_text.isascii() or not length_text.isdigit() or int(length_text) > MAX_BODY:
            raise _Malformed("malformed or too large Content-Length")
        whole = end + 4 + int(length_text)
        if len(self._buffer) < whole:
            return None
        del self._buffer[:whole]
        close = parts[2] == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        return parts[0], parts[1], headers.get("webhook-id", ""), close

    def _answer_post(self, key: str, close: bool) -> None:
        self._timer = None
        self._record.first.setdefault(key, time.time())
        self._answer(204, b"", close=close)

    def _answer(self, status: int, body: bytes, *, close: bool) -> None:
        transport = self._transport
        if transport is None:
            return
        phrase = {200: "OK", 204: "No Content", 400: "Bad Request"}[status]
        head = f"HTTP/1.1 {status} {phrase}\r\nContent-Length: {len(body)}\r\n"
        if close:
            head += "Connection: close\r\n"
        transport.write(head.encode("latin-1") + b"\r\n" + body)
        self._busy = False
        if close:
            transport.close()
        elif self._buffer:
            self._next()


async def serve(record: Record, latency: float) -> asyncio.Server:
    """A provider on 127.0.0.1 at a free port (its ``sockets[0]``), answering POSTs after ``latency``."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ProviderProtocol(record, latency), "127.0.0.1", 0)
