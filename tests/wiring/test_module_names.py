"""ARCH-10: a reader never meets two modules of one name.

Two modules meet where one imports the other, or both are imported by a third: the reader of
that file has both open. Their names must then differ, unless ``SAME_CONCERN`` names the pair
with its reason: an adapter (a CLI command, a route module) over the application module of
the concern it presents, which is the same thing seen from its edge.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
# pairs of modules of one name that may meet: why they are one concern
SAME_CONCERN = {
    frozenset({"scheduler.cli.events", "scheduler.application.events"}):
        "the CLI's events commands present the application's query model",
    frozenset({"scheduler.cli.participants", "scheduler.application.participants"}):
        "the CLI's participants commands present the application's participants",
    frozenset({"scheduler.web.api.participants", "scheduler.application.participants"}):
        "the participants' routes present the application's participants",
    frozenset({"scheduler.web.console.deliveries", "scheduler.application.deliveries"}):
        "the console's deliveries page presents the application's retry commands",
    frozenset({"scheduler.cli.vapid", "scheduler.delivery.vapid"}):
        "the CLI's vapid command makes the keys the Web Push channel signs with",
}


def _module(path: Path, root: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


def met_in(path: Path, root: Path = SRC) -> set[str]:
    """The modules of ``scheduler`` a reader of ``path`` meets: itself and those it imports."""
    met = {_module(path, root)}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("scheduler"):
                continue
            met.add(node.module)
            for alias in node.names:  # ``from scheduler.web.api import intake`` meets a module
                candidate = root.joinpath(*node.module.split("."), alias.name)
                if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
                    met.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            met |= {alias.name for alias in node.names if alias.name.startswith("scheduler")}
    return met


def namesakes(path: Path, root: Path = SRC) -> list[str]:
    """Each pair of modules of one name a reader of ``path`` meets, unless ``SAME_CONCERN`` says why."""
    by_name: dict[str, set[str]] = defaultdict(set)
    for module in met_in(path, root):
        by_name[module.rsplit(".", 1)[-1]].add(module)
    found = []
    for name, modules in sorted(by_name.items()):
        ordered = sorted(modules)
        for i, first in enumerate(ordered):
            for second in ordered[i + 1:]:
                if first.startswith(second + ".") or second.startswith(first + "."):
                    continue  # a package and its module of the package's name (database.database)
                if frozenset({first, second}) not in SAME_CONCERN:
                    found.append(f"{_module(path, root)}: {name} is {first} and {second}")
    return found


@pytest.mark.clause("ARCH-10")
def test_no_module_of_scheduler_meets_two_modules_of_one_name_unless_the_table_says_why() -> None:
    """ARCH-10: no module of ``scheduler`` is, or imports, two modules of one name (the route
    module over ``application.ingest`` is ``web.api.intake``, the console's sign-in beside
    ``web.http.auth`` is ``web.console.sign_in``) except the pairs ``SAME_CONCERN`` names;
    and every pair it names still meets somewhere (a reason for a pair that went is stale)."""
    found = [problem for path in sorted((SRC / "scheduler").rglob("*.py")) for problem in namesakes(path)]
    assert found == []
    meeting = {frozenset(m for m in met_in(path) if m in pair)
               for path in (SRC / "scheduler").rglob("*.py") for pair in SAME_CONCERN}
    assert set(SAME_CONCERN) <= meeting


@pytest.mark.clause("ARCH-10")
def test_the_name_check_finds_a_route_module_named_as_the_application_module_it_imports(tmp_path: Path) -> None:
    """ARCH-10: the check is not vacuous: a route module ``ingest`` that imports
    ``scheduler.application.ingest`` (the layout before ``web.api.intake``) is named."""
    for package in ("scheduler", "scheduler/application", "scheduler/web", "scheduler/web/api"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "scheduler/application/ingest.py").write_text("")
    route = tmp_path / "scheduler/web/api/ingest.py"
    route.write_text("from scheduler.application import ingest\n")
    assert namesakes(route, tmp_path) == [
        "scheduler.web.api.ingest: ingest is scheduler.application.ingest and scheduler.web.api.ingest"]
