"""One LISTEN connection per process: PostgreSQL notifications fanned out to callbacks.

Why a connection of its own: LISTEN belongs to a session, and the pool's connections are
lent to one transaction at a time. A thread holds one autocommit psycopg connection,
LISTENs on every subscribed channel and calls each channel's callbacks with the payload.

Where LISTEN cannot work (behind a transaction-pooling PgBouncer the session that
LISTENed is handed to other clients after every statement, so notifications go astray),
the listener finds out with a probe at connect time: it checks that its backend stays the
same across transactions and that a NOTIFY sent from another connection comes back. If
either fails, ``available`` is False, ``reason`` says why (logged once), and users fall
back to timed wake-ups. Nothing is lost either way: a notification only ever hastens work
that a timed poll or a read of the table would find anyway.

After a reconnect every callback is called once with the empty payload: notifications
may have been missed while the connection was down, so subscribers should look again.

Each ``start`` runs a fresh thread with a stop event and a readiness event of its own, so
a restart never revives the thread of an earlier run: a thread that ``stop`` could not
join in time (still connecting) sees its own stop event set and ends on its own once
its attempt returns, without updating ``available`` or ``reason`` again.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

logger = logging.getLogger(__name__)

Callback = Callable[[str], None]

PROBE_CHANNEL = "scheduler_listener_probe"


def conninfo_of(engine: Engine) -> str:
    """libpq's connection string for ``engine``'s database, every host of a multi-host URL and
    its ``target_session_attrs`` kept (``scheduler.database.urls``)."""
    from scheduler.database.urls import conninfo

    return conninfo(engine.url)


def notify(session: Session, channel: str, payload: str) -> None:
    """Send a notification inside ``session``'s transaction: delivered only if it commits."""
    session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": payload})


