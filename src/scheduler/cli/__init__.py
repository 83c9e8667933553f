"""The ``scheduler`` command (also ``python -m scheduler``). Every command has ``--help``.

This module builds the parser and runs the command; the commands themselves are in
``serve`` (serve, migrate, token) and ``events`` (events, rules). The subcommands of the
other packages of this distribution (``simulate``, ``bench``) are registered by
``scheduler.extensions`` without importing them until they run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from scheduler import extensions
from scheduler.cli.arguments import actor_argument, reason_argument, text_argument
from scheduler.cli.events import (
    add_filter_options,
    cmd_events_cancel,
    cmd_events_history,
    cmd_events_list,
    cmd_events_reset,
    cmd_events_show,
    cmd_rules_list,
)
from scheduler.cli.events_import import add_import_parser
from scheduler.cli.participants import add_participants_parser
from scheduler.cli.serve import cmd_migrate, cmd_serve, cmd_token
from scheduler.cli.terminal import terminal_safe
from scheduler.cli.vapid import cmd_vapid_keys
from scheduler.config import ConfigError, DatabaseUnusable, Settings, log_format_of
from scheduler.observability.logs import configure_logging
from scheduler.whole_numbers import digits_value

Command = Callable[[argparse.Namespace, Settings], int]

DISTRIBUTION = "nudging-scheduler"  # the import name and the command are ``scheduler``


def version_line() -> str:
    """What ``scheduler --version`` prints: the installed distribution's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"scheduler {version(DISTRIBUTION)}"
    except PackageNotFoundError:  # the source tree on sys.path without an install
        return f"scheduler (version unknown: the distribution {DISTRIBUTION} is not installed)"


