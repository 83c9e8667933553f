"""The ``scheduler`` command (also ``python -m scheduler``). Every command has ``--help``."""

from __future__ import annotations

import argparse
import contextlib
import errno
import getpass
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from scheduler import extensions
from scheduler.config import ConfigError, Settings

Command = Callable[[argparse.Namespace, Settings], int]


def _engine(settings: Settings):  # type: ignore[no-untyped-def]
    from sqlalchemy.exc import OperationalError

    from scheduler.database.engine import make_engine, migrate, resolve_database_url

    engine = make_engine(resolve_database_url(settings), settings)
    try:
        migrate(engine)
    except OperationalError as exc:
        if "unsupported startup parameter" not in str(exc):
            raise
        engine.dispose()
        # PgBouncer refuses the `options` we send the timeouts in: say what to set.
        raise ConfigError(
            "the server refused a startup parameter (" + str(exc.orig).strip().splitlines()[-1] + "): behind a "
            "transaction-pooling proxy such as PgBouncer, set SCHEDULER_TRANSACTION_POOLING=true"
        ) from None
    return engine


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from scheduler.database.engine import stop_embedded_servers
    from scheduler.web.app import create_app

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
            uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=10), announce,
            on_exit=app.state.service.streams.close_all,
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


def _announcing_server(config: Any, announce: str, on_exit: Callable[[], object] | None = None) -> Any:
    """uvicorn's server, saying ``announce`` only once the socket is served and the lifespan
    (the polling loop) has started, and calling ``on_exit`` as soon as a signal asks it to
    stop: open streams end then, rather than hold the shutdown for its whole timeout.
    (uvicorn is imported here: only ``serve`` needs it.)"""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(announce, file=sys.stderr, flush=True)

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
    _engine(settings).dispose()
    print("database schema is up to date")
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.web.auth import mint_token

    secret = settings.effective_jwt_secret()
    if secret is None:
        print("no JWT secret configured: set SCHEDULER_JWT_SECRET, or run `scheduler serve` once "
              f"to generate one in {settings.secret_file}", file=sys.stderr)
        return 2
    print(mint_token(secret, scope=args.scope, subject=args.sub, ttl_seconds=args.ttl,
                     audience=settings.jwt_audience, issuer=settings.jwt_issuer))
    return 0


