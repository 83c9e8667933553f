"""A host's engine: the service's protections on connections it does not own (DEC-HOST-ENGINE).

An engine the host passes (``SchedulerService(engine=...)``) is the host's: its sessions
carry whatever the host configured, often no ``statement_timeout``, ``lock_timeout`` or
``idle_in_transaction_session_timeout`` at all, and they are not the service's to change
(a session ``SET`` would outlive the scheduler's transaction into the host's next one, or,
behind a transaction pooler, into another client's). So the service works through a view of
it (``Engine.execution_options()``: the same pool, events of its own) whose every
transaction is given the service's timeouts with ``SET LOCAL``, sent with the transaction's
first statement, as behind PgBouncer (``scheduler.database.engine.settings_per_transaction``).
The host's own transactions on its engine are left as they were. Its ``search_path`` is
never touched: every statement of the scheduler names its schema, and a host's dispatcher
writing in the scheduler's transaction finds its own tables as it always does.

The loop gets a small pool of its own made like the host's engine (its URL, and the very
function its pool connects with, so the same connect arguments), so that requests holding
every connection of the host's pool cannot starve the polls; a host that passes
``loop_engine`` decides itself.

Only psycopg 3 is supported (the pipeline, the LISTEN connection and the driver-level DDL
use it): another driver is refused with a ``ConfigError``. An engine in ``AUTOCOMMIT`` has no
transaction to carry the timeouts: it is used, with a warning naming what is missing.

An ``AsyncEngine`` (the norm in a FastAPI host), or its ``sync_engine``, is accepted: the
scheduler's code is synchronous (its loop runs in a worker thread), so the service makes the
engine's sync twin (``sync_twin``): psycopg 3's sync driver on the same URL with the same
connect arguments, its pool sized as the host's async pool is. The twin is then treated as a
host's engine (the timeouts per transaction, the loop's own small pool made like it) and is
the service's to dispose. What cannot be carried over (an asyncpg connect argument psycopg
has no name for, a pool without a connect function) is a ``ConfigError`` in one sentence.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool, QueuePool

from scheduler.config import ConfigError, Settings
from scheduler.database.engine import is_service_engine, ping_when_idle, settings_per_transaction

logger = logging.getLogger(__name__)

TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


class HostEngineWarning(UserWarning):
    """A host's engine cannot be given some of the service's protections."""


# asyncpg's connect arguments psycopg knows under another name; every other one is refused
_ASYNCPG_NAMES = {"host": "host", "port": "port", "user": "user", "password": "password", "database": "dbname"}


def is_async(engine: Any) -> bool:
    """An ``AsyncEngine``, or the ``sync_engine`` of one (whose connections need a greenlet)."""
    sync = getattr(engine, "sync_engine", engine)
    return bool(getattr(getattr(sync, "dialect", None), "is_async", False))


def connect_parameters(engine: Any) -> dict[str, Any] | None:
    """The keyword arguments ``engine``'s pool connects with: its URL's, merged with the
    ``connect_args`` it was created with. SQLAlchemy keeps them only in the closure of the
    connect function ``create_engine`` gives the pool (``cparams``, private API read here
    only). ``None`` when the pool's connect function is not that one (a ``creator=`` of the
    host's, another SQLAlchemy)."""
    creator: Any = getattr(getattr(engine, "pool", None), "_creator", None)
    code = getattr(creator, "__code__", None)
    if code is None or "cparams" not in code.co_freevars or creator.__closure__ is None:
        return None
    cell = creator.__closure__[code.co_freevars.index("cparams")]
    return dict(cell.cell_contents)


def sync_twin(engine: Any, role: str = "engine") -> Engine:
    """The sync psycopg 3 engine twin of the host's async ``engine`` (or its ``sync_engine``):
    the same URL and connect arguments on ``postgresql+psycopg``, its pool sized as the
    host's (size, overflow, timeout); a ``ConfigError`` naming what cannot be carried over."""
    sync: Engine = getattr(engine, "sync_engine", engine)
    name, driver = sync.dialect.name, sync.dialect.driver
    where = f"the async {role} passed to SchedulerService ({name}+{driver})"
    if name != "postgresql" or driver not in {"psycopg", "asyncpg"}:
        raise ConfigError(f"{where} is on a driver the scheduler cannot mirror: pass an AsyncEngine on "
                          "postgresql+psycopg_async:// or postgresql+asyncpg://, "
                          "or a sync postgresql+psycopg:// engine")
    params = connect_parameters(sync)
    if params is None:
        raise ConfigError(f"{where} has a pool without SQLAlchemy's connect function (a creator= of its own), so "
                          f"its connect arguments cannot be copied: pass a sync postgresql+psycopg:// engine too "
                          f"(engine=) and keep the async one for the host's own code")
    params.pop("context", None)  # the async dialect's adapters; the sync dialect brings its own
    if driver == "asyncpg":
        params = _psycopg_names(params, where)
    url = sync.url.set(drivername="postgresql+psycopg", query={})
    pool = sync.pool
    if isinstance(pool, QueuePool):
        sizing: dict[str, Any] = {"pool_size": pool.size(), "max_overflow": pool._max_overflow,
                                  "pool_timeout": pool.timeout()}
    elif isinstance(pool, NullPool):
        sizing = {"poolclass": NullPool}
    else:
        sizing = {}
    return create_engine(url, connect_args=params, **sizing)


