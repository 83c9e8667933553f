"""What ``scheduler simulate`` hands to CI: one JSON document, a JUnit XML file, exit codes.

With ``--json`` stdout carries exactly one JSON document, whatever the run ends in (the
seed line and the progress go to stderr); ``--junit-xml PATH`` writes one test suite with
one test case, a ``<failure>`` for a violated invariant and an ``<error>`` for a run that
could not go on, so any CI's test report shows the seed and the replay command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from scheduler.database.engine import drop_database

EXIT_CODES = {
    0: "clean: every invariant held",
    1: "an invariant was violated (the report names it, the seed and the replay command)",
    2: "bad arguments, a --dispatcher or --setup path that does not import, or no database",
    3: "the harness itself could not go on (an actor neither finished nor waited on a lock)",
}

EPILOG = "exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())


def emit_json(document: dict[str, Any]) -> None:
    """The run's one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.flush()


def write_junit(path: Path, document: dict[str, Any]) -> Path:
    """One ``<testsuite>`` with one ``<testcase>`` for the run described by ``document``."""
    result = document.get("result", "clean")
    suite = ET.Element("testsuite", name="scheduler simulate", tests="1",
                       failures="1" if result == "violation" else "0",
                       errors="1" if result in ("harness_error", "error") else "0",
                       time=str(document.get("elapsed_seconds", 0)))
    dispatcher = document.get("dispatcher") or "built-in"
    name = f"seed {document.get('seed')} ({dispatcher}, {document.get('scheduler', 'correct')})"
    case = ET.SubElement(suite, "testcase", classname="scheduler.simulate", name=name,
                         time=str(document.get("elapsed_seconds", 0)))
    if result == "violation":
        failure = ET.SubElement(case, "failure", message=str(document.get("violation")),
                                type=str(document.get("clause")))
        failure.text = "\n".join([
            str(document.get("violation")),
            *(f"    {line}" for line in document.get("program", [])),
            f"regression test: {document.get('regression_file')}",
            f"replay: {document.get('replay')}",
        ])
    elif result in ("harness_error", "error"):
        error = ET.SubElement(case, "error", message=str(document.get("message")))
        error.text = f"{document.get('message')}\nreplay: {document.get('replay')}"
    out = ET.SubElement(case, "system-out")
    out.text = f"replay: {document.get('replay')}"
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
    return path


def say(args: argparse.Namespace, line: str) -> None:
    """A line of a command's text report: stdout, or stderr when stdout is reserved for JSON."""
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def finish(args: argparse.Namespace, document: dict[str, Any], code: int) -> int:
    """End a command: its JSON document on stdout (``--json``) and its JUnit file (``--junit-xml``)."""
    if args.json:
        emit_json(document)
    if args.junit_xml is not None:
        write_junit(args.junit_xml, document)
    return code


def release_database(args: argparse.Namespace, admin_url: str, name: str, url: str) -> None:
    """End a command's run database: kept with ``--keep-database`` (its URL on stderr), else dropped."""
    if args.keep_database:
        print(f"database kept: {url}", file=sys.stderr)
    else:
        with contextlib.suppress(Exception):
            drop_database(admin_url, name)
