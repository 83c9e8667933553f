"""``scheduler events list|show|reset|cancel|history`` and ``rules list``: thin adapters over
``scheduler.application`` (the one query model and the audited commands) and the catalogue."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from scheduler.cli.serve import migrated_engine
from scheduler.cli.terminal import terminal_safe
from scheduler.config import Settings

# The query model's fields (scheduler.application.events.EventQuery), as options.
FILTER_OPTIONS = ("status", "event_type", "user_id", "external_key", "community_id",
                  "trigger_from", "trigger_to", "error_contains")


def add_filter_options(parser: argparse.ArgumentParser, *, statuses: list[str]) -> None:
    parser.add_argument("--status", choices=statuses, help="only rows in this status")
    parser.add_argument("--event-type", help="only rows of this event type")
    parser.add_argument("--user-id", help="only this participant's rows")
    parser.add_argument("--external-key", help="only the row of this external key")
    parser.add_argument("--community-id", help="only this community's rows")
    parser.add_argument("--trigger-from", help="only rows due at or after this ISO 8601 time (with a zone)")
    parser.add_argument("--trigger-to", help="only rows due before this ISO 8601 time (with a zone)")
    parser.add_argument("--error-contains", help="only rows whose last_error contains this text (any case)")


def _query(args: argparse.Namespace, *, limit: int = 100) -> Any:
    """The query model from the command's filter options (None when one is malformed: said on stderr)."""
    from scheduler.application.events import EventQuery, QueryError

    fields = {name: getattr(args, name, None) for name in FILTER_OPTIONS}
    fields["cursor"] = getattr(args, "cursor", None)
    try:
        return EventQuery.from_mapping({k: str(v) for k, v in fields.items() if v}, limit=limit)
    except QueryError as exc:
        print(terminal_safe(exc), file=sys.stderr)
        return None


