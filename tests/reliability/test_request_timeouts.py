"""SEC-20.1, SEC-20.2: ``scheduler serve`` bounds how long a request's headers and its body may
take, against a real ``scheduler serve`` process on loopback, with real sockets.

The bounds are configured short (a second and a half) so that the test waits for seconds;
every wait is on a socket with its own deadline (the server's answer or its closing), never a
fixed sleep. The lower bounds asserted (not before the bound) say that the deadline is the
configured one, not that the machine is fast.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from reliability.cluster import ROOT, free_port, wait_for
from sqlalchemy import Engine

from tests.conftest import TEST_SECRET, token
from tests.helpers import event_body, rows

HEADER_BOUND = 1.5
BODY_BOUND = 1.5
# How long past its bound a socket may stay open before the test fails: a loaded two-core
# machine answers late, never this late.
GRACE = 20.0


@dataclass(frozen=True)
class Served:
    port: int
    log: Path

    def connect(self) -> socket.socket:
        """A connection whose every read fails the test after GRACE seconds."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=GRACE)


@pytest.fixture
def served(database_url: str, tmp_path: Path) -> Iterator[Served]:
    """``scheduler serve`` on a free port of 127.0.0.1, on this test's database, with short bounds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
    env.update({"DATABASE_URL": database_url, "SCHEDULER_JWT_SECRET": TEST_SECRET, "PYTHONPATH": str(ROOT),
                "SCHEDULER_DATA_DIR": str(tmp_path / "data"), "SCHEDULER_ENABLED": "false",
                "SCHEDULER_REQUEST_HEADER_TIMEOUT_SECONDS": str(HEADER_BOUND),
                "SCHEDULER_REQUEST_BODY_TIMEOUT_SECONDS": str(BODY_BOUND)})
    log_path = tmp_path / "serve.log"
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "scheduler", "serve", "--port", str(port)],
                                   env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_for(lambda: "listening on" in log_path.read_text() or process.poll() is not None, 120,
                 "serve to say it is listening")
        assert process.poll() is None, log_path.read_text()
        yield Served(port, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _answer(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed
    (seconds since the call); the socket's own timeout is the deadline."""
    started = time.monotonic()
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic() - started


