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

import struct
from collections.abc import Iterator
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from tests.conftest import T0
from tests.helpers import post_event
from tests.proxy import UnixSocketProxy, running, through, unix_socket_of

# The untyped requests a client may send before its startup message (SSL, GSS encryption,
# cancel): a length and a code, no type byte.
_REQUESTS = {80877103, 80877104, 80877102}


class MessageRecorder(UnixSocketProxy):
    """A proxy (a fake at the edge) that records each frontend message's type and text; the
    bytes pass unchanged."""

    def __init__(self, unix_path: str) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self._buffer, self._started = b"", False
        super().__init__(unix_path)

    def take(self) -> list[tuple[str, bytes]]:
        """The messages recorded since the last call."""
        with self.lock:
            taken, self.messages = self.messages, []
        return taken

    def observe_upstream(self, data: bytes) -> None:
        # one client connection at a time in these tests: one parse state
        self._buffer += data
        while True:
            if not self._started:
                if len(self._buffer) < 8:
                    return
                length, code = struct.unpack("!ii", self._buffer[:8])
                if len(self._buffer) < length:
                    return
                self._buffer, self._started = self._buffer[length:], code not in _REQUESTS
                continue
            if len(self._buffer) < 5:
                return
            kind, length = chr(self._buffer[0]), struct.unpack("!i", self._buffer[1:5])[0]
            if len(self._buffer) < 1 + length:
                return
            with self.lock:
                self.messages.append((kind, self._buffer[5:1 + length]))
            self._buffer = self._buffer[1 + length:]


@pytest.fixture
def wire(database_url: str) -> Iterator[tuple[MessageRecorder, str]]:
    with running(MessageRecorder(unix_socket_of(database_url))) as recorder:
        yield recorder, through(database_url, recorder)


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
