"""The one reader of a specs directory: clauses, their words, pages, groups and the tests they list.

A clause is a ``### ID — statement`` heading of ``specs/*.md``, followed by prose and a
``Proved by:`` list of test node ids (relative to the rootdir: ``tests/test_x.py::test_y``). A
``## `` heading opens a group (for the seed's requirements, ``## REQ-0065 — ...``); the text
between a group's heading and its first clause is its opening. The checkout's map test
(tests/test_spec_map.py) and the spec report (``harness.spec_report.plugin``) both read specs/
through this module, so they cannot disagree on what a clause is; a host's specs directory is
read the same way.

The clause markers of the tests are read from their source (``markers_in_source``), so that
the map holds whatever subset of the suite a run selects.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

HEADING = re.compile(r"^###\s+(?P<id>[A-Z][A-Z0-9-]*(?:\.\d+)?)\s+[—-]\s+(?P<words>\S.*?)\s*$")
GROUP = re.compile(r"^##\s+(?P<title>\S.*?)\s*$")
TITLE = re.compile(r"^#\s+(?P<title>\S.*?)\s*$")
LISTED = re.compile(r"^\s*-\s+`?(?P<node>(?:[\w-]+/)*[\w-]+\.py::[\w:]+)`?\s*$")
# An ID as prose names it: DEC-10, DEC-SIM-5, REQ-0065.4, CTX-DEDUP.2 (matched, then kept
# only when it is the ID of a clause or of a group).
MENTION = re.compile(r"\b[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+(?:\.\d+)?\b")
SEED = re.compile(r"^REQ-006[3-7]$")
PAGE_LINK = re.compile(r"\]\((?P<page>[\w-]+\.md)\)")


class Kind(StrEnum):
    """Where a clause comes from: the seed's five requirements first, our decisions last."""

    SEED = "seed"
    CONTEXT = "context"
    OWN = "own"
    DECISION = "decision"


KIND_ORDER = {kind: rank for rank, kind in enumerate(Kind)}


def kind_of(clause_id: str) -> Kind:
    """The kind a clause's ID says it is."""
    if SEED.match(clause_id.split(".", 1)[0]):
        return Kind.SEED
    if clause_id.startswith("CTX-"):
        return Kind.CONTEXT
    if clause_id.startswith("DEC-"):
        return Kind.DECISION
    return Kind.OWN


@dataclass
class Clause:
    """One clause: its ID, our words for it, where it stands and the tests listed under it."""

    id: str
    words: str
    page: str
    line: int
    group: str
    text: str = ""
    tests: list[str] = field(default_factory=list)

    @property
    def kind(self) -> Kind:
        return kind_of(self.id)


@dataclass
class Group:
    """A page's ``##`` section (or the page itself before its first section)."""

    key: str
    title: str
    page: str
    opening: str = ""
    clauses: list[str] = field(default_factory=list)

    @property
    def requirement(self) -> str | None:
        """The seed requirement the group restates (``REQ-0065``), if it is one."""
        first = self.title.split(maxsplit=1)[0] if self.title else ""
        return first if SEED.match(first) else None


@dataclass
class Page:
    name: str
    title: str


@dataclass
class Specs:
    """Everything specs/ says, in page order (the README's table first, then by name)."""

    pages: list[Page]
    groups: dict[str, Group]
    clauses: dict[str, Clause]
    problems: list[str]

    def matching(self, selector: str) -> list[str]:
        """The clause IDs a ``--clause`` value selects: the ID itself, or every clause it is a
        prefix of at a ``.`` or ``-`` boundary (``REQ-0065``, ``CTX-DEDUP``, ``DEC``)."""
        return [cid for cid in self.clauses
                if cid == selector or cid.startswith(selector + ".") or cid.startswith(selector + "-")]

    def mentions(self, text: str) -> list[str]:
        """The clause IDs named in ``text``, in order of first mention, without repeats."""
        seen: dict[str, None] = {}
        for found in MENTION.findall(text):
            if found in self.clauses:
                seen.setdefault(found, None)
        return list(seen)


def _page_order(spec_dir: Path, names: list[str]) -> list[str]:
    readme = spec_dir / "README.md"
    listed = PAGE_LINK.findall(readme.read_text()) if readme.exists() else []
    ordered = [name for name in dict.fromkeys(listed) if name in names]
    return ordered + sorted(name for name in names if name not in ordered)


def parse_specs(spec_dir: Path) -> Specs:
    """Read every ``*.md`` page of ``spec_dir`` (the README holds no clause)."""
    names = [path.name for path in spec_dir.glob("*.md") if path.name != "README.md"]
    pages: list[Page] = []
    groups: dict[str, Group] = {}
    clauses: dict[str, Clause] = {}
    problems: list[str] = []
    for name in _page_order(spec_dir, names):
        lines = (spec_dir / name).read_text().splitlines()
        page = Page(name, name)
        pages.append(page)
        group = Group(f"{name}#", name, name)
        groups[group.key] = group
        current: Clause | None = None
        for number, line in enumerate(lines, start=1):
            heading = HEADING.match(line)
            if heading:
                cid = heading["id"]
                if cid in clauses:
                    problems.append(f"{name}:{number}: clause {cid} is defined twice "
                                    f"(first at {clauses[cid].page}:{clauses[cid].line})")
                    current = None
                    continue
                current = Clause(cid, heading["words"], name, number, group.key)
                clauses[cid] = current
                group.clauses.append(cid)
                continue
            title = TITLE.match(line)
            if title and page.title == name:  # the page's first level-1 heading is its title
                page.title = group.title = title["title"]
                current = None
                continue
            section = GROUP.match(line)
            if section or line.startswith("#"):
                current = None
                if section:
                    group = Group(f"{name}#{section['title']}", section["title"], name)
                    groups[group.key] = group
                continue
            listed = LISTED.match(line)
            if current is not None:
                if listed:
                    current.tests.append(listed["node"])
                elif line.strip() != "Proved by:":
                    current.text += line + "\n"
            elif not group.clauses:
                group.opening += line + "\n"
    for clause in clauses.values():
        clause.text = clause.text.strip()
    for group in groups.values():
        group.opening = group.opening.strip()
    groups = {key: group for key, group in groups.items() if group.clauses}
    return Specs(pages, groups, clauses, problems)


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


def markers_in_source(root: Path, files: Iterable[Path] | None = None) -> dict[str, set[str]]:
    """Test node id (relative to ``root``) -> the clauses its ``@pytest.mark.clause`` decorators
    name, read from the source of ``files`` (by default every ``tests/**/test_*.py`` under
    ``root``; nothing is imported)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((root / "tests").rglob("test_*.py")) if files is None else files:
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:  # outside the rootdir: no node id a spec page could list
            continue
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
