"""``scheduler serve``, ``migrate`` and ``token``: run the service, bring the schema up to date, mint a token."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import logging
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

from scheduler.config import ConfigError, Settings
from scheduler.types import Clock


def migrated_engine(settings: Settings, report: Callable[[str], None] | None = None):  # type: ignore[no-untyped-def]
    """An engine on the configured database, migrated to head; ``report`` hears what the
    migration did ("created schema scheduler at revision R", ...). A database it cannot
    migrate is a ``MigrationError`` (one sentence); a proxy refusing our startup options is a
    ``ConfigError`` saying what to set."""
    from scheduler.database.engine import make_engine, migrate, resolve_database_url
    from scheduler.database.schema import MigrationError

    engine = make_engine(resolve_database_url(settings), settings)
    try:
        result = migrate(engine, schema=settings.database_schema)
    except MigrationError as exc:
        engine.dispose()
        if "unsupported startup parameter" not in str(exc.__cause__):
            raise
        # PgBouncer refuses the `options` we send the timeouts in: say what to set.
        refused = str(getattr(exc.__cause__, "orig", exc.__cause__)).strip().splitlines()[-1]
        raise ConfigError(
            "the server refused a startup parameter (" + refused + "): behind a "
            "transaction-pooling proxy such as PgBouncer, set SCHEDULER_TRANSACTION_POOLING=true"
        ) from None
    if report is not None:
        report(result.sentence())
    return engine


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from scheduler.cli.http_timeouts import uvicorn_options
    from scheduler.database.engine import stop_embedded_servers
    from scheduler.service import create_app

    if settings.effective_jwt_secret() is None and not (settings.jwt_public_key or settings.jwks_url):
        if settings.environment == "production":
            raise ConfigError("production mode needs SCHEDULER_JWT_SECRET, SCHEDULER_JWT_PUBLIC_KEY "
                              "or SCHEDULER_JWKS_URL")
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        settings.secret_file.write_text(secrets.token_urlsafe(48))
        settings.secret_file.chmod(0o600)
        _say(settings, f"generated a development JWT secret in {settings.secret_file}; "
             "`scheduler token --scope nudging.admin` mints tokens for it")
    # Bind first: a port that is taken is a clear message before anything else starts.
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {_bind_problem(exc)}", file=sys.stderr)
        return 1
    announce = (f"scheduler listening on http://{args.host}:{args.port} "
                f"({settings.mode} mode: poll every {settings.poll_seconds:g}s, batch {settings.batch_size})")
    try:
        # migrate (saying what it did); the service opens (and disposes) its own engines
        migrated_engine(settings, report=lambda done: _say(settings, done)).dispose()
        app = create_app(settings)
        # JSON logs: uvicorn configures no formatter of its own, its lines reach ours
        log_config = uvicorn.config.LOGGING_CONFIG if settings.log_format == "text" else None
        server = _announcing_server(
            # the request's headers and body are bounded in time (SEC-20.1, SEC-20.2)
            uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=10, log_config=log_config,
                           **uvicorn_options(settings)),
            lambda: _say(settings, announce),
            on_exit=app.state.service.streams.close_all,
        )
        # What exists now (the modules, the app) lives as long as the process: frozen out of
        # the cyclic collector's passes, which a busy replica otherwise spends about a tenth of
        # its CPU on, walking these same objects again (docs/performance.md). This process's
        # own, never the library's: an embedding host decides for its process.
        gc.collect()
        gc.freeze()
        with _graceful_signals():
            server.run(sockets=[listener])
    finally:
        listener.close()
        stop_embedded_servers()  # the embedded PostgreSQL this process started, if any
    return 0


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (uvicorn listens on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _bind_problem(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return ("the port is already in use (another `scheduler serve`?); "
                "stop it or choose another port with --port")
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges); choose another port with --port"
    return str(exc)


def _say(settings: Settings, message: str) -> None:
    """What ``serve`` tells its operator: a plain line on stderr, or with JSON logs a log
    line like every other (a collector expects nothing else on the stream)."""
    if settings.log_format == "json":
        logging.getLogger("scheduler.serve").info(message)
    else:
        print(message, file=sys.stderr, flush=True)


def _announcing_server(config: Any, announce: Callable[[], None],
                       on_exit: Callable[[], object] | None = None) -> Any:
    """uvicorn's server, saying ``announce`` only once the socket is served and the lifespan
    (the polling loop) has started, and calling ``on_exit`` as soon as a signal asks it to
    stop: open streams end then, rather than hold the shutdown for its whole timeout.
    (uvicorn is imported here: only ``serve`` needs it.)"""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                announce()

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if on_exit is not None:
                on_exit()

    return AnnouncingServer(config)


@contextlib.contextmanager
def _graceful_signals() -> Iterator[list[int]]:
    """SIGTERM (what systemd, Docker and Kubernetes send) and SIGINT both mean: stop
    gracefully and exit 0. uvicorn handles the signal while serving, then raises it again
    with the handlers it found; these are those handlers, so the process goes on to stop
    its embedded PostgreSQL instead of dying of the signal."""
    received: list[int] = []

    def record(signum: int, frame: Any) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Migrate, then say what was done: "created schema scheduler at revision R", "schema
    scheduler: upgraded from R1 to R2" or "schema scheduler already at revision R"."""
    migrated_engine(settings, report=print).dispose()
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    import jwt

    from scheduler.web.http.auth import check_subject, mint_token

    try:
        check_subject(args.sub)  # the service would refuse the token (SEC-7.1): mint none
    except jwt.InvalidTokenError as exc:
        print(f"scheduler token: --sub: {exc}", file=sys.stderr)
        return 2
    secret = settings.effective_jwt_secret()
    if secret is None:
        print("no JWT secret configured: set SCHEDULER_JWT_SECRET, or run `scheduler serve` once "
              f"to generate one in {settings.secret_file}", file=sys.stderr)
        return 2
    print(mint_token(secret, scope=args.scope, subject=args.sub, ttl_seconds=args.ttl,
                     audience=settings.jwt_audience, issuer=settings.jwt_issuer, clock=_token_clock(settings)))
    return 0


def _token_clock(settings: Settings) -> Clock | None:
    """The clock the service judges tokens by (DEC-10): the configured database's, read once.
    The embedded server runs on this host, so its clock is this host's (``None``: the host's,
    and no server is started for a token). A database that cannot be read is said on stderr,
    and the host's clock stamps the token (the service's leeway absorbs a small skew)."""
    if not settings.database_url:
        return None
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.core.clock import synced_database_clock
    from scheduler.database.engine import make_engine, sqlalchemy_url

    engine = make_engine(sqlalchemy_url(settings.database_url), settings)
    try:
        return synced_database_clock(engine, warn_seconds=settings.clock_skew_warn_seconds)
    except SQLAlchemyError as exc:  # the database is down: a token is still useful, say what stamps it
        print(f"scheduler token: could not read the database's clock ({type(exc).__name__}); the token is "
              "stamped with this host's clock", file=sys.stderr)
        return None
    finally:
        engine.dispose()
