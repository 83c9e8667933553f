"""specs/ maps every clause to the tests that prove it; this reads the map both ways.

Clauses are the ``### ID — statement`` headings of ``specs/*.md``, each followed by a
``Proved by:`` list of test node ids. Tests carry ``@pytest.mark.clause("ID")``. The
markers are read from the source (not from a pytest run), so the check holds whatever
subset of the suite is selected.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADING = re.compile(r"^###\s+(?P<id>[A-Z][A-Z0-9-]*(?:\.\d+)?)\s+[—-]\s+\S")
LISTED = re.compile(r"^\s*-\s+`?(?P<node>tests/[\w/]+\.py::[\w:]+)`?\s*$")


def spec_clauses() -> dict[str, set[str]]:
    """Clause id -> test node ids listed under it, over every spec page."""
    clauses: dict[str, set[str]] = {}
    for page in sorted((ROOT / "specs").glob("*.md")):
        current: str | None = None
        for line in page.read_text().splitlines():
            heading = HEADING.match(line)
            if heading:
                current = heading["id"]
                assert current not in clauses, f"{page.name}: clause {current} is defined twice"
                clauses[current] = set()
                continue
            if line.startswith("#"):
                current = None
                continue
            listed = LISTED.match(line)
            if listed and current is not None:
                clauses[current].add(listed["node"])
    return clauses


def _clause_marks(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> list[str]:
    marks = []
    for decorator in node.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "clause"
            and decorator.args
            and isinstance(decorator.args[0], ast.Constant)
        ):
            marks.append(str(decorator.args[0].value))
    return marks


def test_markers() -> dict[str, set[str]]:
    """Test node id -> the clauses its markers name, read from every test module's source."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                found[f"{rel}::{node.name}"].update(_clause_marks(node))
            elif isinstance(node, ast.ClassDef):
                class_marks = _clause_marks(node)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                        found[f"{rel}::{node.name}::{item.name}"].update(class_marks + _clause_marks(item))
    return found


test_markers.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def test_every_clause_is_proved_by_at_least_one_test() -> None:
    """Every clause in specs/ lists at least one test."""
    unproven = sorted(cid for cid, nodes in spec_clauses().items() if not nodes)
    assert unproven == []


def test_every_listed_test_exists_and_carries_the_clause_marker() -> None:
    """Each test named under a clause exists and is marked with that clause."""
    markers = test_markers()
    problems = []
    for cid, nodes in sorted(spec_clauses().items()):
        for node in sorted(nodes):
            if node not in markers:
                problems.append(f"{cid}: {node} does not exist")
            elif cid not in markers[node]:
                problems.append(f"{cid}: {node} lacks @pytest.mark.clause({cid!r})")
    assert problems == []


def test_every_clause_marker_names_a_clause_that_lists_the_test() -> None:
    """No tag names a clause that does not exist, and every tagged test is listed under its clause."""
    clauses = spec_clauses()
    problems = []
    for node, cids in sorted(test_markers().items()):
        for cid in sorted(cids):
            if cid not in clauses:
                problems.append(f"{node}: marker names unknown clause {cid}")
            elif node not in clauses[cid]:
                problems.append(f"{node}: not listed under {cid} in specs/")
    assert problems == []


def test_the_seed_requirements_all_have_clauses() -> None:
    """REQ-0063 to REQ-0067 each have clauses in specs/."""
    ids = spec_clauses()
    for req in ("REQ-0063", "REQ-0064", "REQ-0065", "REQ-0066", "REQ-0067"):
        assert any(cid.startswith(req + ".") for cid in ids), req
