"""Actors: every replica and every API client runs its steps on a thread of its own.

A step that blocks in PostgreSQL (a claim waiting for a participant another batch holds,
a re-post waiting for a row being dispatched) keeps its actor busy; the simulation goes on
with the other actors and learns from ``pg_locks`` that the step is waiting, never from a
timer.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from harness.faults import ArmedFaults, FaultyDispatcher
from scheduler.core.loop import Batch, Scheduler
from scheduler.database.database import Database

OnDone = Callable[[Any, BaseException | None], None]
OnBlocked = Callable[[str], None]


@dataclass
class Op:
    """A step in flight on an actor's thread."""

    kind: str
    code: str
    future: Future[Any]
    on_done: OnDone
    on_blocked: OnBlocked | None = None
    blocked: bool = False


@dataclass
class Request:
    """An API request between its arrival and its answer (a post of one event)."""

    key: str | None
    params: dict[str, Any]
    content: Any
    session: Session | None = None
    existing: str | None = None


class Actor:
    """One connection (pool of one) and one thread; ``pid`` follows reconnections."""

    rank_base = 0

    def __init__(self, name: str, index: int, engine: Engine) -> None:
        self.name = name
        self.index = index
        self.engine = engine
        # the simulation's database is in the default schema (its statements, its sessions)
        self.database = Database(engine)
        self.sessions: sessionmaker[Session] = self.database.sessions
        self.pid: int | None = None
        self.pids: set[int] = set()  # every backend it ever had, so close() can make sure they are gone
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.op: Op | None = None
        self.killed = False
        event.listen(engine, "connect", self._on_connect)

    def _on_connect(self, dbapi_connection: Any, record: Any) -> None:
        self.pid = int(dbapi_connection.info.backend_pid)
        self.pids.add(self.pid)

    @property
    def rank(self) -> tuple[int, int]:
        return (self.rank_base, self.index)

    def submit(self, kind: str, code: str, fn: Callable[[], Any], on_done: OnDone,
               on_blocked: OnBlocked | None = None) -> Op:
        if self.op is not None:
            raise RuntimeError(f"{self.name} is busy with {self.op.code}")
        self.op = Op(kind, code, self.executor.submit(fn), on_done, on_blocked)
        return self.op

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.engine.dispose()


class Replica(Actor):
    """A production ``Scheduler`` (or a broken variant) with its own connection and dispatcher."""

    rank_base = 0

    def __init__(self, name: str, index: int, engine: Engine, dispatcher: FaultyDispatcher,
                 make_scheduler: Callable[[Replica], Scheduler]) -> None:
        super().__init__(name, index, engine)
        self.dispatcher = dispatcher
        self.faults = ArmedFaults(engine)
        self._make_scheduler = make_scheduler
        self.scheduler = make_scheduler(self)
        self.batch: Batch | None = None
        self.zombie = False  # holds a Batch whose backend was killed
        self.restarts = 0

    def restart(self) -> None:
        """A crashed process comes back: a new Scheduler over the same connection pool."""
        self.scheduler = self._make_scheduler(self)
        self.batch = None
        self.zombie = False
        self.restarts += 1


class Client(Actor):
    """An API process storing events (the production ``store`` functions)."""

    rank_base = 1

    def __init__(self, name: str, index: int, engine: Engine) -> None:
        super().__init__(name, index, engine)
        self.request: Request | None = None
        self.target: str | None = None  # the row its write in flight touches, if known


@dataclass
class Stats:
    """What a run did, for the summary."""

    steps: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    checks: dict[str, int] = field(default_factory=dict)
    blocked: dict[str, int] = field(default_factory=dict)
    poll_errors: int = 0

    @staticmethod
    def bump(counter: dict[str, int], key: str, by: int = 1) -> None:
        counter[key] = counter.get(key, 0) + by
