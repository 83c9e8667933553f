"""ARCH-5: dependencies between the packages of ``scheduler`` run one way.

The layers, lowest first: the leaves every layer may use (``types``, ``digits``, ``config``,
``moved``), then ``database``, ``core``, ``nudging``, ``application``, ``observability``,
``operations``, ``web``, and the entry points (``extensions``, ``cli``, ``__main__``, the
deprecated old module paths, the package itself). A module may import its own package and any lower layer; an import of a
higher layer is an arrow the wrong way, allowed only where ``ALLOWED`` names it with the
reason it must stay. The import-cycle test (ARCH-1) says no module imports in a circle; this
one says in which direction the packages may lean.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scheduler.moved import MOVED

SRC = Path(__file__).resolve().parents[2] / "src" / "scheduler"
LAYERS = ["types", "digits", "config", "moved", "database", "core", "nudging", "application",
          "observability", "operations", "web", "extensions", "cli", "__main__",
          # the deprecated old top-level paths (ARCH-3): each re-exports a module of any layer
          *(old.removeprefix("scheduler.") for old in MOVED if old.count(".") == 1),
          "scheduler"]
# (importing package, imported package): why the arrow points up
ALLOWED = {
    ("core", "observability"): "the loop reports each poll and dispatch to an Observer; the default "
                               "Observer does nothing and imports nothing above core (observability.observer)",
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scheduler"


def _arrows() -> set[tuple[str, str, str]]:
    """(from package, to package, the file) for every import between two packages."""
    found: set[tuple[str, str, str]] = set()
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC)
        source = relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 else relative.stem
        source = "scheduler" if source == "__init__" else source
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and (node.module == "scheduler" or node.module.startswith("scheduler.")):
                targets = ([f"scheduler.{a.name}" for a in node.names] if node.module == "scheduler"
                           else [node.module])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("scheduler.")]
            for target in targets:
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
