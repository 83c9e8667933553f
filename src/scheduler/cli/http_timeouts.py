"""How long ``scheduler serve`` waits for a request's headers and for its body (SEC-20.1, SEC-20.2).

uvicorn bounds only the silence between two requests of a kept-alive connection
(``timeout_keep_alive``); nothing bounds a request that is still arriving: a client that opens
a connection and sends half a header line, or a body that stops after ten of its thousand
bytes, holds its socket (and, for the body, a task of the app waiting in ``receive()``) for as
long as it likes. ``bounded_h11_protocol`` is uvicorn's h11 protocol with two deadlines, each
armed once per request, so trickling a byte at a time does not push them back:

- the headers (``SCHEDULER_REQUEST_HEADER_TIMEOUT_SECONDS``): from the connection's opening, or
  from the first byte of a later request on it, until the request line and headers are in.
  Past it, a connection that had sent part of a request is answered ``408 Request Timeout``
  and closed; one that sent nothing is closed.
- the body (``SCHEDULER_REQUEST_BODY_TIMEOUT_SECONDS``): from the headers until the body's
  last byte, whether or not the app reads it. Past it, a request not yet answered gets a 408
  and the connection is closed (the app's ``receive()`` then says the client is gone: SEC-21);
  one already answered (an early 401 or 413 whose body still trickles in) is closed.

Only ``scheduler serve`` runs this protocol (``uvicorn_options``). A host serving the app with
its own server, and a proxy in front of either, bound the same times there (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from scheduler.config import Settings

logger = logging.getLogger("scheduler.serve")

_REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers and on its body.

    ``bounded_h11_protocol`` makes the subclass that carries the two bounds (uvicorn builds a
    protocol from its config alone); this class holds only the behaviour."""

    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "headers" or "body": what the armed deadline bounds

    # -- uvicorn's protocol, with the deadlines kept up to date ---------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        # Every parse runs here (new bytes, or a pipelined request after a response): the
        # request's state afterwards says which deadline, if any, applies now.
        super().handle_events()
        self._follow_request()

    # -- the deadlines ---------------------------------------------------------------------

    def _follow_request(self) -> None:
        if self.transport is None or self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            # Between requests uvicorn's keep-alive timeout applies, until bytes of the next one
            # arrive. Where it is not armed (a body that ended after an early answer), the
            # header deadline bounds the wait for the next request instead.
            if not self.conn.trailing_data[0] and self.timeout_keep_alive_task is not None:
                self._disarm()
            elif self._phase != "headers":
                self._arm("headers")
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body")
        else:
            self._disarm()  # the whole request is in (DONE), or the connection is ending

    def _arm(self, phase: str) -> None:
        self._disarm()
        seconds = self.header_timeout_seconds if phase == "headers" else self.body_timeout_seconds
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = None

    def _expired(self, phase: str) -> None:
        self._deadline = None
        self._phase = None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        if phase == "headers":
            if self.conn.their_state is not h11.IDLE:
                return  # the headers arrived as the deadline fell (it is re-armed for the body)
            if self.conn.trailing_data[0]:
                logger.info("closed the connection of %s: its request's headers did not arrive within %gs (408)",
                            client, self.header_timeout_seconds)
                self._write_408(f"the request's headers did not arrive within {self.header_timeout_seconds:g} s")
            else:
                logger.debug("closed the connection of %s: no request within %gs", client, self.header_timeout_seconds)
        else:
            if self.conn.their_state is not h11.SEND_BODY:
                return
            answered = self.cycle is None or self.cycle.response_started
            logger.info("closed the connection of %s: the body of %s %s did not arrive within %gs%s", client,
                        self.scope["method"], self.scope["path"], self.body_timeout_seconds,
                        "" if answered else " (408)")
            if not answered:
                self._answer_408(f"the request's body did not arrive within {self.body_timeout_seconds:g} s")
        self.transport.close()

    def _write_408(self, reason: str) -> None:
        """A 408 before any request was parsed: h11 has no request to answer, so its bytes are written as they are."""
        text = reason.encode("ascii")
        self.transport.write(_REQUEST_TIMEOUT % (len(text), text))

    def _answer_408(self, reason: str) -> None:
        """A 408 for the request whose body is late, through h11; the app's ``receive()``
        then hears that the client is gone, and whatever it sends after is dropped."""
        cycle = self.cycle
        text = reason.encode("ascii")
        try:
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                       (b"content-length", str(len(text)).encode())]
            output = self.conn.send(h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"))
            output = (output or b"") + (self.conn.send(h11.Data(data=text)) or b"")
            output += self.conn.send(h11.EndOfMessage()) or b""
            self.transport.write(output)
        except h11.LocalProtocolError:
            pass  # h11 will not send it in this state: the connection is closed without it
        cycle.response_started = cycle.response_complete = True
        cycle.disconnected = True
        cycle.message_event.set()


def bounded_h11_protocol(settings: Settings) -> type[BoundedH11Protocol]:
    """The protocol class ``scheduler serve`` gives uvicorn, with ``settings``' two bounds."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {
        "header_timeout_seconds": settings.request_header_timeout_seconds,
        "body_timeout_seconds": settings.request_body_timeout_seconds,
    })


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """What ``scheduler serve`` adds to uvicorn's config for these bounds."""
    return {"http": bounded_h11_protocol(settings)}
