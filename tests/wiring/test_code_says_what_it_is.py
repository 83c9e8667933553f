"""ARCH-4: the code and its prose say what they are, not their history.

A comment, docstring, SQL note or page that names a tracker number ("issue" and a number,
"#12") means nothing to a maintainer who never saw the tracker; a clause or decision ID
(REQ-0065.2, DEC-11) points at the reason, in specs/. This scans every source file of the
project (the service, the simulation, the benchmarks, the fault scenarios, the tests and the
scripts) and its prose (specs/, docs/, README.md, CHANGELOG.md) for issue numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests", "bench", "reliability", "scripts", "examples")
SUFFIXES = {".py", ".sql", ".html", ".js", ".css", ".mako", ""}
PROSE = ("specs", "docs")
PROSE_FILES = ("README.md", "CHANGELOG.md")
PROSE_SUFFIXES = {".md", ".txt"}
ISSUE = re.compile(r"\b[Ii]ssues?[ -]#?\d+")
# In prose a bare tracker number too ("see #12", "(#12)"); not an anchor, an entity or a path.
TRACKER_NUMBER = re.compile(r"(?<![\w&/])#\d+\b")


def _sources() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
                  and ".venv" not in p.parts and not any(part.endswith(".egg-info") for part in p.parts))


def _prose() -> list[Path]:
    return sorted([*(p for top in PROSE for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in PROSE_SUFFIXES),
                   *(ROOT / name for name in PROSE_FILES)])


def _tracker_numbers(paths: list[Path], *patterns: re.Pattern[str]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in paths
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if any(pattern.search(line) for pattern in patterns)]


@pytest.mark.clause("ARCH-4")
def test_no_spec_doc_readme_or_changelog_names_an_issue_number() -> None:
    """ARCH-4: the prose names spec and decision IDs, never a tracker number (the word issue
    and a number, with a space, a hyphen or a hash between; or a bare hash and a number); the
    scan reads every page of specs/ and docs/, the README and the changelog."""
    prose = _prose()
    assert {ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "specs" / "layout.md",
            ROOT / "docs" / "performance.md"} <= set(prose)
    issue, number = "issue", "#"  # apart, so that this file names no tracker number itself
    for line in (f"since {issue} 8 a batch", f"I{issue[1:]}s 8/16", f"the {issue}-18 audit",
                 f"fixed in {number}12", f"({number}3)", f"{issue} {number}4"):
        assert ISSUE.search(line) or TRACKER_NUMBER.search(line), line
    for line in ("REQ-0065.2, DEC-11", "[a link](#section-2)", "&#8212;", "step #"):
        assert not (ISSUE.search(line) or TRACKER_NUMBER.search(line)), line
    assert _tracker_numbers(prose, ISSUE, TRACKER_NUMBER) == []


@pytest.mark.clause("ARCH-4")
def test_no_source_file_names_an_issue_number() -> None:
    """ARCH-4: no source, test, script or SQL file names an issue number (spec and decision
    IDs instead); the scan reads every file it should (the service's own modules among them)."""
    sources = _sources()
    assert ROOT / "src" / "scheduler" / "core" / "loop.py" in sources
    assert ROOT / "scripts" / "bootstrap" in sources
    assert _tracker_numbers(sources, ISSUE) == []
