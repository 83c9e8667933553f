"""Connections: the configured database, or an embedded PostgreSQL (the ``pgserver`` wheel).

A newcomer needs nothing but pip: without ``DATABASE_URL`` the service starts (or joins)
an embedded server kept in ``<data dir>/pgdata`` and uses a database named ``scheduler``.
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from scheduler.config import ConfigError, Settings
from scheduler.database import urls
from scheduler.database.queries import DEFAULT_SCHEMA, Statements, quoted

if TYPE_CHECKING:
    from scheduler.database.schema import MigrationResult

logger = logging.getLogger(__name__)

# The zone every session of the service runs in (DEC-UTC).
SESSION_TIME_ZONE = "UTC"
EMBEDDED_DATABASE = "scheduler"

# Keep a reference so the embedded server is not stopped while this process uses it.
_embedded: dict[Path, Any] = {}


def embedded_server_uri(pgdata: Path) -> str:
    """Start (or join) the embedded PostgreSQL in ``pgdata``; return its libpq URI."""
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR
        # (root in CI) it warns and falls back to /tmp, which is what we want anyway.
        warnings.simplefilter("ignore")
        try:
            import pgserver  # imported lazily: only the embedded path needs it
        except ImportError:
            raise ConfigError(
                "DATABASE_URL is not set and the embedded PostgreSQL is not installed: set DATABASE_URL to your "
                "database (postgresql://user:password@host/db), or install the extra that brings it: "
                "pip install 'nudging-scheduler[embedded]'") from None

    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = _embedded.get(pgdata)
    if server is None:
        logger.info("starting embedded PostgreSQL in %s", pgdata)
        server = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        _embedded[pgdata] = server
    return str(server.get_uri())


def stop_embedded_servers() -> None:
    """Stop the embedded servers this process started (pgserver leaves one running while
    another process still uses it), so a stopped ``serve`` leaves no postmaster behind."""
    for pgdata in list(_embedded):
        server = _embedded.pop(pgdata)
        logger.info("stopping embedded PostgreSQL in %s", pgdata)
        server.cleanup()


def socket_dir_of(uri: str) -> str | None:
    """The Unix socket directory in a libpq URI such as ``postgresql://u@/db?host=/tmp/x``."""
    hosts = parse_qs(urlparse(uri).query).get("host")
    return hosts[0] if hosts else None


def sqlalchemy_url(uri: str, database: str | None = None) -> str:
    """Turn a libpq URI (as pgserver prints, or a DATABASE_URL in any multi-host form) into a
    SQLAlchemy URL for psycopg 3 that keeps every host (``scheduler.database.urls``)."""
    return urls.sqlalchemy_url(uri, database)


# SQLSTATEs of CREATE DATABASE losing a race: the name exists, or two creators collided
# on pg_database's unique index before either committed.
_ALREADY_CREATED = {"42P04", "23505"}


