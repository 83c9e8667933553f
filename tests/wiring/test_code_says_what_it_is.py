"""ARCH-4: the code says what it is, not its history.

A comment, docstring or SQL note that names a tracker number ("issue" and a number) means nothing to a maintainer who
never saw the tracker; a clause or decision ID (REQ-0065.2, DEC-11) points at the reason,
in specs/. This scans every source file of the project (the service, the simulation, the
benchmarks, the fault scenarios, the tests and the scripts) for issue numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests", "bench", "reliability", "scripts", "examples")
SUFFIXES = {".py", ".sql", ".html", ".js", ".css", ".mako", ""}
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")


def _sources() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
                  and ".venv" not in p.parts and not any(part.endswith(".egg-info") for part in p.parts))


@pytest.mark.clause("ARCH-4")
def test_no_source_file_names_an_issue_number() -> None:
    """ARCH-4: no source, test, script or SQL file names an issue number (spec and decision
    IDs instead); the scan reads every file it should (the service's own modules among them)."""
    sources = _sources()
    assert ROOT / "src" / "scheduler" / "core" / "loop.py" in sources
    assert ROOT / "scripts" / "bootstrap" in sources
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if ISSUE.search(line)]
    assert found == []
