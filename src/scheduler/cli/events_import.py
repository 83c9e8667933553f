"""``scheduler events import FILE``: scheduled events from JSON Lines, straight to the database.

Each non-blank line is one event, judged exactly as an item of ``POST
/admin/scheduled-events/bulk`` is (``scheduler.web.api.bulk_store.check_items``: the single POST's
schema and facts contract, its bound per event, a key given twice refused naming the line
that gave it first, across the whole file) and stored by the same set-based store
(``core.store_batch``), ``SCHEDULER_BULK_MAX_EVENTS`` lines per transaction, with the
database's clock (DEC-10). A progress bar goes to stderr when stderr is a terminal; the
summary (stored, rewritten, refused with their line numbers) to stdout.

The bytes are read as they are, a file's and stdin's alike, and judged line by line, as the
batch route judges its items: a UTF-8 byte order mark before line 1 is skipped, a line that
is not UTF-8 is refused on its own (naming the byte), the others are stored (BATCH-7). Ctrl-C
(SIGINT) lets the chunk being stored finish, then stops and says what was stored and from
which line nothing is: exit 130 (OPS-29).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

from scheduler.cli.arguments import actor_argument
from scheduler.cli.terminal import terminal_safe
from scheduler.config import Settings

EXIT_CODES = """exit codes:
  0    every line was stored (or rewritten)
  1    some lines were refused (the others are stored); the summary names each refused line
  2    the file cannot be read, an argument is malformed, or the database cannot be used or failed
       mid-import (stderr names the first line not stored; the lines before it are stored, and a
       re-import rewrites keyed ones)
  130  interrupted (Ctrl-C, SIGINT): the lines being stored are finished first; the summary counts
       what was stored, and stderr names the last line done and the first line not stored (a second
       Ctrl-C stops at once: stderr names the lines then being stored, stored all or none)"""

EXIT_INTERRUPTED = 130
STOPPING = "interrupted: stopping once the lines being stored are stored (Ctrl-C again to stop at once)"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which some editors and shells write first


@dataclass
class Summary:
    stored: int = 0
    rewritten: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    stopped_at: int | None = None  # the first line not stored: of the chunk refused, or after an interrupt
    error: str | None = None  # why the database stopped the import (None: it did not)
    last_done: int | None = None  # the last line of the last chunk stored (None: none was)
    done: int = 0  # lines judged and, if valid, stored
    interrupted: bool = False
    in_flight: tuple[int, int] | None = None  # a second interrupt's chunk (first, last line): all or none stored


def _detail(body: dict[str, Any]) -> str:
    detail = body.get("detail")
    return detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(raw: bytes) -> tuple[bool, Any]:
    """A line's event, or why the line is refused: not UTF-8 (the byte named), not JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return False, f"is not valid UTF-8 (byte {exc.start + 1} of the line)"
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


