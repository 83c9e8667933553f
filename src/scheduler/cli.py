"""The ``scheduler`` command (also ``python -m scheduler``). Every command has ``--help``."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import logging
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from scheduler.config import ConfigError, Settings

Command = Callable[[argparse.Namespace, Settings], int]


def _engine(settings: Settings):  # type: ignore[no-untyped-def]
    from scheduler.db import make_engine, migrate, resolve_database_url

    engine = make_engine(resolve_database_url(settings), settings)
    migrate(engine)
    return engine


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from scheduler.app import create_app
    from scheduler.db import stop_embedded_servers

    if settings.effective_jwt_secret() is None and not (settings.jwt_public_key or settings.jwks_url):
        if settings.environment == "production":
            raise ConfigError("production mode needs SCHEDULER_JWT_SECRET, SCHEDULER_JWT_PUBLIC_KEY or SCHEDULER_JWKS_URL")
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        settings.secret_file.write_text(secrets.token_urlsafe(48))
        settings.secret_file.chmod(0o600)
        print(f"generated a development JWT secret in {settings.secret_file}; "
              "`scheduler token --scope nudging.admin` mints tokens for it", file=sys.stderr)
    # Bind first: a port that is taken is a clear message before anything else starts.
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {_bind_problem(exc)}", file=sys.stderr)
        return 1
    announce = (f"scheduler listening on http://{args.host}:{args.port} "
                f"({settings.mode} mode: poll every {settings.poll_seconds:g}s, batch {settings.batch_size})")
    try:
        _engine(settings).dispose()  # migrate; the service opens (and disposes) its own engines
        app = create_app(settings)
        server = _announcing_server(
            uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=10), announce
        )
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


def _announcing_server(config: Any, announce: str) -> Any:
    """uvicorn's server, saying ``announce`` only once the socket is served and the lifespan
    (the polling loop) has started. (uvicorn is imported here: only ``serve`` needs it.)"""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(announce, file=sys.stderr, flush=True)

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
    _engine(settings).dispose()
    print("database schema is up to date")
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.auth import mint_token

    secret = settings.effective_jwt_secret()
    if secret is None:
        print("no JWT secret configured: set SCHEDULER_JWT_SECRET, or run `scheduler serve` once "
              f"to generate one in {settings.secret_file}", file=sys.stderr)
        return 2
    print(mint_token(secret, scope=args.scope, subject=args.sub, ttl_seconds=args.ttl,
                     audience=settings.jwt_audience, issuer=settings.jwt_issuer))
    return 0


def cmd_events_list(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler import store
    from scheduler.db import make_sessionmaker

    engine = _engine(settings)
    rows = store.list_events(make_sessionmaker(engine), status=args.status, user_id=args.user_id, limit=args.limit)
    engine.dispose()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no scheduled events")
    for row in rows:
        error = f"  last_error={row['last_error']}" if row["last_error"] else ""
        print(f"{row['id']}  {row['status']:<10} trigger_at={row['trigger_at']}  user={row['user_id']}{error}")
    return 0


def cmd_events_reset(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler import store
    from scheduler.clock import SystemClock
    from scheduler.db import make_sessionmaker

    engine = _engine(settings)
    row = store.reset_event(make_sessionmaker(engine), args.id, SystemClock().now())
    engine.dispose()
    if row is None:
        print(f"no scheduled event with id {args.id}", file=sys.stderr)
        return 1
    print(f"{row['id']} is pending again (trigger_at={row['trigger_at']})")
    return 0


def cmd_rules_list(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.rules import load_catalogue

    catalogue = load_catalogue(settings.rules_dir)
    summaries = [r.summary() for r in catalogue.rules]
    if args.json:
        print(json.dumps(summaries, indent=2))
        return 0
    for s in summaries:
        state = "" if s["enabled"] else "  (disabled)"
        print(f"{s['id']:<28} {s['frequency']:<8} {s['kind']:<10} {', '.join(s['scenarios'])}{state}")
    return 0


def _positive_int(raw: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from scheduler.types import EventStatus

    parser = argparse.ArgumentParser(
        prog="scheduler",
        description="Scheduled events for the nudging platform: store now, dispatch later. "
        "Without DATABASE_URL every command uses an embedded PostgreSQL in SCHEDULER_DATA_DIR "
        "(default ./.scheduler).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="migrate, then run the API and its polling loop under uvicorn",
                           description="Migrate the database, then serve the API; the lifespan runs the loop.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser("migrate", help="bring the database schema up to date (Alembic)",
                         description="Run the Alembic migrations up to head.")
    mig.set_defaults(func=cmd_migrate)

    token = sub.add_parser("token", help="mint a local HS256 token (prints only the token)",
                           description="Mint a token signed with the configured (or generated) secret.")
    token.add_argument("--scope", default=None,
                       help="space-separated scopes, e.g. nudging.admin or nudging.ingest; omit for a participant")
    token.add_argument("--sub", default="local-operator", help="the subject claim (default local-operator)")
    token.add_argument("--ttl", type=_positive_int, default=3600,
                       help="seconds until it expires, at least 1 (default 3600)")
    token.set_defaults(func=cmd_token)

    events = sub.add_parser("events", help="inspect and reset scheduled events",
                            description="Operators' view of the scheduled_events table.")
    events_sub = events.add_subparsers(dest="events_command", required=True, metavar="ACTION")
    ev_list = events_sub.add_parser("list", help="list rows, newest change first",
                                    description="List scheduled events, newest change first.")
    ev_list.add_argument("--status", choices=[str(s) for s in EventStatus], help="only rows in this status")
    ev_list.add_argument("--user-id", help="only this participant's rows")
    ev_list.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50)")
    ev_list.add_argument("--json", action="store_true", help="print JSON")
    ev_list.set_defaults(func=cmd_events_list)
    ev_reset = events_sub.add_parser("reset", help="reset a row by hand to pending",
                                     description="Back to pending, dispatched_at and last_error cleared.")
    ev_reset.add_argument("id", help="the scheduled event's id")
    ev_reset.set_defaults(func=cmd_events_reset)

    rules = sub.add_parser("rules", help="the rule catalogue", description="Inspect the loaded rule catalogue.")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    rules_list = rules_sub.add_parser("list", help="list rules: id, frequency, kind, scenarios",
                                      description="List the loaded rules (SCHEDULER_RULES_DIR or the examples).")
    rules_list.add_argument("--json", action="store_true", help="print JSON")
    rules_list.set_defaults(func=cmd_rules_list)

    _add_extensions(sub)
    return parser


EXTENSIONS = (("harness.cli", "add_simulate_command"), ("bench.cli", "add_bench_command"))


def _add_extensions(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that live in the other packages of this distribution (the simulation
    harness, the benchmarks). They ship together, so a failing import is a bug to report,
    never a reason to drop the subcommand silently."""
    for module_name, hook in EXTENSIONS:
        getattr(importlib.import_module(module_name), hook)(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # pgserver narrates every pg_ctl call at INFO; keep its warnings only.
    logging.getLogger("pgserver").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command with settings from the environment; a bad setting is exit 2."""
    try:
        result: int = args.func(args, Settings.from_env())
        return result
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
