"""RESTART-1 to RESTART-3: a rolling restart ends the streams at once, quietly, and loses nothing.

Real ``scheduler serve`` processes on the test's database. On SIGTERM with an inbox stream
and a console stream open, both streams end at once with a ``retry:`` hint, the process
exits 0 promptly, and its log holds no ERROR and no traceback (before DEC-SSE: 10.6 s and
an ERROR with a ``CancelledError`` traceback, uvicorn's graceful-shutdown timeout cancelling
the stream). A participant whose replica stopped reconnects to another replica with
``Last-Event-ID`` and gets exactly what was delivered meanwhile, then the live stream.

Wall-clock is measured and printed, never asserted beyond a generous deadline (an exit
slower than ``EXIT_DEADLINE`` is the old behaviour: it waited 10 s for the stream).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability.cluster import Replica, free_port
from starlette.types import Message

from scheduler.web.http.sse import CLOSING, Streams
from scheduler.web.inbox import hub as inbox_module
from scheduler.web.inbox.hub import Inbox, Subscriber, sse_stream
from tests.conftest import ADMIN, INGEST, PARTICIPANT, TEST_SECRET, token

EXIT_DEADLINE = 5.0  # measured: 0.2-0.4 s on a busy two-core machine; the old behaviour: 10.6 s
READ = httpx.Timeout(20.0)


def _replica(name: str, database_url: str, workdir: Path) -> Replica:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
    env.update({"DATABASE_URL": database_url, "SCHEDULER_JWT_SECRET": TEST_SECRET, "PYTHONUNBUFFERED": "1",
                "SCHEDULER_DATA_DIR": str(workdir / name), "SCHEDULER_ENABLED": "false"})
    return Replica(name, free_port(), env, workdir / f"{name}.log", log_level="info")


@pytest.fixture
def replicas(database_url: str, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    a, b = _replica("replica-a", database_url, tmp_path), _replica("replica-b", database_url, tmp_path)
    try:
        a.start(wait=False)
        b.start(wait=False)
        a.wait_healthy(120)
        b.wait_healthy(120)
        yield a, b
    finally:
        for replica in (a, b):
            if replica.alive():
                replica.kill()


def console_session(http: httpx.Client, base_url: str) -> str:
    """Sign in on a replica's console as a browser does; the session cookie's value."""
    form = http.get(f"{base_url}/console/sign-in")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce, form.text
    signed_in = http.post(f"{base_url}/console/sign-in", follow_redirects=False,
                          data={"nonce": nonce[1], "token": token("nudging.admin"), "next": ""})
    assert signed_in.status_code == 303, signed_in.text
    value = signed_in.cookies.get("scheduler_console")
    assert value, signed_in.headers
    return value


class Lines:
    """An open SSE response read line by line; every read has the client's deadline."""

    def __init__(self, client: httpx.Client, url: str, headers: dict[str, str]) -> None:
        self._context = client.stream("GET", url, headers=headers, timeout=READ)
        self.response = self._context.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self._lines = self.response.iter_lines()
        self.seen: list[str] = []

    def until(self, wanted: str) -> None:
        for line in self._lines:
            self.seen.append(line)
            if wanted in line:
                return
        raise AssertionError(f"the stream ended before {wanted!r}: {self.seen[-5:]}")

    def next_event(self) -> tuple[int, dict[str, Any]]:
        fields: dict[str, str] = {}
        for line in self._lines:
            self.seen.append(line)
            if line == "" and fields.get("event") == "notification":
                return int(fields["id"]), json.loads(fields["data"])
            if line == "":
                fields = {}
            elif not line.startswith(":") and ": " in line:
                key, value = line.split(": ", 1)
                fields[key] = value
        raise AssertionError(f"the stream ended: {self.seen[-5:]}")

    def rest(self) -> list[str]:
        """Everything until the server ends the stream."""
        tail = list(self._lines)
        self.seen.extend(tail)
        return tail

    def close(self) -> None:
        self._context.__exit__(None, None, None)


def _deliver(http: httpx.Client, replica: Replica, day: date) -> None:
    """A live reminder for participant-1 through ``replica`` (one a day: no dedup)."""
    body = {"event_type": "commitment_reminder", "user_id": "participant-1", "community_id": "community-1",
            "facts": {"facts_version": "1.0", "scenario": "commitment_reminder", "date": day.isoformat(),
                      "commitment": "run the dishwasher at noon"}}
    answer = http.post(f"{replica.base_url}/admin/ingest-event", json=body, headers=dict(INGEST))
    assert answer.status_code == 200, answer.text


def _quiet(log: str) -> None:
    assert "ERROR" not in log and "Traceback" not in log and "CancelledError" not in log, log[-3000:]


def _ends_with_retry_hint(lines: list[str]) -> None:
    text = "\n".join(lines).rstrip("\n")
    assert text.endswith(CLOSING.rstrip("\n")), lines[-5:]


