"""ARCH-5: dependencies between the packages of ``scheduler`` run one way.

The layers, lowest first: the leaves every layer may use (``types``, ``whole_numbers``, ``delivery``
(the channels, which ``config`` validates its settings with), ``config``), then ``database``,
``core``, ``nudging``, ``application``, ``observability``, ``operations``, ``web``, ``testing``
(the fakes a test suite uses, which nothing of the service imports), ``service`` (the
composition root, which builds every layer's parts and hands the route modules to the web app),
and the entry points (``extensions``, ``cli``, ``__main__``, the package itself). A module may
import its own package and any lower layer; an import of a higher layer is an arrow the wrong
way, allowed only where ``ALLOWED`` names it with the reason it must stay. The import-cycle test
(ARCH-1) says no module imports in a circle; this one says in which direction the packages may
lean.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "scheduler"
LAYERS = ["types", "whole_numbers", "delivery", "config", "database", "core", "nudging", "application",
          "observability", "operations", "web", "testing", "service", "extensions", "cli", "__main__", "scheduler"]
# (importing package, imported package): why the arrow points up
ALLOWED = {
    ("core", "observability"): "the loop reports each poll and dispatch to an Observer; the default "
                               "Observer does nothing and imports nothing above core (observability.observer)",
    ("config", "database"): "DATABASE_URL is checked by the one parse the engines connect with "
                            "(database.urls, a leaf that imports nothing of the service, DBURL-1)",
}


# (module of web, module of core it imports): why the web edge reaches past the application
# layer there. Every other route reaches the core through scheduler.application.
WEB_REACHES_CORE = {
    ("web/api/health.py", "scheduler.core.loop"): "the health routes read the loop's own health (Scheduler)",
    ("web/api/health.py", "scheduler.core.clock"): "the health routes show the clock's state (DEC-10)",
    ("web/http/auth.py", "scheduler.core.clock"): "tokens are judged by a clock: the system's when "
                                                  "the service gives none",
    ("web/http/bodies.py", "scheduler.core.store"): "a body's trigger_at is refused by the one "
                                                             "storable range the store keeps to (DEC-TRIGGER)",
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scheduler"


def _imported(path: Path) -> set[str]:
    """Every module of ``scheduler`` that ``path`` imports, wherever the import stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "scheduler":
                found |= {f"scheduler.{a.name}" for a in node.names}
            elif node.module.startswith("scheduler."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("scheduler.")}
    return found


def _arrows() -> set[tuple[str, str, str]]:
    """(from package, to package, the file) for every import between two packages."""
    found: set[tuple[str, str, str]] = set()
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC)
        source = relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 else relative.stem
        source = "scheduler" if source == "__init__" else source
        for target in _imported(path):
            package = _package(target)
            if package in LAYERS and package != source:
                found.add((source, package, str(relative)))
    return found


@pytest.mark.clause("ARCH-5")
def test_every_import_between_packages_points_down_the_layers_or_is_allowed_with_its_reason() -> None:
    """ARCH-5: no package imports a higher layer except the arrows ``ALLOWED`` names, and every
    allowed arrow still exists (a reason for an arrow that went is stale); every package of
    ``scheduler`` has its place in the layers."""
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    assert packages <= set(LAYERS), f"packages without a layer: {sorted(packages - set(LAYERS))}"
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = {(a, b, f) for a, b, f in _arrows() if rank[b] > rank[a]}
    unexplained = sorted(f"{f}: {a} -> {b}" for a, b, f in upward if (a, b) not in ALLOWED)
    assert unexplained == []
    assert {(a, b) for a, b, _ in upward} == set(ALLOWED)


# Packages of one level: what both need lives below them (the participant lock key in
# ``database``), so that either can change without the other.
PEERS = [("core", "nudging")]


@pytest.mark.clause("ARCH-5")
def test_the_dispatch_core_and_the_decision_are_peers_that_import_nothing_of_each_other() -> None:
    """ARCH-5: ``core`` (the claim, the batch and its isolation) and ``nudging`` (the rules and the
    one decision) meet only through the ``Dispatcher`` protocol in ``types``: no import either way."""
    arrows = _arrows()
    crossing = sorted(f"{f}: {a} -> {b}" for a, b, f in arrows
                      for pair in PEERS if {a, b} == set(pair))
    assert crossing == []


@pytest.mark.clause("ARCH-5")
def test_the_web_edge_reaches_the_core_only_through_the_application_layer_or_where_the_table_says_why() -> None:
    """ARCH-5: no module of ``scheduler.web`` imports a module of ``scheduler.core`` (so none of
    its private names) except the imports ``WEB_REACHES_CORE`` names with their reason (the health
    routes, the clocks, the storable range; the composition root, ``scheduler.service``, is not web); and every import
    the table names still exists (a reason for an import that went is stale)."""
    reaches = {(str(path.relative_to(SRC)), module)
               for path in sorted((SRC / "web").rglob("*.py"))
               for module in _imported(path)
               if module == "scheduler.core" or module.startswith("scheduler.core.")}
    unexplained = sorted(f"{path} imports {module}" for path, module in reaches - set(WEB_REACHES_CORE))
    assert unexplained == []
    assert reaches == set(WEB_REACHES_CORE)
