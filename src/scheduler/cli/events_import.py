"""``scheduler events import FILE``: scheduled events from JSON Lines, straight to the database.

Each non-blank line is one event, judged exactly as an item of ``POST
/admin/scheduled-events/batch`` is (``scheduler.web.api.batch.check_items``: the single POST's
schema and facts contract, its bound per event, a key given twice refused naming the line
that gave it first, across the whole file) and stored by the same set-based store
(``core.store_batch``), ``SCHEDULER_BATCH_MAX_EVENTS`` lines per transaction, with the
database's clock (DEC-10). A progress bar goes to stderr when stderr is a terminal; the
summary (stored, rewritten, refused with their line numbers) to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from scheduler.cli.terminal import terminal_safe
from scheduler.config import Settings

EXIT_CODES = """exit codes:
  0  every line was stored (or rewritten)
  1  some lines were refused (the others are stored); the summary names each refused line
  2  the file cannot be read, or the database cannot be used or failed mid-import (stderr names the
     first line not stored; the lines before it are stored, and a re-import rewrites keyed ones)"""


@dataclass
class Summary:
    stored: int = 0
    rewritten: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    stopped_at: int | None = None  # the first line of the chunk the database refused
    error: str | None = None


def _detail(body: dict[str, Any]) -> str:
    detail = body.get("detail")
    return detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text, parse_constant=_not_json)
    except RecursionError:
        return False, "is nested too deeply"
    except ValueError as exc:
        return False, f"is not valid JSON: {exc}"


class Progress:
    """A one-line bar on ``stream`` when it is a terminal; nothing otherwise."""

    def __init__(self, total: int, stream: IO[str]) -> None:
        self.total = total
        self.stream = stream
        self.shown = stream.isatty()

    def update(self, done: int) -> None:
        if not self.shown:
            return
        width = 30
        filled = width * done // max(self.total, 1)
        self.stream.write(f"\rimporting [{'#' * filled}{' ' * (width - filled)}] {done}/{self.total} lines")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def _lines(path: str) -> list[tuple[int, str]]:
    """The file's non-blank lines with their numbers (from 1); ``-`` reads stdin."""
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    return [(number, line) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]


def import_lines(lines: Sequence[tuple[int, str]], settings: Settings, *, database: Any, clock: Any,
                 actor: str, progress: Progress | None = None) -> Summary:
    """Judge and store ``lines`` in chunks of ``settings.batch_max_events`` (one transaction each)."""
    from sqlalchemy.exc import DBAPIError

    from scheduler.web.api.batch import Refusal, check_items, store_checked

    summary = Summary()
    first_of_key: dict[str, int] = {}
    chunk_size = settings.batch_max_events
    for start in range(0, len(lines), chunk_size):
        chunk = lines[start:start + chunk_size]
        parsed = [_parse(text) for _, text in chunk]
        payloads = [value if ok else None for ok, value in parsed]
        numbers = [number for number, _ in chunk]
        checked = check_items(payloads, max_item_bytes=settings.max_body_bytes, default_expiry=settings.default_expiry,
                              first_of_key=first_of_key,
                              positions=numbers, what="line")
        # a line that is not JSON is refused for that, not for being null
        checked = [Refusal({"detail": f"the line {value}"}) if not ok else item
                   for (ok, value), item in zip(parsed, checked, strict=True)]
        try:
            results = store_checked(database, checked, now=clock.now(), actor=actor)
        except DBAPIError as exc:  # the chunk's transaction rolled back: nothing of it is stored
            summary.stopped_at = numbers[0]
            summary.error = str(exc.orig or exc).splitlines()[0]
            return summary
        for number, result in zip(numbers, results, strict=True):
            if isinstance(result, Refusal):
                summary.refused.append((number, _detail(result.body)))
            elif result.rewritten:
                summary.rewritten += 1
            else:
                summary.stored += 1
        if progress is not None:
            progress.update(start + len(chunk))
    return summary


def cmd_events_import(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.cli.events import _cli_actor
    from scheduler.cli.serve import migrated_engine
    from scheduler.core.clock import synced_database_clock
    from scheduler.database.database import Database

    try:
        lines = _lines(args.file)
    except (OSError, UnicodeDecodeError) as exc:
        print(terminal_safe(f"cannot read {args.file}: {exc}"), file=sys.stderr)
        return 2
    engine = migrated_engine(settings)
    progress = Progress(len(lines), sys.stderr)
    try:
        clock = synced_database_clock(engine, warn_seconds=settings.clock_skew_warn_seconds)  # DEC-10
        summary = import_lines(lines, settings, database=Database(engine, settings.database_schema), clock=clock,
                               actor=_cli_actor(args).name, progress=progress)
    finally:
        progress.close()
        engine.dispose()
    print(f"stored {summary.stored}, rewritten {summary.rewritten}, refused {len(summary.refused)}")
    for number, why in summary.refused:
        print(terminal_safe(f"line {number}: {why}"))
    if summary.stopped_at is not None:
        print(terminal_safe(f"database error: {summary.error}; nothing from line {summary.stopped_at} on is stored "
                            "(the lines before it are); import the rest again once the database is back"),
              file=sys.stderr)
        return 2
    return 1 if summary.refused else 0


def add_import_parser(events_sub: Any) -> None:
    """``events import`` in the ``events`` subcommands."""
    parser = events_sub.add_parser(
        "import", help="store scheduled events from a JSON Lines file (or - for stdin)",
        description="Store scheduled events, one JSON object per line, each judged as an item of "
        "POST /admin/scheduled-events/batch (the single POST's schema and facts contract; a repeated "
        "external_key is refused naming the line that gave it first) and stored in transactions of "
        "SCHEDULER_BATCH_MAX_EVENTS lines; a known external_key's row is rewritten and reset to pending "
        "(REQ-0064). A progress bar is shown on stderr when it is a terminal; the summary (stored, "
        "rewritten, refused with line numbers) is printed on stdout.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="a JSON Lines file, or - to read stdin")
    parser.add_argument("--actor", help="the name recorded in each row's history (default cli:$USER)")
    parser.set_defaults(func=cmd_events_import)
