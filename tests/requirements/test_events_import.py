"""BATCH-7 and OPS-29: what ``scheduler events import`` reads, and how it stops.

The bytes of a file and of stdin are judged alike, line by line, as the batch route judges
items: a byte order mark before line 1 is skipped, a line that is not UTF-8 is refused on its
own. Ctrl-C (SIGINT) lets the chunk being stored finish, then says what was stored and from
which line nothing is (exit 130); a second Ctrl-C stops at once, naming the lines then being
stored. ``--actor`` and ``--reason`` the database could not store are refused by the parser
(one sentence, exit 2) before anything is opened.
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.cli.events_import import STOPPING
from tests.helpers import event_body, post_event, rows, wait_until_blocked_on_a_lock

BOM = b"\xef\xbb\xbf"


def _line(user_id: str, external_key: str | None = None) -> bytes:
    return json.dumps(event_body(user_id=user_id, external_key=external_key)).encode()


def _users(engine: Engine) -> list[str]:
    return sorted(r["user_id"] for r in rows(engine, "SELECT user_id FROM scheduled_events"))


def _import_stdin(data: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                  ) -> tuple[int, str, str]:
    """``events import -`` with ``data`` on stdin, a real text stream over bytes (as Python
    gives a process: undecodable bytes as surrogates, in a POSIX locale)."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape"))
    code = main(["events", "import", "-"])
    out = capsys.readouterr()
    return code, out.out, out.err


