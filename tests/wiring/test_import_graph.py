"""ARCH-1: no import cycle anywhere in ``scheduler``, not even under ``TYPE_CHECKING``.

The module graph is read from the source with ``ast``: every ``import`` and ``from ...
import`` of a ``scheduler`` module, wherever it stands (inside a function, under
``if TYPE_CHECKING:``), is an edge. A cycle means two modules that cannot be understood,
tested or replaced one without the other; the test names each cycle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "scheduler"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from a import b`` imports the module a.b when there is one, else a's name b
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith(PACKAGE):
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    # Importing a.b.c runs a/__init__ and a/b/__init__ first, but those edges are the
    # interpreter's, not the module's: only what a module names counts.
    return {name: imports_of(name, path, known) for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as a
    cycle path through it, e.g. ``[a, b, a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_through(graph, set(c)) for c in components]


def _path_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, to name it in the failure."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return sorted(component)


@pytest.mark.clause("ARCH-1")
def test_no_module_of_scheduler_imports_itself_through_another() -> None:
    """ARCH-1: the import graph of src/scheduler (TYPE_CHECKING and function-level imports
    included) has no cycle; a failure names each one."""
    graph = import_graph()
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(
        f"{' -> '.join(c)} (and every cycle among: {', '.join(sorted(set(c)))})" for c in found)


@pytest.mark.clause("ARCH-1")
def test_the_cycle_check_finds_a_cycle_under_type_checking_and_names_it() -> None:
    """ARCH-1: the check can fail: a graph with an edge back (as a TYPE_CHECKING import makes) is
    reported with its path, and the real graph has the edges the check relies on."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scheduler.web import app\n")
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))
    graph = import_graph()
    assert "scheduler.application.commands" in graph["scheduler.web.api.scheduled_events"]
    assert "scheduler.database.database" in graph["scheduler.application.commands"]
    # a TYPE_CHECKING import and a function-level one are edges too
    assert "scheduler.service" in graph["scheduler"]
    assert "scheduler.service" in graph["scheduler.cli"] or "scheduler.service" in graph.get(
        "scheduler.cli.serve", set())


@pytest.mark.clause("ARCH-2")
def test_route_modules_receive_the_services_they_use_not_the_composition_root() -> None:
    """ARCH-2: only the composition root (scheduler.service) names SchedulerService; no module
    of scheduler.web names it or imports the root: each is handed its database, clock, commands
    or verifier instead, and the application layer imports nothing of the web edge."""
    graph = import_graph()
    for name, path in modules().items():
        if name.startswith("scheduler.web"):
            assert "SchedulerService" not in path.read_text(), name
            assert not any(d.startswith("scheduler.service") for d in graph[name]), name
        if name.startswith("scheduler.application"):
            assert not any(d.startswith("scheduler.web") for d in graph[name]), name