@pytest.mark.clause("RESTART-1")
@pytest.mark.clause("DEC-SSE")
def test_sigterm_ends_open_inbox_and_console_streams_at_once_and_exits_quietly(
    replicas: tuple[Replica, Replica]
) -> None:
    """RESTART-1: an inbox and a console stream open; SIGTERM: both end with the retry hint,
    exit 0 well within the deadline, no ERROR and no traceback in the log."""
    a, _ = replicas
    with httpx.Client() as http:
        inbox = Lines(http, f"{a.base_url}/me/notifications/stream", dict(PARTICIPANT))
        console = Lines(http, f"{a.base_url}/console/stream",
                        {"Cookie": f"scheduler_console={console_session(http, a.base_url)}"})
        inbox.until(": connected")
        console.until("event: overview")
        code, seconds = a.terminate(timeout=30)
        inbox_tail, console_tail = inbox.rest(), console.rest()
        inbox.close()
        console.close()
    print(f"SIGTERM with two open streams: exited {code} after {seconds:.3f} s")
    assert code == 0
    assert seconds < EXIT_DEADLINE, f"exit took {seconds:.1f} s: the streams held the shutdown"
    _ends_with_retry_hint(inbox_tail)
    _ends_with_retry_hint(console_tail)
    _quiet(a.log_path.read_text(errors="replace"))
    assert "Application shutdown complete" in a.log_path.read_text()


@pytest.mark.clause("RESTART-2")
def test_a_client_reconnects_to_another_replica_and_replays_what_it_missed(
    replicas: tuple[Replica, Replica]
) -> None:
    """RESTART-2: a stream on A; A stops (SIGTERM) mid-stream; three reminders are delivered through B
    meanwhile; the client reconnects to B with Last-Event-ID: exactly those three, in order, then live."""
    a, b = replicas
    day = date(2026, 1, 1)
    with httpx.Client(timeout=READ) as http:
        prefs = http.put(f"{b.base_url}/admin/participants/participant-1/preferences",
                         json={"enabled_kinds": None, "max_per_day": 1000}, headers=dict(ADMIN))
        assert prefs.status_code == 200, prefs.text
        on_a = Lines(http, f"{a.base_url}/me/notifications/stream", dict(PARTICIPANT))
        on_a.until(": connected")
        _deliver(http, b, day)  # through B, pushed to A's stream by NOTIFY
        last, first = on_a.next_event()
        assert first["user_id"] == "participant-1"
        code, seconds = a.terminate(timeout=30)
        _ends_with_retry_hint(on_a.rest())
        on_a.close()
        for n in range(1, 4):
            _deliver(http, b, day + timedelta(days=n))
        on_b = Lines(http, f"{b.base_url}/me/notifications/stream", {**PARTICIPANT, "Last-Event-ID": str(last)})
        replayed = [on_b.next_event() for _ in range(3)]
        ids = [seq for seq, _ in replayed]
        assert ids == sorted(ids) and min(ids) > last and len(set(ids)) == 3
        assert [note["title"] for _, note in replayed] == ["Reminder: run the dishwasher at noon"] * 3
        _deliver(http, b, day + timedelta(days=4))
        live, _ = on_b.next_event()
        assert live > ids[-1]
        on_b.close()
    print(f"replica A stopped in {seconds:.3f} s (exit {code}); B replayed {ids} after {last}, then {live} live")
    assert code == 0
    _quiet(a.log_path.read_text(errors="replace"))


class _NoTable(Inbox):
    """A fake hub at the edge (with ``_replay`` faked to an empty table): an open stream only waits."""

    async def subscribe(self, user_id: str) -> Subscriber:
        subscriber = Subscriber(user_id, asyncio.Queue(maxsize=1))
        self.subscribers.setdefault(user_id, set()).add(subscriber)
        return subscriber


async def _serve_one(streams: Streams, inbox: Inbox, sent: list[bytes], done: asyncio.Event) -> None:
    """Run one inbox stream response as ASGI (no server) until it completes; its body into ``sent``."""
    response = streams.response(lambda closing: sse_stream(inbox, "participant-1", after=10**9, closing=closing))
    scope = {"type": "http", "method": "GET", "path": "/me/notifications/stream", "headers": []}

    async def receive() -> Message:
        await done.wait()  # the client never leaves on its own; bounded: the test's wait_for on the task
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    await response(scope, receive, send)


@pytest.mark.clause("RESTART-3")
@pytest.mark.clause("DEC-SSE")
def test_closing_the_streams_ends_an_open_response_with_the_retry_hint_and_new_ones_at_once(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESTART-3: Streams.close_all ends a stream that waits for rows (its heartbeat an hour away) at
    once, its last chunk the retry hint and the response complete; a stream opened while the server
    stops ends at once too; nothing stays subscribed."""

    monkeypatch.setattr(inbox_module, "_replay", lambda *args: [])  # the fake empty table

    async def scenario() -> tuple[list[bytes], list[bytes], float, int]:
        inbox, streams = _NoTable(None, heartbeat_seconds=3600), Streams()  # type: ignore[arg-type]
        first: list[bytes] = []
        done = asyncio.Event()
        task = asyncio.create_task(_serve_one(streams, inbox, first, done))
        await asyncio.wait_for(_until(lambda: streams.open_count == 1 and bool(first)), timeout=10)
        started = time.monotonic()
        assert streams.close_all() == 1
        await asyncio.wait_for(task, timeout=10)
        took = time.monotonic() - started
        second: list[bytes] = []
        await asyncio.wait_for(_serve_one(streams, inbox, second, asyncio.Event()), timeout=10)
        return first, second, took, sum(len(g) for g in inbox.subscribers.values())

    first, second, took, subscribed = asyncio.run(scenario())
    print(f"close_all to a completed response: {took * 1000:.1f} ms")
    for body in (first, second):
        assert body[0].startswith(b"retry: ") and body[-2:] == [CLOSING.encode(), b""], body
    assert subscribed == 0


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)
