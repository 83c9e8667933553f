"""One POST of a channel (DELIV-6): the per-send timeout bounds the whole exchange (connect,
write, the answer's head and the part of its body that is read), redirects are never
followed, and at most ``ANSWER_BYTES`` of the answer are read, as sent (``Accept-Encoding:
identity``, never decompressed), whatever the provider sends.
The answer, or the exception, is classified by ``outcome.classify``: this never raises for a
failed send."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import Callable, Mapping
from typing import Self, TypeVar

import aiohttp
import httpx
import yarl

from scheduler.delivery.outcome import HttpAnswer, classify
from scheduler.delivery.wire import WirePool
from scheduler.types import Clock, Retry, SendResult

ANSWER_BYTES = 4096
T = TypeVar("T")


class DeliveryHttp:
    """The built-in channels' HTTP client in production (DEC-DELIVERY-HTTP): a direct send on
    the scheduler's own HTTP/1.1 connections (``delivery.wire``), a send through a proxy or to
    a URL with credentials on an aiohttp session.

    Why not httpx, which the channels also take (a test's ``MockTransport``, the local push
    service's transport): a send's CPU time is what a busy worker spends, and httpcore's pool
    looks at every one of its connections on every request (a system call each), so at 128
    sends at once httpx spends about 1.1 ms of CPU a request where aiohttp spends 0.17 ms, and
    ``wire`` 0.06 ms.

    One pool and one session per event loop (a service's loop; each ``asyncio.run`` of a test),
    made on the loop's first request, each with at most ``connections`` connections, kept
    alive. The environment's proxies apply: ``HTTP_PROXY`` and ``HTTPS_PROXY`` read once, when
    the client is made, and ``NO_PROXY`` asked of each send's host only when there is a proxy
    (aiohttp's ``trust_env`` would read them all, and ``~/.netrc``, on every request). Nothing
    is decompressed, no redirect is followed, and aiohttp's errors are raised as httpx's, so
    the classification (``outcome.classify_error``) is one for both clients. ``ssl_context``
    replaces the system's trust store for HTTPS (a test's own authority)."""

    def __init__(self, connections: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
        if connections < 1:
            raise ValueError(f"at least one connection, got {connections}")
        self.connections = connections
        self._ssl = ssl_context  # the system's trust store when None: made once, on first use
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._pools: dict[asyncio.AbstractEventLoop, WirePool] = {}
        self._proxies = urllib.request.getproxies_environment()

    def __repr__(self) -> str:
        return f"DeliveryHttp(connections={self.connections})"

    def _tls(self) -> ssl.SSLContext:
        """The one TLS context of every pool and session (loading a trust store costs tens of ms)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _session(self) -> aiohttp.ClientSession:
        """This event loop's aiohttp session (a proxied send's, or one with credentials)."""
        return _of_this_loop(self._sessions, lambda: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.connections, limit_per_host=0, ssl=self._tls()),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)), usable=lambda s: not s.closed)

    def pool(self) -> WirePool:
        """This event loop's own connections (made on its first direct send)."""
        return _of_this_loop(self._pools, lambda: WirePool(self.connections, self._tls))

    def _proxy(self, url: yarl.URL) -> str | None:
        """The environment's proxy for ``url`` (None: none, or ``NO_PROXY`` names its host)."""
        if not self._proxies or (url.host is not None and urllib.request.proxy_bypass(url.host)):
            return None
        return self._proxies.get(url.scheme)

    async def exchange(self, url: str, content: bytes, headers: Mapping[str, str]) -> HttpAnswer:
        """One POST of ``content`` and the start of its answer (at most ``ANSWER_BYTES``)."""
        try:
            target = yarl.URL(url)
            if target.scheme not in ("http", "https") or not target.host:
                raise httpx.UnsupportedProtocol(f"not an http or https URL: {url[:200]!r}")
            proxy = self._proxy(target)
            if proxy is None and target.user is None and target.password is None:
                return await self.pool().post(target, content, {**WIRE_HEADERS, **headers}, ANSWER_BYTES)
            answer = await self._session().post(target, data=content, headers={**IDENTITY, **headers},
                                                allow_redirects=False, proxy=proxy)
        except (ValueError, aiohttp.InvalidURL) as exc:
            raise httpx.InvalidURL(str(exc)) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        except aiohttp.ClientError as exc:  # the server hung up, a malformed answer
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
        try:
            body = b""
            while len(body) < ANSWER_BYTES:
                chunk = await answer.content.read(ANSWER_BYTES - len(body))
                if not chunk:
                    break
                body += chunk
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
        finally:
            if answer.content.at_eof():
                answer.release()  # the connection goes back to the pool
            else:
                answer.close()  # the rest is never read: the connection cannot be used again
        return HttpAnswer(status=answer.status, headers=answer.headers, body=body)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every session and pool of this loop (another loop's closed with that loop)."""
        sessions, self._sessions = self._sessions, {}
        pools, self._pools = self._pools, {}
        loop = asyncio.get_running_loop()
        for owner, pool in pools.items():
            if owner is loop:
                pool.close()
        for owner, session in sessions.items():
            if owner is loop:
                await session.close()


def _of_this_loop(made: dict[asyncio.AbstractEventLoop, T], make: Callable[[], T],
                  usable: Callable[[T], bool] = lambda _: True) -> T:
    """The running loop's entry of ``made``, made now if it has none (or none ``usable``); the
    entries of loops that ended are dropped (an ended ``asyncio.run``: its sockets closed with it)."""
    loop = asyncio.get_running_loop()
    found = made.get(loop)
    if found is None or not usable(found):
        for ended in [other for other in made if other.is_closed()]:
            del made[ended]
        found = made[loop] = make()
    return found


HttpClient = DeliveryHttp | httpx.AsyncClient  # what a channel sends with
IDENTITY = {"accept-encoding": "identity"}
# a direct send's own headers: what aiohttp sends of its own, and IDENTITY (the channels' follow)
WIRE_HEADERS = {"accept": "*/*", **IDENTITY, "user-agent": "scheduler"}


async def post(client: HttpClient, url: str, *, content: bytes, headers: Mapping[str, str],
               timeout: float, clock: Clock, retry_after_cap: float, push: bool = False) -> SendResult:
    """POST ``content`` to ``url`` and classify what came back (``push``: 404/410 are ``Gone``)."""
    try:
        # asyncio's own timeout: anyio's cancel scope costs a tenth of a busy worker's time
        async with asyncio.timeout(timeout):
            if isinstance(client, DeliveryHttp):
                answer = await client.exchange(url, content, headers)
            else:
                answer = await _exchange(client, url, content, headers, timeout)
    except TimeoutError:
        return Retry(reason=f"timeout: no answer within {timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - a failed send is a result, never an error of the caller's
        return classify(exc, now=clock.now(), retry_after_cap=retry_after_cap, push=push)
    return classify(answer, now=clock.now(), retry_after_cap=retry_after_cap, push=push)


async def _exchange(client: httpx.AsyncClient, url: str, content: bytes, headers: Mapping[str, str],
                    timeout: float) -> HttpAnswer:
    request = client.build_request("POST", url, content=content, headers={**IDENTITY, **headers},
                                   timeout=httpx.Timeout(timeout))
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        body = b""
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) >= ANSWER_BYTES:
                break
    finally:
        await response.aclose()
    return HttpAnswer(status=response.status_code, headers=response.headers, body=body[:ANSWER_BYTES])