def _request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _still_open(sock: socket.socket) -> bool:
    """True when the peer has not closed ``sock`` (nothing to read yet, or data but no end)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return True
    return sock.recv(65536, socket.MSG_PEEK) != b""


@pytest.mark.clause("SEC-20.1")
def test_half_sent_headers_are_answered_408_and_closed_at_the_header_bound(served: Served) -> None:
    """SEC-20.1: fifty connections that each send half a request's headers and then nothing are
    all answered 408 and closed once the header bound has passed (and not before it)."""
    socks = [served.connect() for _ in range(50)]
    sent = time.monotonic()
    for sock in socks:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
    for sock in socks:
        answer, _ = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
        assert b"connection: close" in answer.lower()
        sock.close()
    elapsed = time.monotonic() - sent
    assert HEADER_BOUND * 0.9 <= elapsed < HEADER_BOUND + GRACE, elapsed


@pytest.mark.clause("SEC-20.1")
def test_headers_trickled_a_byte_at_a_time_do_not_push_the_header_bound_back(served: Served) -> None:
    """SEC-20.1: the deadline is armed once, at the request's first byte: a client that sends
    one more byte whenever the connection has been quiet for a fifth of a second is still cut
    off at the header bound, long before its headers would have ended."""
    request = _request("GET", "/health", {"X-Slow": "x" * 200})
    with served.connect() as sock:
        started = time.monotonic()
        for byte in request:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable:
                break  # the server answered (or closed): the deadline fell
            sock.sendall(bytes([byte]))
        answer, _ = _answer(sock)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
    assert HEADER_BOUND * 0.9 <= elapsed < HEADER_BOUND + GRACE, elapsed


@pytest.mark.clause("SEC-20.1")
def test_a_connection_that_sends_nothing_is_closed_at_the_header_bound(served: Served) -> None:
    """SEC-20.1: a connection opened and left silent is closed (with no answer: there is no
    request to answer) once the header bound has passed."""
    with served.connect() as sock:
        answer, elapsed = _answer(sock)
    assert answer == b""
    assert HEADER_BOUND * 0.9 <= elapsed < HEADER_BOUND + GRACE, elapsed


@pytest.mark.clause("SEC-20.2")
def test_a_body_that_stalls_is_answered_408_at_the_body_bound_and_nothing_is_stored(
    served: Served, engine: Engine,
) -> None:
    """SEC-20.2: a POST whose body stops after 10 of its 1,000 bytes, with a valid token, is
    answered 408 and its connection closed once the body bound has passed; nothing is stored,
    and the service goes on answering."""
    headers = {"Authorization": f"Bearer {token('nudging.ingest')}", "Content-Type": "application/json",
               "Content-Length": "1000"}
    with served.connect() as sock:
        sock.sendall(_request("POST", "/admin/scheduled-events", headers, b'{"event_ty'))
        answer, elapsed = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"body did not arrive within" in answer
    assert BODY_BOUND * 0.9 <= elapsed < BODY_BOUND + GRACE, elapsed
    assert rows(engine, "SELECT id FROM scheduled_events") == []
    with served.connect() as sock:
        sock.sendall(_request("GET", "/health", {"Connection": "close"}))
        assert _answer(sock)[0].startswith(b"HTTP/1.1 200 OK")
    log = served.log.read_text()
    assert "did not arrive within" in log and "Traceback" not in log and "ERROR" not in log, log


@pytest.mark.clause("SEC-20.2")
def test_a_body_still_trickling_after_an_early_answer_is_closed_at_the_body_bound(served: Served) -> None:
    """SEC-20.2: a request refused before its body is read (no token: 401) whose client keeps
    sending its body a byte at a time is closed at the body bound, whatever the app read."""
    headers = {"Content-Type": "application/json", "Content-Length": "1000"}
    with served.connect() as sock:
        sock.sendall(_request("POST", "/admin/scheduled-events", headers, b"{"))
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < BODY_BOUND + GRACE:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable and sock.recv(65536, socket.MSG_PEEK) == b"":
                closed = True
                break
            if readable:
                sock.recv(65536)  # the 401 itself
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        elapsed = time.monotonic() - started
    assert closed and BODY_BOUND * 0.9 <= elapsed < BODY_BOUND + GRACE, elapsed


@pytest.mark.clause("SEC-20.1")
def test_a_connection_left_idle_after_an_early_answer_and_its_body_is_closed(served: Served) -> None:
    """SEC-20.1: a request answered before its body was read (401), whose body then arrives in
    full, leaves its connection waiting for a next request that never comes: uvicorn's
    keep-alive timer is not armed there, and the header bound closes it (with no answer)."""
    headers = {"Content-Type": "application/json", "Content-Length": "10"}
    with served.connect() as sock:
        sock.sendall(_request("POST", "/admin/scheduled-events", headers, b"{"))
        answer = b""
        while b"missing bearer token" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 401"), answer
        sock.sendall(b'"a": 123}')  # the body's 9 other bytes: the request is whole
        rest, elapsed = _answer(sock)
    assert rest == b""
    assert HEADER_BOUND * 0.9 <= elapsed < HEADER_BOUND + GRACE, elapsed


@pytest.mark.clause("SEC-20.1")
@pytest.mark.clause("SEC-20.2")
def test_a_prompt_request_and_an_open_stream_are_never_cut_by_the_bounds(served: Served) -> None:
    """SEC-20.1, SEC-20.2: the control: a complete POST is stored (201), and a participant's
    event stream (a GET whose request is whole at once) stays open after both bounds have
    passed, while a half-sent request beside it is cut off."""
    stream = served.connect()
    try:
        participant = {"Authorization": f"Bearer {token(None, subject='participant-1')}",
                       "Accept": "text/event-stream"}
        stream.sendall(_request("GET", "/me/notifications/stream", participant))
        first = stream.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK"), first
        body = json.dumps(event_body()).encode()
        with served.connect() as sock:
            sock.sendall(_request("POST", "/admin/scheduled-events", {
                "Authorization": f"Bearer {token('nudging.ingest')}", "Content-Type": "application/json",
                "Content-Length": str(len(body)), "Connection": "close"}, body))
            assert _answer(sock)[0].startswith(b"HTTP/1.1 201 Created")
        with served.connect() as half:  # takes the header bound, then the body bound's time too
            half.sendall(b"POST /admin/scheduled-events HTTP/1.1\r\n")
            assert _answer(half)[0].startswith(b"HTTP/1.1 408")
        with served.connect() as stalled:
            stalled.sendall(_request("POST", "/admin/scheduled-events", {
                "Authorization": f"Bearer {token('nudging.ingest')}", "Content-Length": "10"}, b"{"))
            assert _answer(stalled)[0].startswith(b"HTTP/1.1 408")
        assert _still_open(stream), "the stream was closed by a request bound"
    finally:
        stream.close()