@dataclass
class _Run:
    """One start-to-stop run of the listener: its thread and its own events."""

    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class Listener:
    """LISTENs on subscribed channels in a thread of its own and calls back.

    ``conninfo`` is a libpq connection string or URI; ``probe_engine`` (optional) sends the availability
    probe from a pooled connection, as a real peer would. Callbacks run on the listener
    thread: they must be quick and should not raise (a raising callback is logged).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        name: str = "listener",
        probe_engine: Engine | None = None,
        probe_seconds: float = 2.0,
        retry_seconds: float = 1.0,
        reprobe_seconds: float = 60.0,
        connect_args: Mapping[str, Any] | None = None,
    ) -> None:
        self.conninfo = conninfo
        # libpq parameters of the LISTEN connection (TCP keepalives: a vanished database
        # host is noticed on this long-lived idle connection too)
        self.connect_args = dict(connect_args or {})
        self.name = name
        self.probe_engine = probe_engine
        self.probe_seconds = probe_seconds
        self.retry_seconds = retry_seconds
        self.reprobe_seconds = reprobe_seconds
        self._callbacks: dict[str, list[Callback]] = defaultdict(list)
        self._lock = threading.Lock()
        self._current: _Run | None = None  # the run started last and not yet stopped
        self.available = False
        self.reason: str | None = "not started"
        self.connects = 0
        self._warned = False

    def subscribe(self, channel: str, callback: Callback) -> None:
        """Call ``callback(payload)`` for each notification on ``channel``.

        Subscribe before ``start``: channels added later are LISTENed on the next connect.
        """
        with self._lock:
            self._callbacks[channel].append(callback)

    @property
    def running(self) -> bool:
        return self._current is not None

    @property
    def thread(self) -> threading.Thread | None:
        """The current run's thread (``None`` when stopped)."""
        run = self._current
        return None if run is None else run.thread

    @property
    def has_subscribers(self) -> bool:
        with self._lock:
            return bool(self._callbacks)

    def start(self, wait_seconds: float | None = None) -> None:
        """Start a fresh thread (a no-op while running); wait up to ``wait_seconds``
        (default: the probe's time plus one second) for its first connect, so
        ``available`` is meaningful on return."""
        if self._current is not None:
            return
        run = _Run()
        # the caller's context (its replica in the log lines: OBS-8) goes with the thread
        run.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run, run),
                                      name=f"{self.name}-listen", daemon=True)
        with self._lock:
            self._current = run
        run.thread.start()
        run.ready.wait(self.probe_seconds + 1.0 if wait_seconds is None else wait_seconds)

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop listening and join the thread for up to ``timeout`` seconds; return whether
        it ended. One that did not (a connect in progress) is logged; it ends on its own
        once that attempt returns, and a later ``start`` runs a new thread regardless."""
        with self._lock:
            run, self._current = self._current, None
            self.available = False
            self.reason = "stopped"
        if run is None or run.thread is None:
            return True
        run.stop.set()
        run.thread.join(timeout)
        if run.thread.is_alive():
            logger.warning("%s: the LISTEN thread %s did not end within %g s of stop; it ends by itself "
                           "once its connection attempt returns", self.name, run.thread.name, timeout)
            return False
        return True

    # -- the thread --------------------------------------------------------------------

    def _run(self, run: _Run) -> None:
        while not run.stop.is_set():
            try:
                # No prepared statements: harmless here, and safe behind a transaction pooler.
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10, prepare_threshold=None,
                                     **self.connect_args) as conn:
                    if run.stop.is_set():
                        return  # stopped while connecting: this run is over
                    self._listen(run, conn)
                    if run.stop.is_set():
                        return
                    self.connects += 1
                    if self.connects > 1:
                        self._dispatch_all("")  # we may have missed some: look again
                    run.ready.set()
                    if not self.available:
                        # Timed wake-ups meanwhile; probe again later (a proxy may go away).
                        run.stop.wait(self.reprobe_seconds)
                        continue
                    while not run.stop.is_set():
                        for note in conn.notifies(timeout=0.2):
                            self._dispatch(note.channel, note.payload)
            except Exception as exc:
                if run.stop.is_set():
                    return  # the failure of a run already stopped is nobody's news
                self._set_status(run, False, f"connection lost: {type(exc).__name__}: {exc}")
                logger.warning("%s: LISTEN connection failed (%s); retrying", self.name, exc, exc_info=True)
                run.ready.set()
                run.stop.wait(self.retry_seconds)

    def _set_status(self, run: _Run, available: bool, reason: str | None) -> None:
        """Only the current run speaks for the listener."""
        with self._lock:
            if run is self._current:
                self.available = available
                self.reason = reason

    def _listen(self, run: _Run, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        with self._lock:
            channels = sorted(self._callbacks)
        for channel in [*channels, PROBE_CHANNEL]:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        problem = self._probe(conn)
        self._set_status(run, problem is None, problem)
        if problem is not None and not self._warned:
            self._warned = True
            logger.warning("%s: LISTEN/NOTIFY unavailable (%s); falling back to timed wake-ups", self.name, problem)

    def _probe(self, conn: psycopg.Connection[tuple[object, ...]]) -> str | None:
        """None when notifications reach this session, else why they do not."""
        pids = {self._backend_pid(conn) for _ in range(3)}
        if len(pids) > 1:
            return "the session changes backend between transactions (a transaction-pooling proxy)"
        token = uuid.uuid4().hex
        try:
            if self.probe_engine is not None:
                with self.probe_engine.begin() as peer:
                    peer.execute(text("SELECT pg_notify(:c, :p)"), {"c": PROBE_CHANNEL, "p": token})
            else:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10) as peer_conn:
                    peer_conn.execute("SELECT pg_notify(%s, %s)", (PROBE_CHANNEL, token))
        except (psycopg.Error, SQLAlchemyError, OSError) as exc:
            return f"the probe could not be sent: {type(exc).__name__}: {exc}"
        deadline = time.monotonic() + self.probe_seconds
        while (remaining := deadline - time.monotonic()) > 0:
            for note in conn.notifies(timeout=remaining, stop_after=1):
                if note.channel == PROBE_CHANNEL and note.payload == token:
                    return None
                self._dispatch(note.channel, note.payload)
        return f"a probe NOTIFY did not come back within {self.probe_seconds:g} s"

    @staticmethod
    def _backend_pid(conn: psycopg.Connection[tuple[object, ...]]) -> object:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        return row[0] if row else None

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == PROBE_CHANNEL:
            return
        with self._lock:
            callbacks = list(self._callbacks.get(channel, ()))
        for callback in callbacks:
            try:
                callback(payload)
            except Exception:
                logger.exception("%s: a callback for %s failed", self.name, channel)

    def _dispatch_all(self, payload: str) -> None:
        with self._lock:
            channels = list(self._callbacks)
        for channel in channels:
            self._dispatch(channel, payload)

    def snapshot(self) -> dict[str, object]:
        """What ``/health/scheduler`` shows of the listener."""
        return {"available": self.available, "reason": self.reason, "connects": self.connects}