def _positive_int(raw: str) -> int:
    """An argparse type: a whole number of at least 1, in ASCII digits (as the API reads them)."""
    value = digits_value(raw, 18)
    if value is None and raw.startswith("-") and digits_value(raw[1:], 18) is not None:
        value = -int(raw[1:])  # a negative number: say what the least is
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {raw!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(raw: str) -> int:
    """An argparse type: a TCP port, 1 to 65535, in ASCII digits (0, "any free port", is not
    offered: ``serve`` announces the port it was given)."""
    value = digits_value(raw, 5)
    if value is None or not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {raw!r}")
    return value


def _add_by_filter_options(parser: argparse.ArgumentParser, verb: str, sources: frozenset[Any]) -> None:
    """The filter, --dry-run, --reason, --actor and --cap of a command that acts on one row or
    on every row a filter matches (``events reset``, ``events cancel``)."""
    from scheduler.application.commands import MAX_REASON
    from scheduler.database.models import NAME_LENGTH
    from scheduler.types import EventStatus

    add_filter_options(parser, statuses=[str(s) for s in EventStatus if s in sources])
    parser.add_argument("--dry-run", action="store_true", help=f"only count (or name) what would be {verb}")
    parser.add_argument("--reason", type=reason_argument,
                        help=f"why: recorded in the audit trail (required for a {verb} by filter; at most "
                        f"{MAX_REASON} characters)")
    parser.add_argument("--actor", type=actor_argument,
                        help="who, for the row's history and the audit trail (default cli:$USER; at most "
                        f"{NAME_LENGTH} characters)")
    parser.add_argument("--cap", type=_positive_int, default=10_000,
                        help=f"{verb} at most this many rows (default 10000)")


def build_parser() -> argparse.ArgumentParser:
    from scheduler.application.commands import CANCELLABLE, RESETTABLE
    from scheduler.types import EventStatus

    parser = argparse.ArgumentParser(
        prog="scheduler",
        description="Scheduled events for the nudging platform: store now, dispatch later. "
        "Without DATABASE_URL every command uses an embedded PostgreSQL in SCHEDULER_DATA_DIR "
        "(default ./.scheduler).",
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help=f"print the version of {DISTRIBUTION} and exit")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at DEBUG level (otherwise commands print only their answer; serve logs at INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="migrate, then run the API and its polling loop under uvicorn",
                           description="Migrate the database, then serve the API; the lifespan runs the loop.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port, 1 to 65535 (default 8000)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser(
        "migrate", help="bring the scheduler's schema up to date (Alembic), saying what it did",
        description="Run the Alembic migrations up to head in the scheduler's own PostgreSQL schema "
        "(SCHEDULER_DATABASE_SCHEMA, default scheduler), beside a host's tables and Alembic history. "
        "Prints what it did; a database it cannot migrate (an unknown revision, permission denied, unreachable) "
        "is exit 2.")
    mig.set_defaults(func=cmd_migrate)

    token = sub.add_parser("token", help="mint a local HS256 token (prints only the token)",
                           description="Mint a token signed with the configured (or generated) secret.")
    token.add_argument("--scope", default=None,
                       help="space-separated scopes, e.g. nudging.admin or nudging.ingest; omit for a participant")
    token.add_argument("--sub", default="local-operator", help="the subject claim (default local-operator)")
    token.add_argument("--ttl", type=_positive_int, default=3600,
                       help="seconds until it expires, at least 1 (default 3600)")
    token.set_defaults(func=cmd_token)

    events = sub.add_parser("events", help="inspect, import, reset and cancel scheduled events",
                            description="Operators' view of the scheduled_events table.")
    events_sub = events.add_subparsers(dest="events_command", required=True, metavar="ACTION")
    ev_list = events_sub.add_parser("list", help="list rows, newest change first",
                                    description="List scheduled events, newest change first.")
    add_filter_options(ev_list, statuses=[str(s) for s in EventStatus])
    ev_list.add_argument("--limit", type=_positive_int, default=50, help="at most this many rows (default 50)")
    ev_list.add_argument("--cursor", help="continue after the previous page (its cursor is printed on stderr)")
    ev_list.add_argument("--json", action="store_true", help="print JSON")
    ev_list.set_defaults(func=cmd_events_list)
    ev_show = events_sub.add_parser("show", help="one row: every column, its facts, notifications and actions",
                                    description="Show one scheduled event with its notifications and operator actions.")
    ev_show.add_argument("id", type=text_argument, help="the scheduled event's id")
    ev_show.add_argument("--json", action="store_true", help="print JSON")
    ev_show.set_defaults(func=cmd_events_show)
    ev_reset = events_sub.add_parser(
        "reset", help="reset one row, or every row matching a filter, to pending",
        description="Back to pending, dispatched_at and last_error cleared. Give an ID, or a filter to reset "
        "every matching row (count it first with --dry-run; a bulk reset needs --reason; --status failed "
        "leaves the others alone). "
        "Every reset is recorded in the audit trail (GET /admin/audit, the console's audit page).",
        epilog="example: scheduler events reset --status failed --error-contains time_scope --dry-run")
    ev_reset.add_argument("id", nargs="?", type=text_argument,
                          help="the scheduled event's id (omit to reset by filter)")
    _add_by_filter_options(ev_reset, "reset", RESETTABLE)
    ev_reset.set_defaults(func=cmd_events_reset)
    ev_cancel = events_sub.add_parser(
        "cancel", help="cancel a pending or failed row, or every such row matching a filter",
        description="Put pending or failed rows in the terminal status cancelled; the loop never "
        "takes them. Give an ID (a dispatched row stays dispatched: exit 1; re-posting its key re-arms "
        "it), or a filter to cancel every matching pending or failed row (count it first with --dry-run; "
        "a cancel by filter needs --reason). Every cancel is recorded in the row's history, a cancel by "
        "filter in the audit trail too, as the console's.",
        epilog="example: scheduler events cancel --status pending --event-type demo --dry-run")
    ev_cancel.add_argument("id", nargs="?", type=text_argument,
                           help="the scheduled event's id, or its external key with --key "
                           "(omit to cancel by filter)")
    ev_cancel.add_argument("--key", action="store_true", help="ID is an external_key")
    _add_by_filter_options(ev_cancel, "cancel", CANCELLABLE)
    ev_cancel.set_defaults(func=cmd_events_cancel)
    add_import_parser(events_sub)
    ev_history = events_sub.add_parser(
        "history", help="every change of a row, oldest first",
        description="Stored, rewritten (with what changed), dispatched, failed, reset, cancelled; "
        "with the token's subject where a token did it.")
    ev_history.add_argument("id", type=text_argument, help="the scheduled event's id")
    ev_history.add_argument("--json", action="store_true", help="print JSON")
    ev_history.set_defaults(func=cmd_events_history)

    add_participants_parser(sub)

    rules = sub.add_parser("rules", help="the rule catalogue", description="Inspect the loaded rule catalogue.")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    rules_list = rules_sub.add_parser("list", help="list rules: id, frequency, kind, scenarios",
                                      description="List the loaded rules (SCHEDULER_RULES_DIR or the examples).")
    rules_list.add_argument("--json", action="store_true", help="print JSON")
    rules_list.set_defaults(func=cmd_rules_list)

    vapid = sub.add_parser("vapid-keys", help="print a new VAPID key pair for web push (nothing is stored)",
                           description="A new P-256 key pair: the private key as SCHEDULER_VAPID_PRIVATE_KEY, "
                           "the public key for the inbox page's applicationServerKey (both base64url).")
    vapid.add_argument("--json", action="store_true", help="print JSON: private_key, public_key")
    vapid.set_defaults(func=cmd_vapid_keys)

    extensions.register(sub)  # simulate, bench: imported only when they run
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = extensions.parse_args(parser, argv)
    # A read prints only its answer: the embedded server's and Alembic's INFO lines appear
    # with --verbose; serve keeps INFO, since its log is what an operator watches.
    quiet = logging.INFO if args.command == "serve" else logging.WARNING
    # SCHEDULER_LOG_FORMAT (text or json, secrets redacted in both); a bad value logs as
    # text and is reported by run_command as the configuration error it is.
    configure_logging(logging.DEBUG if args.verbose else quiet, log_format_of(os.environ))
    # pgserver narrates every pg_ctl call at INFO; keep its warnings only.
    logging.getLogger("pgserver").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    # httpx logs every request at INFO: one line per delivery, which its row already records
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
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
        settings = Settings.from_env()
        result: int = args.func(args, settings)
        return result
    except ConfigError as exc:
        print(terminal_safe(f"configuration error: {exc}"), file=sys.stderr)
        return 2
    except DatabaseUnusable as exc:
        # a database that cannot be migrated (or reached) is a sentence, not a traceback
        print(terminal_safe(f"database error: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