def _read(path: str) -> bytes:
    """The file's bytes; ``-`` reads stdin's (a text stream without bytes, as tests give, is
    encoded back, a lone surrogate as the bytes that are not UTF-8 it stands for)."""
    if path == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is not None:
            data: bytes = buffer.read()
            return data
        return sys.stdin.read().encode("utf-8", "surrogatepass")
    with open(path, "rb") as handle:
        return handle.read()


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The non-blank lines with their numbers (from 1), as bytes: a byte order mark before
    line 1 is not part of it; each line is decoded on its own (``_parse``)."""
    lines = data.removeprefix(BOM).split(b"\n")
    return [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]


def import_lines(lines: Sequence[tuple[int, bytes]], settings: Settings, *, database: Any, clock: Any,
                 actor: str, progress: Progress | None = None, stop: threading.Event | None = None,
                 facts_contract: Any = None) -> Summary:
    """Judge and store ``lines`` in chunks of ``settings.bulk_max_events`` (one transaction each),
    their facts by the host's ``facts_contract`` when given (DEC-FACTS-CONTRACT). Once ``stop`` is
    set no further chunk is started; a ``KeyboardInterrupt`` ends the import where it is (a chunk
    then being stored is ``in_flight``: stored all or none)."""
    from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

    summary = Summary()
    first_of_key: dict[str, int] = {}
    chunk_size = settings.bulk_max_events
    for start in range(0, len(lines), chunk_size):
        chunk = lines[start:start + chunk_size]
        first, last = chunk[0][0], chunk[-1][0]
        if stop is not None and stop.is_set():
            summary.interrupted, summary.stopped_at = True, first
            return summary
        storing = False
        try:
            checked = _check_chunk(chunk, settings, first_of_key, facts_contract)
            storing = True
            _count(summary, chunk, checked, database=database, clock=clock, actor=actor)
            storing = False
        except KeyboardInterrupt:
            summary.interrupted, summary.stopped_at = True, first
            summary.in_flight = (first, last) if storing else None
            return summary
        except (DataError, IntegrityError) as exc:  # a value the item checks let through (BATCH-8)
            summary.stopped_at = first
            summary.error = f"the database refused a value of lines {first} to {last}: {_first_line(exc)}"
            return summary
        except DBAPIError as exc:  # the chunk's transaction rolled back: nothing of it is stored
            summary.stopped_at = first
            summary.error = f"{_first_line(exc)}; import the rest again once the database is back"
            return summary
        summary.last_done, summary.done = last, start + len(chunk)
        if progress is not None:
            progress.update(summary.done)
    return summary


def _first_line(exc: Any) -> str:
    return str(exc.orig or exc).splitlines()[0]


def _check_chunk(chunk: Sequence[tuple[int, bytes]], settings: Settings, first_of_key: dict[str, int],
                 facts_contract: Any = None) -> list[Any]:
    """Each line of ``chunk`` judged as a batch item (``check_items``), or refused for not
    being UTF-8 or JSON."""
    from scheduler.web.api.bulk_store import Refusal, check_items

    parsed = [_parse(raw) for _, raw in chunk]
    payloads = [value if ok else None for ok, value in parsed]
    checked = check_items(payloads, max_item_bytes=settings.max_body_bytes, default_expiry=settings.default_expiry,
                          first_of_key=first_of_key, positions=[number for number, _ in chunk], what="line",
                          facts_contract=facts_contract)
    # a line that is not JSON is refused for that, not for being null
    return [Refusal({"detail": f"the line {value}"}) if not ok else item
            for (ok, value), item in zip(parsed, checked, strict=True)]


def _count(summary: Summary, chunk: Sequence[tuple[int, bytes]], checked: Sequence[Any], *, database: Any,
           clock: Any, actor: str) -> None:
    """Store the chunk's valid lines (one transaction) and count each line's result."""
    from scheduler.web.api.bulk_store import Refusal, store_checked

    results = store_checked(database, checked, now=clock.now(), actor=actor)
    for (number, _), result in zip(chunk, results, strict=True):
        if isinstance(result, Refusal):
            summary.refused.append((number, _detail(result.body)))
        elif result.rewritten:
            summary.rewritten += 1
        else:
            summary.stored += 1


@contextmanager
def stop_on_sigint() -> Iterator[threading.Event]:
    """An event the first SIGINT sets (the import then stops after the chunk it is storing);
    the second raises ``KeyboardInterrupt`` as Python's default does (stop at once). The
    handler is this command's, for the length of the block, and the previous one is put
    back; outside the main thread (where no handler can be set) SIGINT is left as it is."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    # said at once, with a plain write: the handler may run while a print is half done
    note = ("\n" if sys.stderr.isatty() else "") + STOPPING + "\n"

    def first(signum: int, frame: FrameType | None) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with suppress(OSError, ValueError):  # no descriptor (a test's stream), or it is closed
            os.write(sys.stderr.fileno(), note.encode())

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def cmd_events_import(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.cli.events import _cli_actor
    from scheduler.cli.serve import migrated_engine
    from scheduler.core.clock import synced_database_clock
    from scheduler.database.database import Database

    try:
        contract = None if args.facts_contract is None else load_contract(args.facts_contract)
    except ValueError as exc:
        print(terminal_safe(str(exc)), file=sys.stderr)
        return 2
    try:
        lines = split_lines(_read(args.file))
    except OSError as exc:
        print(terminal_safe(f"cannot read {args.file}: {exc}"), file=sys.stderr)
        return 2
    with stop_on_sigint() as stop:
        engine = migrated_engine(settings)
        progress = Progress(len(lines), sys.stderr)
        try:
            clock = synced_database_clock(engine, warn_seconds=settings.clock_skew_warn_seconds)  # DEC-10
            summary = import_lines(lines, settings, database=Database(engine, settings.database_schema), clock=clock,
                                   actor=_cli_actor(args).name, progress=progress, stop=stop,
                                   facts_contract=contract)
        finally:
            progress.close()
            engine.dispose()
    print(f"stored {summary.stored}, rewritten {summary.rewritten}, refused {len(summary.refused)}")
    for number, why in summary.refused:
        print(terminal_safe(f"line {number}: {why}"))
    if summary.interrupted:
        print(terminal_safe(interrupted_sentence(summary, total=len(lines), path=args.file)), file=sys.stderr)
        return EXIT_INTERRUPTED
    if summary.stopped_at is not None:
        print(terminal_safe(f"database error: {summary.error}; nothing from line {summary.stopped_at} on is stored "
                            "(the lines before it are)"), file=sys.stderr)
        return 2
    return 1 if summary.refused else 0


def load_contract(path: str) -> Any:
    """The host's facts contract named ``module:attribute`` (a pydantic model or a callable),
    or a ``ValueError`` in one sentence."""
    import importlib

    module_name, colon, name = path.partition(":")
    if not colon or not module_name or not name.isidentifier():
        raise ValueError(f"--facts-contract {path!r} is not module:attribute (e.g. host_app.facts:ReminderFacts)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the host's module: any import failure is one sentence
        raise ValueError(f"--facts-contract {path!r}: cannot import {module_name}: {exc}") from None
    contract = getattr(module, name, None)
    if not callable(contract):
        raise ValueError(f"--facts-contract {path!r}: {module_name} has no model or callable named {name}")
    return contract


def interrupted_sentence(summary: Summary, *, total: int, path: str) -> str:
    """What an interrupted import stored, up to which line, and where the rest starts."""
    if summary.last_done is None:
        done = "interrupted before any line was stored"
    else:
        done = (f"interrupted after line {summary.last_done}: {summary.done} of {total} lines are done (stored, "
                "rewritten or refused as above)")
    if summary.in_flight is not None:
        first, last = summary.in_flight
        return (f"{done}; lines {first} to {last} were being stored when interrupted again: the database stored "
                f"either all or none of them; nothing after line {last} is stored")
    rest = f"; `tail -n +{summary.stopped_at} {shlex.quote(path)} | scheduler events import -` imports the rest" \
        if path != "-" else ""
    return f"{done}; nothing from line {summary.stopped_at} on is stored{rest}"


def add_import_parser(events_sub: Any) -> None:
    """``events import`` in the ``events`` subcommands."""
    from scheduler.database.models import NAME_LENGTH

    parser = events_sub.add_parser(
        "import", help="store scheduled events from a JSON Lines file (or - for stdin)",
        description="Store scheduled events, one JSON object per line, each judged as an item of "
        "POST /admin/scheduled-events/bulk (the single POST's schema and facts contract; a repeated "
        "external_key is refused naming the line that gave it first) and stored in transactions of "
        "SCHEDULER_BULK_MAX_EVENTS lines; a known external_key's row is rewritten and reset to pending "
        "(REQ-0064). The lines are UTF-8 (a byte order mark before the first is skipped); a line that is "
        "not, or is not JSON, is refused on its own, a file's and stdin's alike. A progress bar is shown "
        "on stderr when it is a terminal; the summary (stored, rewritten, refused with line numbers) is "
        "printed on stdout. Ctrl-C lets the lines being stored finish, then stops, saying what was stored "
        "and the first line that was not (exit 130).",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="a JSON Lines file, or - to read stdin")
    parser.add_argument("--actor", type=actor_argument,
                        help=f"the name recorded in each row's history (default cli:$USER; at most {NAME_LENGTH} "
                        "characters)")
    parser.add_argument("--facts-contract", metavar="MODULE:NAME", default=None,
                        help="the host's own facts contract (a pydantic model or a callable raising ValueError), "
                        "as the service's facts_contract=, instead of the built-in facts_version and scenario")
    parser.set_defaults(func=cmd_events_import)