def _psycopg_names(params: dict[str, Any], where: str) -> dict[str, Any]:
    """asyncpg's connect arguments under psycopg's names; a ``ConfigError`` for any other."""
    unknown = sorted(set(params) - set(_ASYNCPG_NAMES) - {"server_settings"})
    if unknown:
        raise ConfigError(f"{where} connects with asyncpg arguments psycopg has no name for ({', '.join(unknown)}): "
                          f"pass a sync postgresql+psycopg:// engine too (engine=) with the same settings")
    named = {_ASYNCPG_NAMES[key]: value for key, value in params.items() if key in _ASYNCPG_NAMES}
    settings = params.get("server_settings") or {}
    if settings:
        # libpq's options: each -c key=value, a space or backslash in a value escaped
        named["options"] = " ".join(
            f"-c {key}={str(value).replace(chr(92), chr(92) * 2).replace(' ', chr(92) + ' ')}"
            for key, value in settings.items())
    return named


def check_driver(engine: Engine, role: str = "engine") -> None:
    """Refuse an engine on another driver than psycopg 3, in a sentence."""
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
        raise ConfigError(
            f"the {role} passed to SchedulerService uses {engine.dialect.name}+{engine.dialect.driver}; the "
            f"scheduler runs on PostgreSQL through psycopg 3 only: create it with a postgresql+psycopg:// URL")


def for_scheduler(engine: Engine, settings: Settings, role: str = "engine") -> Engine:
    """The engine the service works through on ``engine``: itself when ``make_engine`` built
    it (its sessions carry the service's settings), else a view of the host's engine that
    gives every transaction the service's timeouts (see the module)."""
    if is_service_engine(engine):
        return engine
    check_driver(engine, role)
    view = engine.execution_options()
    # an execution option of the engine, or create_engine(isolation_level=...) (the dialect's,
    # applied at each connect)
    isolation = (engine.get_execution_options().get("isolation_level")
                 or getattr(engine.dialect, "_on_connect_isolation_level", None))
    if str(isolation).upper() == "AUTOCOMMIT":
        message = (f"the {role} passed to SchedulerService runs in AUTOCOMMIT: its transactions cannot be "
                   f"given {', '.join(f'{name}={value}' for name, value in _values(settings))}, so a stuck "
                   f"statement or a frozen replica is not bounded (DEC-11); pass an engine with transactions")
        warnings.warn(message, HostEngineWarning, stacklevel=3)
        logger.warning(message)
        return view
    settings_per_transaction(view, settings, search_path=None)
    return view


def loop_engine_like(engine: Engine, settings: Settings, pool_size: int) -> Engine | None:
    """A small pool of the loop's own, made like the host's ``engine`` (same URL, same
    connect function), with the service's timeouts per transaction; ``None`` (the loop then
    shares the host's pool, with a warning) when the host's pool offers no connect function."""
    creator: Any = getattr(engine.pool, "_creator", None)
    if creator is None:
        message = ("the engine passed to SchedulerService has a pool without a connect function to copy: the "
                   "loop shares the host's pool (pass loop_engine= to give it its own)")
        warnings.warn(message, HostEngineWarning, stacklevel=3)
        logger.warning(message)
        return None
    pool = QueuePool(creator, pool_size=pool_size, max_overflow=0, timeout=settings.pool_timeout_seconds)
    own = create_engine(engine.url, pool=pool)
    ping_when_idle(own, settings.pool_ping_after_idle_seconds)
    settings_per_transaction(own, settings, search_path=None)
    return own


def _values(settings: Settings) -> list[tuple[str, int]]:
    return list(zip(TIMEOUTS, (settings.statement_timeout_ms, settings.lock_timeout_ms,
                               settings.idle_in_transaction_timeout_ms), strict=True))