def cmd_events_list(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application.events import EventOrder, QueryError, list_events
    from scheduler.database.database import Database

    query = _query(args, limit=args.limit)
    if query is None:
        return 2
    engine = migrated_engine(settings)
    try:
        page = list_events(Database(engine, settings.database_schema), query, EventOrder.CHANGED)
    except QueryError as exc:
        print(terminal_safe(exc), file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    rows = page.rows
    if page.next_cursor is not None:
        print(f"more rows: add --cursor {page.next_cursor.encode()}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no scheduled events")
    for row in rows:
        error = f"  last_error={row['last_error']}" if row["last_error"] else ""
        line = f"{row['id']}  {row['status']:<10} trigger_at={row['trigger_at']}  user={row['user_id']}{error}"
        print(terminal_safe(line))  # OPS-25: what senders wrote never drives the terminal
    return 0


def _cli_actor(args: argparse.Namespace) -> Any:
    from scheduler.application.commands import Actor

    if args.actor:
        return Actor(str(args.actor), "cli")
    try:
        return Actor("cli:" + getpass.getuser(), "cli")
    except (KeyError, OSError):
        return Actor("cli", "cli")


def cmd_events_show(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application import audit
    from scheduler.application.events import get_event
    from scheduler.database.database import Database

    engine = migrated_engine(settings)
    database = Database(engine, settings.database_schema)
    found = get_event(database, args.id)
    notifications = audit.event_notifications(database, args.id) if found else []
    actions = audit.event_actions(database, args.id) if found else []
    engine.dispose()
    if found is None:
        print(terminal_safe(f"no scheduled event with id {args.id}"), file=sys.stderr)
        return 1
    row = found.as_json()
    if args.json:
        print(json.dumps({**row, "notifications": notifications, "actions": actions}, indent=2))
        return 0
    # Text: every line through terminal_safe (OPS-25); the JSON above escapes by itself.
    facts = row.pop("facts")
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(terminal_safe(f"{key:<{width}}  {'-' if value is None else value}"))
    print("facts:")
    # json.dumps escapes C0 controls in strings but, with ensure_ascii=False, not DEL, C1 or
    # U+202E: each of its lines (split on "\n" only, the one separator it writes) goes through too.
    dumped = json.dumps(facts, indent=2, sort_keys=True, ensure_ascii=False)
    print("  " + "\n  ".join(terminal_safe(line) for line in dumped.split("\n")))
    print(f"notifications ({len(notifications)}):")
    for n in notifications:
        reason = f" ({n['reason']})" if n["reason"] else ""
        print(terminal_safe(f"  {n['created_at']}  {n['status']}{reason}  {n['rule_id']}  {n['title']}"))
    print(f"operator actions ({len(actions)}):")
    for a in actions:
        reason = f"  reason: {a['reason']}" if a["reason"] else ""
        print(terminal_safe(f"  {a['at']}  {a['action']} by {a['actor']} ({a['source']}){reason}"))
    return 0


def _id_or_filter(args: argparse.Namespace, verb: str) -> tuple[bool, Any] | None:
    """(by filter?, the query) from an ID or filter options, never both; None: said why on stderr."""
    given = any(getattr(args, name, None) for name in FILTER_OPTIONS)
    if args.id is not None and given:
        print("give either an ID or a filter (--status, --event-type, ...), not both", file=sys.stderr)
        return None
    if args.id is None and not given:
        print(f"give an ID, or a filter (--status, --event-type, --error-contains, ...) to {verb} every matching row",
              file=sys.stderr)
        return None
    if args.id is not None:
        return False, None
    query = _query(args)
    return None if query is None else (True, query)


def _by_filter(args: argparse.Namespace, database: Any, clock: Any, query: Any, *, verb: str, doing: str,
               done_verb: str, sources: frozenset[Any], bulk: Any) -> int:
    """A reset or a cancel by filter, as the console's: count first (``--dry-run`` stops
    there), ``--reason`` required, then the audited command in chunks (``bulk``)."""
    from scheduler.application import commands

    as_of = clock.now()
    count = commands.count_matching(database, query, sources, cap=args.cap)
    shown = f"more than {args.cap}" if count > args.cap else str(count)
    if args.dry_run:
        print(f"dry run: {shown} rows match; they would be {done_verb}")
        return 0
    if not (args.reason or "").strip():
        print(f"{shown} rows match: a bulk {verb} needs --reason (recorded in the audit trail); "
              "--dry-run only counts", file=sys.stderr)
        return 2
    print(f"{doing} {min(count, args.cap)} rows in chunks of {commands.CHUNK} ...", file=sys.stderr)
    done = bulk(database, query, now=clock.now(), as_of=as_of, expected=count, actor=_cli_actor(args),
                reason=args.reason, cap=args.cap)
    print(f"{done_verb} {done.changed} rows (audit #{done.action_id})")
    return 0


def _one_row_or_filter(args: argparse.Namespace, settings: Settings, *, verb: str, by_filter: dict[str, Any],
                       one_row: Any) -> int:
    """The shared frame of ``events reset`` and ``events cancel``: an ID or a filter (never
    both), the database's clock (DEC-10), then ``one_row(database, now)`` or ``_by_filter``."""
    from scheduler.core.clock import synced_database_clock
    from scheduler.database.database import Database

    chosen = _id_or_filter(args, verb)
    if chosen is None:
        return 2
    filtered, query = chosen
    if filtered and getattr(args, "key", False):
        print("--key names one row by its external key; a filter takes --external-key", file=sys.stderr)
        return 2
    if not filtered and args.dry_run:
        print(terminal_safe(f"dry run: would {verb} {args.id}"))
        return 0
    engine = migrated_engine(settings)
    database = Database(engine, settings.database_schema)
    try:
        clock = synced_database_clock(engine, warn_seconds=settings.clock_skew_warn_seconds)  # DEC-10
        if filtered:
            return _by_filter(args, database, clock, query, verb=verb, **by_filter)
        code: int = one_row(database, clock.now())
        return code
    finally:
        engine.dispose()


def cmd_events_reset(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application import commands

    def one_row(database: Any, now: Any) -> int:
        result = commands.reset(database, args.id, now=now, actor=_cli_actor(args), reason=args.reason)
        if result.event is None:
            print(terminal_safe(f"no scheduled event with id {args.id}"), file=sys.stderr)
            return 1
        print(f"{result.event.id} is pending again (trigger_at={result.event.trigger_at.isoformat()})")
        return 0

    return _one_row_or_filter(args, settings, verb="reset", one_row=one_row, by_filter={
        "doing": "resetting", "done_verb": "reset", "sources": commands.RESETTABLE, "bulk": commands.bulk_reset})


def cmd_events_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application import commands

    def one_row(database: Any, now: Any) -> int:
        result = commands.cancel(database, now=now, event_id=None if args.key else args.id,
                                 external_key=args.id if args.key else None, actor=_cli_actor(args))
        what = terminal_safe(f"key {args.id}" if args.key else f"id {args.id}")
        if result.event is None:
            print(f"no scheduled event with {what}", file=sys.stderr)
            return 1
        if result.outcome == "dispatched":
            dispatched_at = result.event.dispatched_at.isoformat() if result.event.dispatched_at else None
            print(f"{result.event.id} was already dispatched at {dispatched_at}; it stays dispatched", file=sys.stderr)
            return 1
        if result.outcome == "expired":
            print(f"{result.event.id} already expired ({result.event.last_error}); it stays expired", file=sys.stderr)
            return 1
        note = " (it already was)" if result.outcome == "already_cancelled" else ""
        print(f"{result.event.id} is cancelled{note}")
        return 0

    return _one_row_or_filter(args, settings, verb="cancel", one_row=one_row, by_filter={
        "doing": "cancelling", "done_verb": "cancelled", "sources": commands.CANCELLABLE,
        "bulk": commands.bulk_cancel})


def cmd_events_history(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application.audit import event_history
    from scheduler.database.database import Database

    engine = migrated_engine(settings)
    try:
        entries = event_history(Database(engine, settings.database_schema), args.id)
    finally:
        engine.dispose()
    if entries is None:
        print(terminal_safe(f"no scheduled event with id {args.id}"), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    for entry in entries:
        by = f"  by {entry['actor']}" if entry["actor"] else ""
        changed = "  ".join(
            f"{column}: {_short(before)} -> {_short(after)}" for column, (before, after) in entry["changes"].items()
        )
        print(terminal_safe(f"{entry['at']}  {entry['change']:<10} {entry['status']:<10}{by}  {changed}").rstrip())
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
        print(terminal_safe(f"{s['id']:<28} {s['frequency']:<8} {s['kind']:<10} {', '.join(s['scenarios'])}{state}"))
    return 0
