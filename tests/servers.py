"""Real replicas for the inbox tests: a service served by uvicorn on a free 127.0.0.1 port.

Streams (server-sent events) never end, so they cannot go through Starlette's TestClient,
which collects a whole response; a real server in a thread of its own can. The service is
mounted the way an embedding app mounts it, with its lifespan (the loop when it runs one,
and the process's LISTEN connection).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from scheduler.web.app import SchedulerService


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
