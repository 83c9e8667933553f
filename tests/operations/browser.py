"""Browser-test support: the service under uvicorn on 127.0.0.1 and Debian's Chromium.

The app runs in a thread on a free loopback port against the test's own database; every
wait has a deadline. Chromium is /usr/bin/chromium (``scripts/system-packages`` installs
it); the tests skip, saying why, only when it is truly absent.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import ASGIApp

CHROMIUM = os.environ.get("SCHEDULER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def chromium_or_skip() -> str:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (scripts/system-packages installs Debian's chromium)")
    return CHROMIUM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _ReadyServer(uvicorn.Server):
    """uvicorn's server that sets ``ready`` once it listens (nothing to poll for)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextmanager
def serving(app: ASGIApp, timeout: float = 20.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in a thread; yield its base URL."""
    port = free_port()
    server = _ReadyServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                         lifespan="off", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name="console-uvicorn", daemon=True)
    thread.start()
    if not server.ready.wait(timeout) or not server.started:
        server.should_exit = True
        raise AssertionError("uvicorn did not start within the deadline")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        assert not thread.is_alive(), "uvicorn did not stop within the deadline"


def screenshot(page: Any, name: str, tmp_path: Path) -> None:
    """A full-page screenshot: into docs/screenshots with SCHEDULER_SCREENSHOTS=1, else tmp."""
    target = SCREENSHOTS if os.environ.get("SCHEDULER_SCREENSHOTS") == "1" else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / f"{name}.png"), full_page=True)
