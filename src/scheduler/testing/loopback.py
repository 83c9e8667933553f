"""A small HTTP/1.1 server on 127.0.0.1 for the fakes (``push_service``, ``webhook_receiver``).

One request per connection (it answers ``Connection: close``), or with ``keep_alive`` as many
as the client sends on it (a provider's usual way: the connection is closed after a request
that asks ``Connection: close``, or after ``READ_SECONDS`` without one). A body only with
``Content-Length`` (at most ``max_body`` bytes), every read bounded by ``READ_SECONDS``. A
handler answers a ``Reply``, or ``HANG``: the connection is then held open, unanswered, until
the server stops (a provider that never answers). Leaving the ``async with`` closes every
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Final, Self

READ_SECONDS = 10.0
STOP_SECONDS = 5.0


@dataclass(frozen=True)
class Request:
    """What a client sent: method, target (path and query), headers (lower-case names) and body."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    """An answer: a status, its headers, a body."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def of(cls, status: int, body: bytes | str = b"", *, retry_after: str | None = None,
           headers: Mapping[str, str] | None = None) -> Reply:
        extra = dict(headers or {})
        if retry_after is not None:
            extra["Retry-After"] = retry_after
        return cls(status, tuple(extra.items()), body.encode() if isinstance(body, str) else body)


class _Hang:
    def __repr__(self) -> str:
        return "HANG"


HANG: Final = _Hang()
Answer = Reply | _Hang
Handler = Callable[[Request], Awaitable[Answer]]


class LoopbackServer:
    """Serves ``handler`` on 127.0.0.1 at a free port while entered."""

    def __init__(self, handler: Handler, *, max_body: int = 64 * 1024, keep_alive: bool = False) -> None:
        self._handler = handler
        self._max_body = max_body
        self._keep_alive = keep_alive
        self._server: asyncio.Server | None = None
        self._stopping = asyncio.Event()
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0
        self.accepted = 0  # the connections accepted so far

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the server runs only inside its async with")
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> LoopbackServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=STOP_SECONDS)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), STOP_SECONDS)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.accepted += 1
        try:
            await self._serve(reader, writer)
        except (asyncio.CancelledError, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), STOP_SECONDS)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                # asyncio's timeout, not wait_for: no task of its own per request (a provider
                # stand-in's CPU is the benchmark machine's, shared with what it measures)
                async with asyncio.timeout(READ_SECONDS):
                    request = await self._read(reader)
            except _Refused as refused:
                await self._write(writer, Reply.of(refused.status, refused.reason), close=True)
                return
            answer = await self._handler(request)
            if isinstance(answer, _Hang):
                await self._stopping.wait()  # bounded: __aexit__ sets it, then cancels this task
                return
            close = not self._keep_alive or "close" in request.headers.get("connection", "").lower()
            await self._write(writer, answer, close=close)
            if close:
                return

    async def _read(self, reader: asyncio.StreamReader) -> Request:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _Refused(431, "request head too large") from None
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(400, "not an HTTP/1.x request line")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise _Refused(400, "malformed header line")
            key = name.lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        if "transfer-encoding" in headers:
            raise _Refused(501, "send a Content-Length, not a Transfer-Encoding")
        length_text = headers.get("content-length", "0")
        if not length_text.isascii() or not length_text.isdigit() or len(length_text) > 9:
            raise _Refused(400, "malformed Content-Length")
        length = int(length_text)
        if length > self._max_body:
            raise _Refused(413, f"a body of at most {self._max_body} bytes")
        body = await reader.readexactly(length)
        return Request(parts[0], parts[1], headers, body)

    async def _write(self, writer: asyncio.StreamWriter, reply: Reply, *, close: bool) -> None:
        try:
            phrase = HTTPStatus(reply.status).phrase
        except ValueError:
            phrase = "Unknown"
        lines = [f"HTTP/1.1 {reply.status} {phrase}", f"Content-Length: {len(reply.body)}"]
        lines += ["Connection: close"] if close else []
        lines += [f"{name}: {value}" for name, value in reply.headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body)
        async with asyncio.timeout(READ_SECONDS):
            await writer.drain()


class LoopbackFake:
    """A fake that serves on a ``LoopbackServer`` of its own while entered (``async with``):
    the push service's and the webhook receiver's shared shape; each answers in ``_handle``."""

    def __init__(self) -> None:
        self._server = LoopbackServer(self._handle)

    async def _handle(self, request: Request) -> Answer:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self._server.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._server.__aexit__(kind, exc, tb)


@dataclass
class Script:
    """The answers a fake is told to give, in order; once they are used up, ``default``."""

    default: Reply
    queued: list[Answer] = field(default_factory=list)

    def push(self, *answers: Answer) -> None:
        self.queued.extend(answers)

    def next(self) -> Answer:
        return self.queued.pop(0) if self.queued else self.default


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
