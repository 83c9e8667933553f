"""``python -m bench path``: how many of the package's modules one reminder runs code in.

One reminder is stored through the API (``POST /admin/scheduled-events``) and dispatched by
one ``poll_once()`` of a service on a ManualClock, against a fresh migrated database; a
profile hook (``sys.setprofile`` and ``threading.setprofile``, since the test client runs
the app on a thread of its own) records the module of every Python function called. A first
reminder is stored and dispatched before the measured one, so that imports and first-use
caches do not count: what remains is the code a reader follows for every reminder.

The figure is a readability measure (how many files a newcomer opens to follow one
reminder), not a speed: docs/performance.md keeps it with its command.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

PACKAGE = "scheduler"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


class ModuleTrace:
    """Records the package's modules whose functions are called while a phase is on.

    The hook is installed on every thread before the test client starts its own (the app
    runs there), and records only while ``phase`` names a set."""

    def __init__(self) -> None:
        self.phase: set[str] | None = None

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.phase is not None:
            name = frame.f_globals.get("__name__", "")
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                self.phase.add(name)

    @contextmanager
    def installed(self) -> Iterator[None]:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    @contextmanager
    def recording(self, into: set[str] | None) -> Iterator[None]:
        self.phase = into
        try:
            yield
        finally:
            self.phase = None


@dataclass(frozen=True)
class PathModules:
    """The modules one reminder runs code in: storing it, dispatching it, and both."""

    store: tuple[str, ...]
    poll: tuple[str, ...]

    @property
    def both(self) -> tuple[str, ...]:
        return tuple(sorted({*self.store, *self.poll}))


def _body(key: str, when: datetime) -> dict[str, Any]:
    return {
        "event_type": "commitment_reminder",
        "user_id": f"participant-{key}",
        "community_id": "community-1",
        "external_key": f"path-{key}",
        "trigger_at": when.isoformat(),
        "facts": {"facts_version": "1", "scenario": "commitment_reminder",
                  "commitment": "run the dishwasher at noon", "date": T0.date().isoformat()},
    }


def measure(database_url: str) -> PathModules:
    """Store and dispatch one reminder on ``database_url`` (migrated) and trace the second one."""
    from starlette.testclient import TestClient

    from scheduler import ManualClock, SchedulerService, Settings
    from scheduler.database.engine import make_engine
    from scheduler.nudging.orchestrator import RecordingPublisher
    from scheduler.web.http.auth import mint_token

    secret = "path-measurement-secret-of-at-least-32-bytes"
    settings = Settings(jwt_secret=secret, poll_seconds=30.0, batch_size=20)
    engine = make_engine(database_url, settings)
    clock = ManualClock(T0)
    service = SchedulerService(settings, engine=engine, clock=clock, publisher=RecordingPublisher(),
                               run_scheduler=False)
    headers = {"Authorization": f"Bearer {mint_token(secret, scope='nudging.admin')}"}
    store: set[str] = set()
    poll: set[str] = set()
    trace = ModuleTrace()
    try:
        with trace.installed(), TestClient(service.app) as client:
            for key, store_into, poll_into in (("warm", None, None), ("measured", store, poll)):
                when = clock.now() + timedelta(seconds=1)
                with trace.recording(store_into):
                    answer = client.post("/admin/scheduled-events", headers=headers, json=_body(key, when))
                if answer.status_code != 201:
                    raise RuntimeError(f"storing the reminder answered {answer.status_code}: {answer.text}")
                clock.advance(timedelta(seconds=2))
                with trace.recording(poll_into):
                    report = service.scheduler.poll_once()
                if report.claimed != 1:
                    raise RuntimeError(f"the poll claimed {report.claimed} events, not 1")
    finally:
        engine.dispose()
    return PathModules(store=tuple(sorted(store)), poll=tuple(sorted(poll)))


def main() -> int:
    """Print the modules and their counts, on the embedded PostgreSQL (or ``DATABASE_URL``)."""
    from bench.env import Server, progress

    server = Server()
    with server.fresh_database("path") as url:
        progress("storing one reminder through the API and dispatching it with one poll")
        found = measure(url)
    for label, modules in (("store", found.store), ("poll", found.poll), ("both", found.both)):
        print(f"{label}: {len(modules)} modules")
        for name in modules:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