def cmd_events_list(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.core import store
    from scheduler.database.engine import make_sessionmaker

    engine = _engine(settings)
    rows = store.list_events(make_sessionmaker(engine), status=args.status, user_id=args.user_id, limit=args.limit,
                             external_key=args.external_key)
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


def _cli_actor(args: argparse.Namespace) -> str:
    if args.actor:
        return str(args.actor)
    try:
        return "cli:" + getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def cmd_events_show(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application import audit
    from scheduler.core import store
    from scheduler.database.engine import make_sessionmaker

    engine = _engine(settings)
    sessions = make_sessionmaker(engine)
    row = store.get_event(sessions, args.id)
    notifications = audit.event_notifications(sessions, args.id) if row else []
    actions = audit.event_actions(sessions, args.id) if row else []
    engine.dispose()
    if row is None:
        print(f"no scheduled event with id {args.id}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**row, "notifications": notifications, "actions": actions}, indent=2))
        return 0
    facts = row.pop("facts")
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(f"{key:<{width}}  {'-' if value is None else value}")
    print("facts:")
    print("  " + json.dumps(facts, indent=2, sort_keys=True, ensure_ascii=False).replace("\n", "\n  "))
    print(f"notifications ({len(notifications)}):")
    for n in notifications:
        reason = f" ({n['reason']})" if n["reason"] else ""
        print(f"  {n['created_at']}  {n['status']}{reason}  {n['rule_id']}  {n['title']}")
    print(f"operator actions ({len(actions)}):")
    for a in actions:
        reason = f"  reason: {a['reason']}" if a["reason"] else ""
        print(f"  {a['at']}  {a['action']} by {a['actor']} ({a['source']}){reason}")
    return 0


def cmd_events_reset(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application import audit
    from scheduler.core.clock import SystemClock
    from scheduler.database.engine import make_sessionmaker

    filters = {"status": args.status, "event_type": args.event_type, "error_contains": args.error_contains}
    if args.id is not None and any(filters.values()):
        print("give either an ID or a filter (--status, --event-type, --error-contains), not both", file=sys.stderr)
        return 2
    if args.id is None and not any(filters.values()):
        print("give an ID, or a filter (--status, --event-type, --error-contains) to reset every matching row",
              file=sys.stderr)
        return 2
    clock = SystemClock()
    engine = _engine(settings)
    sessions = make_sessionmaker(engine)
    try:
        if args.id is not None:
            if args.dry_run:
                print(f"dry run: would reset {args.id}")
                return 0
            row = audit.reset_one(sessions, args.id, clock.now(), actor=_cli_actor(args), source="cli",
                                  reason=args.reason)
            if row is None:
                print(f"no scheduled event with id {args.id}", file=sys.stderr)
                return 1
            print(f"{row['id']} is pending again (trigger_at={row['trigger_at']})")
            return 0
        try:
            where = audit.EventFilter.from_mapping({k: v for k, v in filters.items() if v})
        except audit.FilterError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        as_of = clock.now()
        count = audit.count_matching(sessions, where, cap=args.cap)
        shown = f"more than {args.cap}" if count > args.cap else str(count)
        if args.dry_run:
            print(f"dry run: {shown} rows match and are not pending; they would be reset")
            return 0
        if not (args.reason or "").strip():
            print(f"{shown} rows match: a bulk reset needs --reason (recorded in the audit trail); "
                  "--dry-run only counts", file=sys.stderr)
            return 2
        print(f"resetting {min(count, args.cap)} rows in chunks of {audit.CHUNK} ...", file=sys.stderr)
        result = audit.bulk_reset(sessions, where, now=clock.now(), as_of=as_of, expected=count,
                                  actor=_cli_actor(args), source="cli", reason=args.reason, cap=args.cap)
        print(f"reset {result.reset} rows (audit #{result.action_id})")
        return 0
    finally:
        engine.dispose()
def cmd_events_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.core.clock import SystemClock
    from scheduler.database.engine import make_sessionmaker
    from scheduler.web.lifecycle import cancel_event

    engine = _engine(settings)
    try:
        result = cancel_event(make_sessionmaker(engine), now=SystemClock().now(),
                              event_id=None if args.key else args.id,
                              external_key=args.id if args.key else None, actor=_cli_actor(args))
    finally:
        engine.dispose()
    what = f"key {args.id}" if args.key else f"id {args.id}"
    if result.outcome == "missing" or result.row is None:
        print(f"no scheduled event with {what}", file=sys.stderr)
        return 1
    if result.outcome == "dispatched":
        print(f"{result.row['id']} was already dispatched at {result.row['dispatched_at']}; it stays dispatched",
              file=sys.stderr)
        return 1
    note = " (it already was)" if result.outcome == "already_cancelled" else ""
    print(f"{result.row['id']} is cancelled{note}")
    return 0


def cmd_events_history(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.database.engine import make_sessionmaker
    from scheduler.web.lifecycle import event_history

    engine = _engine(settings)
    try:
        entries = event_history(make_sessionmaker(engine), args.id)
    finally:
        engine.dispose()
    if entries is None:
        print(f"no scheduled event with id {args.id}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    for entry in entries:
        by = f"  by {entry['actor']}" if entry["actor"] else ""
        changed = "  ".join(
            f"{column}: {_short(before)} -> {_short(after)}" for column, (before, after) in entry["changes"].items()
        )
        print(f"{entry['at']}  {entry['change']:<10} {entry['status']:<10}{by}  {changed}".rstrip())
    return 0


def _short(value: object, width: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def cmd_rules_list(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.nudging.rules import load_catalogue

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
    """An argparse type: a whole number of at least 1, in ASCII digits (as the API reads them)."""
    from scheduler.web.params import digits_value

    value = digits_value(raw, 18)
    if value is None and raw.startswith("-") and digits_value(raw[1:], 18) is not None:
        value = -int(raw[1:])  # a negative number: say what the least is
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {raw!r}")
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
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at DEBUG level (otherwise commands print only their answer; serve logs at INFO)")
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
    ev_list.add_argument("--external-key", help="only the row of this external key")
    ev_list.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50)")
    ev_list.add_argument("--json", action="store_true", help="print JSON")
    ev_list.set_defaults(func=cmd_events_list)
    ev_show = events_sub.add_parser("show", help="one row: every column, its facts, notifications and actions",
                                    description="Show one scheduled event with its notifications and operator actions.")
    ev_show.add_argument("id", help="the scheduled event's id")
    ev_show.add_argument("--json", action="store_true", help="print JSON")
    ev_show.set_defaults(func=cmd_events_show)
    ev_reset = events_sub.add_parser(
        "reset", help="reset one row, or every row matching a filter, to pending",
        description="Back to pending, dispatched_at and last_error cleared. Give an ID, or a filter to reset "
        "every matching row that is not pending (count it first with --dry-run; a bulk reset needs --reason). "
        "Every reset is recorded in the audit trail (GET /admin/audit, the console's audit page).",
        epilog="example: scheduler events reset --status failed --error-contains time_scope --dry-run")
    ev_reset.add_argument("id", nargs="?", help="the scheduled event's id (omit to reset by filter)")
    ev_reset.add_argument("--status", choices=["dispatched", "failed"], help="only rows in this status")
    ev_reset.add_argument("--event-type", help="only rows of this event type")
    ev_reset.add_argument("--error-contains", help="only rows whose last_error contains this text (any case)")
    ev_reset.add_argument("--dry-run", action="store_true", help="only count (or name) what would be reset")
    ev_reset.add_argument("--reason", help="why: recorded in the audit trail (required for a reset by filter)")
    ev_reset.add_argument("--actor", help="who, for the audit trail (default cli:$USER)")
    ev_reset.add_argument("--cap", type=int, default=10_000, help="reset at most this many rows (default 10000)")
    ev_reset.set_defaults(func=cmd_events_reset)
    ev_cancel = events_sub.add_parser(
        "cancel", help="cancel a pending or failed row (never a dispatched one)",
        description="Put a pending or failed row in the terminal status cancelled; the loop never "
        "takes it. A dispatched row stays dispatched (exit 1). Re-posting its key re-arms it.")
    ev_cancel.add_argument("id", help="the scheduled event's id (or its external key with --key)")
    ev_cancel.add_argument("--key", action="store_true", help="ID is an external_key")
    ev_cancel.add_argument("--actor", help="who, for the row's history (default cli:$USER)")
    ev_cancel.set_defaults(func=cmd_events_cancel)
    ev_history = events_sub.add_parser(
        "history", help="every change of a row, oldest first",
        description="Stored, rewritten (with what changed), dispatched, failed, reset, cancelled; "
        "with the token's subject where a token did it.")
    ev_history.add_argument("id", help="the scheduled event's id")
    ev_history.add_argument("--json", action="store_true", help="print JSON")
    ev_history.set_defaults(func=cmd_events_history)

    rules = sub.add_parser("rules", help="the rule catalogue", description="Inspect the loaded rule catalogue.")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    rules_list = rules_sub.add_parser("list", help="list rules: id, frequency, kind, scenarios",
                                      description="List the loaded rules (SCHEDULER_RULES_DIR or the examples).")
    rules_list.add_argument("--json", action="store_true", help="print JSON")
    rules_list.set_defaults(func=cmd_rules_list)

    extensions.register(sub)  # simulate, bench: imported only when they run
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = extensions.parse_args(parser, argv)
    # A read prints only its answer: the embedded server's and Alembic's INFO lines appear
    # with --verbose; serve keeps INFO, since its log is what an operator watches.
    quiet = logging.INFO if args.command == "serve" else logging.WARNING
    logging.basicConfig(level=logging.DEBUG if args.verbose else quiet,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # pgserver narrates every pg_ctl call at INFO; keep its warnings only.
    logging.getLogger("pgserver").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    code = run_command(args)
    if args.command == "serve" and argv is None:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End a ``serve`` process that has already shut down cleanly, without the interpreter's
    teardown of every module (0.6 to 1.4 s on a busy two-core machine, more than the rest of
    the shutdown: a rolling restart waits for it). Everything that matters is done by then:
    the lifespan stopped the loop, the streams and the listener, the engines are disposed,
    the embedded PostgreSQL is stopped; the logs and stdio are flushed here. Only for the
    process's own command line (``argv is None``), never for a caller in the same process."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
