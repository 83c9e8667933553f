"""HTTP/1.1 on asyncio's own transports: the built-in channels' direct POSTs
(DEC-DELIVERY-HTTP, DELIV-18, DELIV-19).

One POST and the start of its answer (an ``outcome.HttpAnswer``) over a connection of one
event loop's pool, kept alive while the answer allows it; TLS is asyncio's (``ssl``), on the
client's context. ``http.DeliveryHttp`` sends here whenever no proxy applies and the URL
carries no credentials; aiohttp carries the others.

Why not aiohttp for every send: the worker's CPU per send is what a busy replica spends on
the same two cores that decide, and aiohttp's request and response machinery (a request
object, header multidicts, cookies, traces, timers, a stream reader) made a signed webhook
through ``http.post`` cost about 165 µs of CPU; on this, 101 to 106 µs, the HTTP about 60 of it
(5,000 POSTs 128 at a time to a receiver answering after 100 ms).

The answer is a stranger's bytes, parsed strictly here and only here: a status line
``HTTP/1.0`` or ``HTTP/1.1`` and three digits; header names that are tokens, values without
NUL, no folded lines, a head of at most ``HEAD_BYTES``; framing by ``Content-Length`` (one
value, digits) or ``Transfer-Encoding`` ending ``chunked`` (hexadecimal sizes), never both,
else to the end of the connection. Anything else is ``httpx.RemoteProtocolError`` (a
``Retry``), as a connection that fails is ``httpx.ConnectError``. At most ``cap`` bytes of a
body are read, as sent (never decoded); an answer not read to its end closes its connection,
as does ``Connection: close``, an HTTP/1.0 answer, a send cut short (a timeout) and bytes the
server sent past its answer.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Callable, Mapping
from typing import cast

import httpx
import yarl

from scheduler.delivery.outcome import HttpAnswer

HEAD_BYTES = 64 * 1024  # an answer's status line and headers, at most
MAX_HEADERS = 100
LINE_BYTES = 1024  # a chunk-size line, at most
MAX_INTERIM = 8  # 1xx answers skipped before the final one
PAUSE_BYTES = 256 * 1024  # more than this unread: the transport stops reading until asked again

_TOKEN_CHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"  # RFC 9110's tchar: a header's name
_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [\t\x20-\x7e\x80-\xff]*)?")
_TOKEN = re.compile(_TOKEN_CHARS.encode("ascii"))  # an answer's header name, as bytes
_HEADER_NAME = re.compile(_TOKEN_CHARS)  # a request's
_CHUNK = re.compile(rb"([0-9A-Fa-f]{1,15})(?:[ \t]*;[\t\x20-\x7e\x80-\xff]*)?")
_DIGITS = re.compile(r"[0-9]{1,18}")
_BAD_VALUE = re.compile(r"[\x00\r\n]")

Key = tuple[str, str, int]  # scheme, host, port


class _Connection(asyncio.Protocol):
    """One connection's bytes as they arrive, and a wake-up for the exchange reading them."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False  # the server closed its side, or the connection was lost
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > PAUSE_BYTES and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self) -> None:
        """Wait for more bytes (raising when none can come)."""
        if self.ended:
            raise httpx.RemoteProtocolError("the server closed the connection before its answer ended")
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self, n: int) -> bytes:
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    @property
    def reusable(self) -> bool:
        # a paused transport would not see the server's close while idle
        return (not self.ended and not self.buffer and not self._paused and self.transport is not None
                and not self.transport.is_closing())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def request_head(url: yarl.URL, headers: Mapping[str, str], length: int) -> bytes:
    """A POST's request line and headers for ``url`` (its path and query as given)."""
    lines = [f"POST {url.raw_path_qs or '/'} HTTP/1.1", f"host: {url.host_port_subcomponent}",
             f"content-length: {length}"]
    for name, value in headers.items():
        if _HEADER_NAME.fullmatch(name) is None or _BAD_VALUE.search(value) is not None:
            raise httpx.LocalProtocolError(f"a request header that HTTP cannot carry: {name[:100]!r}")
        lines.append(f"{name}: {value}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise httpx.LocalProtocolError("a request header that HTTP cannot carry: not Latin-1") from exc


async def _head(conn: _Connection) -> tuple[int, bool, list[tuple[str, str]]]:
    """The next answer head: its status, whether it is HTTP/1.1, its headers."""
    while True:
        end = conn.buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(conn.buffer) > HEAD_BYTES:
            raise httpx.RemoteProtocolError(f"an answer's head longer than {HEAD_BYTES} bytes")
        await conn.more()
    if end > HEAD_BYTES:
        raise httpx.RemoteProtocolError(f"an answer's head longer than {HEAD_BYTES} bytes")
    lines = conn.take(end + 4)[:end].split(b"\r\n")
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise httpx.RemoteProtocolError(f"an answer with more than {MAX_HEADERS} headers")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None or b"\n" in value or b"\r" in value or b"\x00" in value:
            raise httpx.RemoteProtocolError(f"a malformed answer header: {line[:100]!r}")
        headers.append((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")))
    return int(status.group(2)), status.group(1) == b"1", headers


def _values(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [v.strip() for n, value in headers if n == name for v in value.split(",") if v.strip()]


async def _body(conn: _Connection, status: int, headers: list[tuple[str, str]], cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of the answer's body, and whether all of it was read."""
    codings = [c.lower() for c in _values(headers, "transfer-encoding")]
    lengths = set(_values(headers, "content-length"))
    if status in (204, 304):
        return b"", True
    if codings:
        if lengths:
            raise httpx.RemoteProtocolError("an answer with both Transfer-Encoding and Content-Length")
        if codings[-1] == "chunked":
            return await _chunked(conn, cap)
        return await _to_end(conn, cap)
    if lengths:
        length = lengths.pop()
        if lengths or _DIGITS.fullmatch(length) is None:
            raise httpx.RemoteProtocolError("an answer's Content-Length is not one whole number")
        size = int(length)
        want = min(size, cap)
        while len(conn.buffer) < want:
            await conn.more()
        return conn.take(want), size <= cap
    return await _to_end(conn, cap)


async def _to_end(conn: _Connection, cap: int) -> tuple[bytes, bool]:
    """A body framed by the connection's end (never reused)."""
    while len(conn.buffer) < cap and not conn.ended:
        await conn.more()
    return conn.take(cap), False


async def _line(conn: _Connection) -> bytes:
    while True:
        end = conn.buffer.find(b"\r\n")
        if end >= 0:
            return conn.take(end + 2)[:end]
        if len(conn.buffer) > LINE_BYTES:
            raise httpx.RemoteProtocolError("a chunk-size line too long")
        await conn.more()


async def _chunked(conn: _Connection, cap: int) -> tuple[bytes, bool]:
    body = bytearray()
    while True:
        line = await _line(conn)
        size = _CHUNK.fullmatch(line)
        if size is None:
            raise httpx.RemoteProtocolError(f"a malformed chunk size: {line[:100]!r}")
        left = int(size.group(1), 16)
        if left == 0:
            trailers = 0
            while await _line(conn):  # the trailer fields, to the empty line
                trailers += 1
                if trailers > MAX_HEADERS:
                    raise httpx.RemoteProtocolError(f"an answer with more than {MAX_HEADERS} trailer fields")
            return bytes(body), True
        while left:
            if len(body) >= cap:
                return bytes(body), False  # the rest is never read: the connection goes
            if not conn.buffer:
                await conn.more()
            part = conn.take(min(left, cap - len(body)))
            body += part
            left -= len(part)
        while len(conn.buffer) < 2:
            await conn.more()
        if conn.take(2) != b"\r\n":
            raise httpx.RemoteProtocolError("a chunk not ended by CRLF")


def _header_map(headers: list[tuple[str, str]]) -> dict[str, str]:
    """The headers by name (a repeated header's values joined by commas)."""
    out: dict[str, str] = {}
    for name, value in headers:
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


async def read_answer(conn: _Connection, cap: int) -> tuple[HttpAnswer, bool]:
    """The final answer on ``conn`` (interim 1xx answers skipped) and whether the connection
    may carry the next request."""
    for _ in range(MAX_INTERIM + 1):
        status, http11, headers = await _head(conn)
        if status == 101:
            raise httpx.RemoteProtocolError("an answer switching protocols, never asked for")
        if not 100 <= status <= 199:
            break
    else:
        raise httpx.RemoteProtocolError(f"more than {MAX_INTERIM} interim answers")
    body, whole = await _body(conn, status, headers, cap)
    close = "close" in (c.lower() for c in _values(headers, "connection"))
    return HttpAnswer(status, _header_map(headers), body), whole and http11 and not close and conn.reusable


class WirePool:
    """One event loop's connections: at most ``limit`` open, a send waiting for a free one;
    idle ones kept for their host."""

    def __init__(self, limit: int, tls: Callable[[], ssl.SSLContext]) -> None:
        self.limit = limit
        self._tls = tls  # the client's TLS context, made on the first HTTPS connection
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[Key, list[_Connection]] = {}
        self._idle_count = 0
        self._active = 0  # sends holding a slot: in an exchange, or opening its connection
        self._closed = False

    def _take(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        found = None
        while idle and found is None:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.reusable:
                found = conn
            else:
                conn.close()
        if idle is not None and not idle:
            del self._idle[key]  # a host no longer sent to leaves nothing behind
        return found

    def _give_back(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()  # the pool was closed while this send was in flight
            return
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1

    def _make_room(self) -> None:
        """Close an idle connection (another host's) when opening one would pass the limit: the
        sends holding a slot, this one included, and the idle connections are every connection
        open or opening."""
        if self._idle_count + self._active <= self.limit:
            return
        for key, idle in self._idle.items():
            idle.pop(0).close()
            self._idle_count -= 1
            if not idle:
                del self._idle[key]
            return

    async def _open(self, key: Key) -> _Connection:
        scheme, host, port = key
        self._make_room()
        tls = self._tls() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            # a name's trailing dot (a fully qualified name) is no part of its certificate's
            _, conn = await loop.create_connection(lambda: _Connection(key), host, port, ssl=tls,
                                                   server_hostname=host.rstrip(".") if tls is not None else None)
        except OSError as exc:  # refused, unreachable, no such host, a TLS handshake that failed
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return conn

    async def post(self, url: yarl.URL, content: bytes, headers: Mapping[str, str], cap: int) -> HttpAnswer:
        """POST ``content`` to ``url``; the final answer with at most ``cap`` bytes of its body."""
        host, port = url.raw_host, url.port
        if not host or port is None or url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"not an http or https URL with a host: {str(url)[:200]!r}")
        head = request_head(url, headers, len(content))
        key = (url.scheme, host, port)
        async with self._slots:
            self._active += 1  # counted before it opens: the limit holds for connections opening too
            conn: _Connection | None = None
            keep = False
            try:
                conn = self._take(key) or await self._open(key)
                assert conn.transport is not None
                conn.transport.write(head + content)
                answer, keep = await read_answer(conn, cap)
            finally:
                self._active -= 1
                # an answer not read to its end, a send cut short: the connection goes with it
                if conn is not None and keep:
                    self._give_back(conn)
                elif conn is not None:
                    conn.close()
        return answer

    def close(self) -> None:
        """Close every idle connection; a send still in flight closes its own when it ends."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        self._idle_count = 0
