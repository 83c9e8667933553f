"""How a run is put together: its replicas and clients, each on a connection of its own,
and what the database holds before the first step.

- A replica is the production ``Scheduler`` (of the run's variant) on an engine of its own
  (a pool of one connection, with the variant's SQL rewrites), behind the fault wrapper
  (``faults.FaultyDispatcher``) around the built-in platform or the host's dispatcher; a
  crashed replica gets a new scheduler from the same ``make_scheduler`` and keeps its
  dispatcher.
- A client is an engine of its own, for posts, resets and cancels.
- Before the first step: the participants' preferences (their daily caps, for SIM-6) with
  the built-in platform, or the host's own tables (its ``setup`` hook, in one transaction).

Replicas and clients wait as long as it takes (``NO_TIMEOUTS``): the harness, not a
timeout, ends a wait.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from harness.actors import Client, Replica
from harness.faults import FaultyDispatcher, Rewrite, install_rewrites
from scheduler.config import Settings
from scheduler.core import store
from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.types import Dispatcher

NO_TIMEOUTS = Settings(statement_timeout_ms=0, lock_timeout_ms=0, idle_in_transaction_timeout_ms=0)


def set_preferences(url: str, caps: dict[str, int], now: datetime) -> None:
    """Every participant's preferences: all kinds, and their cap (the built-in platform's run)."""
    engine = make_engine(url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
    try:
        database = Database(engine)
        for user, cap in caps.items():
            store.set_preferences(database, user, enabled_kinds=None, max_per_day=cap, now=now)
    finally:
        engine.dispose()


def set_up_host(url: str, setup: Callable[[Connection], None]) -> None:
    """The host's own tables, created or emptied before the run (in one transaction)."""
    engine = make_engine(url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
    try:
        with engine.begin() as conn:
            setup(conn)
    finally:
        engine.dispose()


def new_replica(url: str, index: int, rewrites: list[Rewrite], inner: Dispatcher,
                make_scheduler: Callable[[Replica], Scheduler]) -> Replica:
    """Replica ``index``: its own connection (with the variant's rewrites) and the fault
    wrapper around its dispatcher; ``make_scheduler`` builds its production scheduler."""
    engine = make_engine(url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
    install_rewrites(engine, rewrites)
    return Replica(f"replica-{index}", index, engine, FaultyDispatcher(inner, index), make_scheduler)


def new_client(url: str, index: int) -> Client:
    """API client ``index``, on a connection of its own."""
    engine = make_engine(url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
    return Client(f"client-{index}", index, engine)
