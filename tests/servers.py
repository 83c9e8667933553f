"""Real replicas for the inbox tests: a service served by uvicorn on a free 127.0.0.1 port.

Streams (server-sent events) never end, so they cannot go through Starlette's TestClient,
which collects a whole response; a real server in a thread of its own can. The service is
mounted the way an embedding app mounts it, with its lifespan (the loop when it runs one,
and the process's LISTEN connection).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from scheduler.service import SchedulerService

# How long one read of a stream may take before the test fails: a missing event must fail
# a test in seconds, never by the suite's 300 s per-test timeout. The service's heartbeat
# (15 s by default) would otherwise keep a reader waiting for an event forever.
READ_DEADLINE = 10.0


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "the condition") -> None:
    """Wait (polling the condition, never a fixed sleep) until it holds; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


@contextlib.contextmanager
def serve(service: SchedulerService) -> Iterator[str]:
    """Serve ``service`` (with its lifespan) until the block ends; yields its base URL."""
    app = Starlette(routes=[Mount("/", app=service.app)], lifespan=lambda app: service.lifespan(app))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), what="uvicorn to start")
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "uvicorn did not stop"


class EventStream:
    """A live server-sent-event connection, read block by block; every read has its own deadline.

    ``next_block`` and ``next_event`` fail (AssertionError) when what they wait for has not
    arrived within ``deadline`` seconds, however many heartbeats come meanwhile; a connection
    that goes silent fails at the same deadline (httpx's read timeout).
    """

    def __init__(self, url: str, headers: Mapping[str, str], client: httpx.Client,
                 deadline: float = READ_DEADLINE) -> None:
        self.url = url
        self.deadline = deadline
        self._context = client.stream("GET", url, headers=dict(headers), timeout=httpx.Timeout(deadline))
        self.response = self._context.__enter__()
        self.lines: Iterator[str] = self.response.iter_lines()

    def next_block(self, until: float | None = None) -> list[str]:
        """The next non-empty block of lines; fails at ``until`` (monotonic), else one deadline from now."""
        limit = time.monotonic() + self.deadline if until is None else until
        block: list[str] = []
        try:
            for line in self.lines:
                if time.monotonic() > limit:
                    raise AssertionError(f"{self.url}: nothing expected arrived within {self.deadline:g} s")
                if line == "":
                    if block:
                        return block
                    continue
                block.append(line)
        except httpx.ReadTimeout as exc:
            raise AssertionError(f"{self.url}: the stream sent nothing for {self.deadline:g} s") from exc
        raise AssertionError(f"{self.url}: the stream ended")

    def until_connected(self) -> None:
        limit = time.monotonic() + self.deadline
        while ": connected" not in self.next_block(limit):
            pass

    def next_event(self) -> tuple[int, dict[str, Any]]:
        """The next ``notification`` event (id, data), skipping heartbeats, within one deadline."""
        limit = time.monotonic() + self.deadline
        while True:
            block = self.next_block(limit)
            fields = dict(line.split(": ", 1) for line in block if not line.startswith(":") and ": " in line)
            if fields.get("event") == "notification":
                return int(fields["id"]), json.loads(fields["data"])

    def close(self) -> None:
        self._context.__exit__(None, None, None)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