def _import_file(data: bytes, path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    path.write_bytes(data)
    code = main(["events", "import", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.clause("BATCH-7")
def test_import_skips_a_byte_order_mark_before_line_1_of_a_file_and_of_stdin(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """BATCH-7: a UTF-8 byte order mark (what some editors and PowerShell write first) is not
    part of line 1, as the batch route's JSON reader skips it: both lines stored, exit 0."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    data = BOM + _line(user_id="a") + b"\n" + _line(user_id="b") + b"\n"
    assert _import_file(data, tmp_path / "bom.jsonl", capsys) == (0, "stored 2, rewritten 0, refused 0\n", "")
    assert _import_stdin(data, monkeypatch, capsys) == (0, "stored 2, rewritten 0, refused 0\n", "")
    assert _users(engine) == ["a", "a", "b", "b"]


@pytest.mark.clause("BATCH-7")
def test_import_refuses_a_line_that_is_not_utf8_on_its_own_alike_from_a_file_and_from_stdin(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """BATCH-7: bytes that are not UTF-8 refuse their own line, naming the byte, and the other
    lines are stored (exit 1); the file and the same bytes on stdin answer exactly alike."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    data = _line(user_id="a") + b"\n" + b'{"user_id": "\xff\xfe"}\n' + _line(user_id="c") + b"\n"
    expected = "stored 2, rewritten 0, refused 1\nline 2: the line is not valid UTF-8 (byte 14 of the line)\n"
    assert _import_file(data, tmp_path / "latin.jsonl", capsys) == (1, expected, "")
    assert _import_stdin(data, monkeypatch, capsys) == (1, expected, "")
    assert _users(engine) == ["a", "a", "c", "c"]


class Import:
    """``scheduler events import FILE`` as its own process, its stderr read as it comes."""

    def __init__(self, path: Path, database_url: str, **env: str) -> None:
        environment = {**os.environ, "DATABASE_URL": database_url, **env}
        self.process = subprocess.Popen([sys.executable, "-m", "scheduler", "events", "import", str(path)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
        self.err_lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        assert self.process.stderr is not None
        self.drain = threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True)
        self.drain.start()

    def _drain(self, stream: io.TextIOBase) -> None:
        for line in stream:
            self.err_lines.put(line)

    def wait_for_err(self, wanted: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.err_lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            self.err.append(line)
            if wanted in line:
                return
        raise AssertionError(f"{wanted!r} not on stderr within {timeout:g} s: {self.err}")

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        self.process.wait(timeout)  # its stdout is a few lines: the pipe cannot fill
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        self.drain.join(timeout)  # stderr read to its end
        while not self.err_lines.empty():
            self.err.append(self.err_lines.get_nowait())
        return self.process.returncode, out, "".join(self.err)


def _held_import(client: TestClient, engine: Engine, tmp_path: Path) -> Path:
    """Five lines, one per chunk; line 3 rewrites the row of key ``held``, which the test locks."""
    post_event(client, external_key="held")
    lines = [_line(user_id="early-1"), _line(user_id="early-2"), _line(user_id="late", external_key="held"),
             _line(user_id="later-4"), _line(user_id="later-5")]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.clause("OPS-29")
def test_an_interrupted_import_finishes_the_chunk_being_stored_says_up_to_which_line_it_stored_and_exits_130(
    client: TestClient, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """OPS-29: SIGINT while line 3's chunk waits on a lock: the import says it is stopping,
    stores that chunk once the lock is free, starts no other, prints the summary of what it
    stored, names line 3 as the last done and line 4 as the first not stored, and exits 130."""
    path = _held_import(client, engine, tmp_path)
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM scheduled_events WHERE external_key = 'held' FOR UPDATE"))
        run = Import(path, database_url, SCHEDULER_BULK_MAX_EVENTS="1", SCHEDULER_LOCK_TIMEOUT_MS="0")
        wait_until_blocked_on_a_lock(engine)
        run.process.send_signal(signal.SIGINT)
        run.wait_for_err(STOPPING)
        holder.rollback()
    code, out, err = run.finish()
    assert code == 130, (out, err)
    assert out == "stored 2, rewritten 1, refused 0\n"
    assert (f"interrupted after line 3: 3 of 5 lines are done (stored, rewritten or refused as above); nothing "
            f"from line 4 on is stored; `tail -n +4 {path} | scheduler events import -` imports the rest") in err
    assert "Traceback" not in err
    assert _users(engine) == ["early-1", "early-2", "late"]


@pytest.mark.clause("OPS-29")
def test_a_second_interrupt_stops_the_import_at_once_naming_the_lines_then_being_stored(
    client: TestClient, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """OPS-29: a second SIGINT does not wait for the lock: the chunk being stored is given up
    (here PostgreSQL cancels its statement, so none of it is stored), stderr names its lines,
    and the command exits 130 without a traceback."""
    path = _held_import(client, engine, tmp_path)
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM scheduled_events WHERE external_key = 'held' FOR UPDATE"))
        run = Import(path, database_url, SCHEDULER_BULK_MAX_EVENTS="1", SCHEDULER_LOCK_TIMEOUT_MS="0")
        wait_until_blocked_on_a_lock(engine)
        run.process.send_signal(signal.SIGINT)
        run.wait_for_err(STOPPING)
        run.process.send_signal(signal.SIGINT)
        code, out, err = run.finish()
        holder.rollback()
    assert code == 130, (out, err)
    assert out == "stored 2, rewritten 0, refused 0\n"
    assert ("interrupted after line 2: 2 of 5 lines are done (stored, rewritten or refused as above); lines 3 to 3 "
            "were being stored when interrupted again: the database stored either all or none of them; nothing "
            "after line 3 is stored") in err
    assert "Traceback" not in err
    assert _users(engine) == ["early-1", "early-2", "participant-1"]


NOT_UTF8 = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands a Latin-1 argument over


@pytest.mark.clause("OPS-29")
@pytest.mark.parametrize(("argv", "refusal"), [
    (["events", "import", "FILE", "--actor", "a" * 300], "argument --actor: is 300 characters long; at most 200"),
    (["events", "import", "FILE", "--actor", NOT_UTF8], "argument --actor: is not valid UTF-8"),
    (["events", "reset", "--status", "failed", "--reason", NOT_UTF8], "argument --reason: is not valid UTF-8"),
    (["events", "reset", "--status", "failed", "--reason", "r" * 2001],
     "argument --reason: is 2001 characters long; at most 2000"),
    (["events", "cancel", "ID", "--actor", NOT_UTF8], "argument --actor: is not valid UTF-8"),
    (["events", "show", NOT_UTF8], "argument id: is not valid UTF-8"),
    (["events", "history", NOT_UTF8], "argument id: is not valid UTF-8"),
    (["events", "reset", NOT_UTF8], "argument id: is not valid UTF-8"),
    (["events", "cancel", "--key", NOT_UTF8], "argument id: is not valid UTF-8"),
])
def test_an_actor_reason_or_id_the_database_cannot_take_is_refused_with_one_sentence_and_exit_2(
    argv: list[str], refusal: str, engine: Engine, database_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """OPS-29: an ``--actor`` longer than the history's column or not UTF-8, a ``--reason``
    not UTF-8 or longer than the audit trail keeps, and an event's ID that is not UTF-8 are
    refused by the parser in one sentence naming the option, exit 2, nothing stored; the
    value itself is not echoed."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    path = tmp_path / "events.jsonl"
    path.write_bytes(_line(user_id="a") + b"\n")
    with pytest.raises(SystemExit) as refused:
        main([str(path) if arg == "FILE" else arg for arg in argv])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert err.splitlines()[-1].startswith("scheduler events ") and refusal in err.splitlines()[-1], err
    assert "Traceback" not in err and "database error" not in err and "caf" not in err
    assert rows(engine, "SELECT id FROM scheduled_events") == []
    assert main(["events", "import", str(path), "--actor", "é" * 200]) == 0  # the bound itself is recorded
    assert rows(engine, "SELECT DISTINCT actor FROM scheduled_event_history") == [{"actor": "é" * 200}]
