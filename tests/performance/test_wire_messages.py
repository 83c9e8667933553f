"""PERF-8: a poll's round trips counted on the wire, as messages, not as statements.

The statement tests (PERF-2) count what SQLAlchemy's listeners hear; ``database.pipeline``
tells the listeners of each statement even when it falls back to sending them one by one
(another driver, or a psycopg without the pieces it uses). Only the wire shows the
difference. Here a proxy between the service and PostgreSQL (a fake at the network's edge)
reads the frontend protocol and records every message the client sends: a poll of the real
dispatch path is three simple-query messages (the claim with its BEGIN; the checkpoint's
savepoint with the set-based read; the write with the COMMIT) and no message of the extended
protocol, whatever the batch's size. A fast path that silently fell back fails here.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import make_url
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine
from scheduler.nudging.publishers import RecordingPublisher
from scheduler.web.app import SchedulerService
from tests.conftest import T0
from tests.helpers import post_event

# The untyped requests a client may send before its startup message (SSL, GSS encryption,
# cancel): a length and a code, no type byte.
_REQUESTS = {80877103, 80877104, 80877102}


class MessageRecorder:
    """A TCP proxy to PostgreSQL's Unix socket that records each frontend message's type and
    text (a fake at the edge: the bytes pass unchanged)."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.messages: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def take(self) -> list[tuple[str, bytes]]:
        """The messages recorded since the last call."""
        with self.lock:
            taken, self.messages = self.messages, []
        return taken

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.unix_path)
            self.sockets += [client, server]
            for target, source, parse in ((server, client, True), (client, server, False)):
                thread = threading.Thread(target=self._pipe, args=(source, target, parse), daemon=True)
                thread.start()
                self.threads.append(thread)

    def _pipe(self, source: socket.socket, target: socket.socket, parse: bool) -> None:
        buffer, started = b"", False
        try:
            while data := source.recv(65536):
                target.sendall(data)
                if not parse:
                    continue
                buffer += data
                while True:
                    if not started:
                        if len(buffer) < 8:
                            break
                        length, code = struct.unpack("!ii", buffer[:8])
                        if len(buffer) < length:
                            break
                        buffer, started = buffer[length:], code not in _REQUESTS
                        continue
                    if len(buffer) < 5:
                        break
                    kind, length = chr(buffer[0]), struct.unpack("!i", buffer[1:5])[0]
                    if len(buffer) < 1 + length:
                        break
                    with self.lock:
                        self.messages.append((kind, buffer[5:1 + length]))
                    buffer = buffer[1 + length:]
        except OSError:
            pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self.threads:
            thread.join(timeout=5)


@pytest.fixture
def wire(database_url: str) -> Iterator[tuple[MessageRecorder, str]]:
    url = make_url(database_url)
    host, port = url.query.get("host") or url.host, url.query.get("port") or url.port or 5432
    if not (isinstance(host, str) and host.startswith("/")):
        pytest.skip("the proxy reaches PostgreSQL through its Unix socket (the embedded server's)")
    recorder = MessageRecorder(str(Path(host) / f".s.PGSQL.{port}"))
    proxied = make_url(database_url).set(host="127.0.0.1", port=recorder.port)
    proxied = proxied.set(query={k: v for k, v in proxied.query.items() if k not in ("host", "port")})
    yield recorder, proxied.render_as_string(hide_password=False)
    recorder.close()


def _poll_messages(service: SchedulerService, recorder: MessageRecorder) -> list[tuple[str, bytes]]:
    recorder.take()
    report = service.scheduler.poll_once()
    assert report.failed == 0 and report.dispatched > 0
    return recorder.take()


def _summary(messages: list[tuple[str, bytes]]) -> list[str]:
    return [f"{kind} {text[:60]!r}" for kind, text in messages]


@pytest.mark.clause("PERF-8")
@pytest.mark.clause("DEC-1.3")
def test_a_poll_of_the_real_path_sends_three_messages_on_the_wire_for_one_event_as_for_twenty(
    wire: tuple[MessageRecorder, str], settings: Settings, clock: ManualClock
) -> None:
    """PERF-8, DEC-1.3: through a proxy that reads the protocol, a poll of one event and a poll of twenty
    each send exactly three simple-query messages (BEGIN with the claim, the savepoint with the
    set-based read, the write with the COMMIT) and no Parse, Bind or Execute: the statements of a
    round trip really travel together."""
    recorder, url = wire
    # long enough that the poll's connection, used a moment before, is never pinged first
    tuned = settings.model_copy(update={"pool_ping_after_idle_seconds": 3600.0})
    engine = make_engine(url, tuned)
    try:
        service = SchedulerService(tuned, engine=engine, clock=clock, publisher=RecordingPublisher(),
                                   run_scheduler=False)
        service.scheduler.publisher = None  # the inbox's numbering after commit is not the batch's
        with TestClient(service.app) as client:
            counts = {}
            for size in (1, 20):
                for i in range(size):
                    post_event(client, user_id=f"wire-{size}-{i}", trigger_at=T0 - timedelta(minutes=size - i))
                messages = _poll_messages(service, recorder)
                kinds = [kind for kind, _ in messages]
                assert kinds == ["Q", "Q", "Q"], _summary(messages)
                claim, read, write = (text.decode(errors="replace") for _, text in messages)
                assert claim.startswith("BEGIN") and "FOR UPDATE SKIP LOCKED" in claim, _summary(messages)
                assert read.startswith("SAVEPOINT"), _summary(messages)
                assert write.rstrip("\x00").rstrip().endswith("COMMIT"), _summary(messages)
                counts[size] = len(messages)
            assert counts == {1: 3, 20: 3}
    finally:
        engine.dispose()