def run_database_ddl(conn: Connection, template: str, name: str) -> None:
    """Run ``template`` (``CREATE DATABASE {}`` and the like) with ``name`` quoted as an
    identifier by psycopg: DDL cannot bind a name, and no character of it is special."""
    from psycopg import sql

    driver = conn.connection.driver_connection
    assert driver is not None
    driver.execute(sql.SQL(template).format(sql.Identifier(name)))


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` on the server behind ``admin_url`` if it does not exist.

    Two processes may ensure the same database at once (two commands on a fresh data
    directory): the one that loses the race finds it created, which is what it wanted."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).scalar()
            if not exists:
                try:
                    run_database_ddl(conn, "CREATE DATABASE {}", name)
                except psycopg.Error as exc:
                    if exc.sqlstate not in _ALREADY_CREATED:
                        raise
    finally:
        engine.dispose()


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, ending any session still connected to it."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            run_database_ddl(conn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
    finally:
        engine.dispose()


def create_migrated_database(admin_url: str, name: str, settings: Settings | None = None) -> str:
    """Create database ``name`` (it must not exist yet) on the server behind ``admin_url``,
    migrate it, and return its SQLAlchemy URL: the scratch databases of the simulation,
    the benchmarks and the fault scenarios."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            run_database_ddl(conn, "CREATE DATABASE {}", name)
    finally:
        admin.dispose()
    url = urls.sqlalchemy_url(admin_url, name)
    engine = make_engine(url, settings)
    try:
        migrate(engine, schema=settings.database_schema if settings is not None else DEFAULT_SCHEMA)
    finally:
        engine.dispose()
    return url


def resolve_database_url(settings: Settings) -> str:
    """The SQLAlchemy URL to use: ``DATABASE_URL`` if set, else the embedded server (never in
    production: a ``ConfigError`` naming ``DATABASE_URL``, DEC-SAFE-DEFAULTS)."""
    if settings.database_url:
        return sqlalchemy_url(settings.database_url)
    if settings.environment == "production":
        raise ConfigError(
            "SCHEDULER_ENV=production never starts an embedded PostgreSQL: set DATABASE_URL to the "
            "production database (postgresql://user:password@host/db)")
    uri = embedded_server_uri(settings.data_dir / "pgdata")
    ensure_database(sqlalchemy_url(uri), EMBEDDED_DATABASE)
    return sqlalchemy_url(uri, EMBEDDED_DATABASE)


def make_engine(url: str, settings: Settings | None = None, **kwargs: Any) -> Engine:
    """An engine with the service's timeouts on every connection (``settings``, or
    ``Settings.from_env()`` when none are given).

    ``statement_timeout`` and ``lock_timeout`` bound how long one stuck statement (an
    operator holding a lock, say) can hold up a request or a poll; a connection
    that sat in the pool longer than ``pool_ping_after_idle_seconds`` is pinged before use
    (``ping_when_idle``), which lets the pool heal after a database restart without
    restarting the process.

    With ``settings.transaction_pooling`` (``SCHEDULER_TRANSACTION_POOLING``, for a
    transaction-pooling proxy such as PgBouncer in ``pool_mode = transaction``) each
    transaction may run on another server session, so nothing may live in a session:
    psycopg prepares no statements (a statement prepared on one server is unknown on the
    next), and the timeouts (and the search_path) travel with every transaction's first
    statement (``set_config(..., true)``, i.e. ``SET LOCAL``: ``settings_per_transaction``)
    instead of in the ``options`` startup parameter, which PgBouncer refuses ("unsupported
    startup parameter: options").

    Their sessions' ``search_path`` is ``public,<schema>`` (``service_search_path``): every
    statement of the service names the scheduler's schema (DEC-SCHEMA), raw SQL through these
    engines finds its tables too.

    Every session runs with ``TimeZone`` UTC (DEC-UTC), whatever the server's or the
    database's default, so times read back (``clock_timestamp()``, a row's ``trigger_at``) are
    UTC and every instant of the storable range reads back (``core.store``); behind
    the pooler it travels per transaction with the timeouts.

    A frozen peer holds nothing for long (DEC-11): PostgreSQL ends a session that
    sits idle inside a transaction longer than ``idle_in_transaction_timeout_ms`` (a frozen
    replica, a paused VM, a stopped proxy), which releases the batch's row and participant
    locks to the other replicas; TCP keepalives and ``tcp_user_timeout`` let this side give
    up on a database host that vanished (``tcp_parameters``).
    """
    # Without settings, the environment's, like every other part of the service.
    settings = settings if settings is not None else Settings.from_env()
    connect_args: dict[str, Any] = {"connect_timeout": 10, **tcp_parameters(settings)}
    if settings.transaction_pooling:
        connect_args["prepare_threshold"] = None
    else:
        connect_args["options"] = (
            f"-c statement_timeout={settings.statement_timeout_ms} "
            f"-c lock_timeout={settings.lock_timeout_ms} "
            f"-c idle_in_transaction_session_timeout={settings.idle_in_transaction_timeout_ms} "
            f"-c TimeZone={SESSION_TIME_ZONE} "
            f"-c search_path={service_search_path(settings)}"
        )
    connect_args.update(kwargs.pop("connect_args", {}))
    kwargs.setdefault("pool_timeout", settings.pool_timeout_seconds)
    # every multi-host form written the one way the dialect hands to libpq whole
    engine = create_engine(urls.sqlalchemy_url(url), connect_args=connect_args, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        ping_when_idle(engine, settings.pool_ping_after_idle_seconds)
    if settings.transaction_pooling:
        settings_per_transaction(engine, settings, search_path=service_search_path(settings))
    from scheduler.database.pipeline import attach

    attach(engine)  # the pipeline's listeners, on this engine of the service's own (DEC-DB)
    _SERVICE_ENGINES.add(engine)
    return engine


# The engines ``make_engine`` built: they carry the service's settings in every session (a
# host's engine is given them per transaction instead, ``scheduler.database.host_engine``).
_SERVICE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def is_service_engine(engine: Engine) -> bool:
    """Whether ``make_engine`` built ``engine`` (its sessions carry the service's settings)."""
    return engine in _SERVICE_ENGINES


def service_search_path(settings: Settings) -> str:
    """The search_path of the service's own sessions: ``public`` first, then the scheduler's
    schema. Every statement of the service names its schema and never needs it; it lets raw
    SQL on these sessions (an operator's script, the benchmarks' and the scenarios' checks)
    find the scheduler's tables, and a host's ``public`` tables still come first (DEC-SCHEMA)."""
    return f"public,{quoted(settings.database_schema)}"


def settings_per_transaction(engine: Engine, settings: Settings, *, search_path: str | None) -> None:
    """Give every transaction on ``engine`` the service's timeouts and time zone (DEC-UTC), and
    ``search_path`` when not ``None``, with ``set_config(..., true)``, i.e. ``SET LOCAL``: nothing lives in the
    session, which a transaction-pooling proxy or a host shares with others.

    The settings travel with the transaction's first statement: the command is deferred
    (``scheduler.database.pipeline.defer``), so a pipelined send (a poll's) carries it in its
    own message at no extra round trip, and any other statement has it run just ahead of it.
    A transaction that runs no statement sends nothing."""
    from scheduler.database.pipeline import attach, command, defer_on

    attach(engine)  # the deferred command needs the pipeline's listeners on this engine
    values = {"statement": str(settings.statement_timeout_ms), "lock": str(settings.lock_timeout_ms),
              "idle": str(settings.idle_in_transaction_timeout_ms), "zone": SESSION_TIME_ZONE,
              "search_path": search_path}
    # names no table: the default schema's statements are every schema's here
    compiled = Statements.of()["set_local_settings"].bindparams(**values).compile(
        dialect=engine.dialect, compile_kwargs={"literal_binds": True})
    step = command(str(compiled))

    @event.listens_for(engine, "begin")
    def _settings_per_transaction(conn: Connection) -> None:
        defer_on(conn, step)


def ping_when_idle(engine: Engine, after_seconds: float, monotonic: Callable[[], float] = time.monotonic) -> None:
    """Ping a pooled connection before use (SQLAlchemy's ``pool_pre_ping``), except for a
    poll's connection used less than ``after_seconds`` ago (``polling``; ``0``: always ping).

    The pre-ping costs a round trip on every checkout: a poll in a burst, which takes its
    connection back a millisecond after it returned it, paid one round trip in three for it.
    A connection used that recently is as alive as a ping would show. If the database
    restarted in that moment, the poll fails whole and the next one heals (REL-2,
    as for a connection that dies mid-batch); a request is always pinged, so it never sees a
    connection that died while idle. The time here is the host's monotonic clock: it says
    how long a socket sat unused and decides nothing about any event.
    """
    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _returned(dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = monotonic()  # just connected, or just used

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        returned = record.info.get(_RETURNED_AT)
        if _POLLING.get() and returned is not None and monotonic() - returned < after_seconds:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:
            if not engine.dialect.is_disconnect(exc, dbapi_connection, None):
                raise
            alive = False
        if not alive:
            # the pool discards this connection and checks out a fresh one (up to three times)
            raise DisconnectionError("the pooled connection did not answer a ping")


@contextmanager
def polling() -> Iterator[None]:
    """A poll takes its connection here: one used a moment ago is not pinged (``ping_when_idle``)."""
    token = _POLLING.set(True)
    try:
        yield
    finally:
        _POLLING.reset(token)


_POLLING: ContextVar[bool] = ContextVar("scheduler.database.engine.polling", default=False)
_RETURNED_AT = "scheduler.database.engine.returned_at"


# Keepalive probes: every this many seconds once the first one goes unanswered, this many times.
KEEPALIVES_INTERVAL_SECONDS = 10
KEEPALIVES_COUNT = 3


def tcp_parameters(settings: Settings) -> dict[str, Any]:
    """libpq's dead-peer detection for a TCP connection to the database (ignored on a Unix
    socket): keepalive probes after ``tcp_keepalives_idle_seconds`` of silence, and a send
    left unacknowledged for ``tcp_user_timeout_ms`` ends the connection (0: the kernel's)."""
    return {
        "keepalives": 1,
        "keepalives_idle": settings.tcp_keepalives_idle_seconds,
        "keepalives_interval": KEEPALIVES_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVES_COUNT,
        "tcp_user_timeout": settings.tcp_user_timeout_ms,
    }


def database_time(engine: Engine) -> datetime:
    """The database server's current time (``DatabaseClock`` measures its offset with it)."""
    with engine.connect() as conn:
        value = conn.execute(Statements.of()["database_clock"]).scalar_one()  # names no table
    if not isinstance(value, datetime):
        raise TypeError(f"clock_timestamp() returned {value!r}")
    return value


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def migrate(engine: Engine, revision: str = "head", schema: str = DEFAULT_SCHEMA) -> MigrationResult:
    """Bring the scheduler's schema up to ``revision`` with Alembic (never ``create_all``);
    see ``scheduler.database.schema`` (Alembic is imported only then)."""
    from scheduler.database.schema import migrate as migrate_schema

    return migrate_schema(engine, revision, schema)
