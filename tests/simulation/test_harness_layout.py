"""SIM-9, SIM-13: the harness's shape: no import cycle, broken variants built only when a run
asks, and modules of one concept each, none over 450 lines.

Importing ``harness.broken`` or ``harness.cli`` (which the ``scheduler`` command may load)
reads no SQL; a variant's regexes are checked against queries.sql when that variant is
built, so an edit that removes one variant's target fails that variant alone.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness import broken
from harness.broken import VARIANTS, Replace, VariantNoLongerApplies, variant
from scheduler.database.queries import Query, load_queries

HARNESS = Path(harness.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every harness module ``path`` imports, wherever the import stands (TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness."):
            found.add(node.module.removeprefix("harness."))
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("harness.") for a in node.names if a.name.startswith("harness.")}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (as the path that closes it), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            if (found := visit(nxt, [*path, node])) is not None:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        if (found := visit(start, [])) is not None:
            return found
    return None


@pytest.mark.clause("SIM-9")
def test_no_harness_module_imports_another_that_imports_it_back() -> None:
    """SIM-9: the harness's module graph, counting imports under TYPE_CHECKING and inside
    functions, has no cycle: the steps depend on ``harness.types.RunContext``, not ``Simulation``."""
    graph = {p.stem: _imports(p) for p in HARNESS.glob("*.py") if p.stem != "__init__"}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"
    steps = ("posts", "phases", "run_steps", "replica_faults", "oracle", "teardown")
    assert all("simulation" not in graph[step] for step in steps)
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the check itself finds one


MAX_MODULE_LINES = 450


@pytest.mark.clause("SIM-13")
def test_every_harness_module_is_at_most_450_lines_and_named_in_the_map() -> None:
    """SIM-13: every module of the harness package (whatever its name, a new one too) holds at
    most 450 lines, and the package's docstring names it in its map of concepts."""
    modules = sorted(HARNESS.glob("*.py"))
    assert HARNESS / "simulation.py" in modules and len(modules) > 20
    lines = {p.name: len(p.read_text().splitlines()) for p in modules}
    assert {name: n for name, n in lines.items() if n > MAX_MODULE_LINES} == {}
    described = harness.__doc__ or ""
    named = {p.stem for p in modules if p.stem not in ("__init__", "__main__")}
    assert sorted(m for m in named if f"``{m}``" not in described) == []


@pytest.mark.clause("SIM-9")
def test_importing_the_harness_and_its_command_reads_no_sql() -> None:
    """SIM-9: in a fresh interpreter whose queries.sql cannot be read, ``import harness.broken``
    and ``import harness.cli`` still succeed: no variant is built at import."""
    script = (
        "import scheduler.database.queries as q\n"
        "def unreadable(*args, **kwargs):\n"
        "    raise AssertionError('queries.sql read at import')\n"
        "q.load_queries = unreadable\n"
        "import harness.broken, harness.cli\n"
        "print(sorted(harness.broken.VARIANTS))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "'no-skip-locked'" in done.stdout and "'correct'" in done.stdout


@pytest.mark.clause("SIM-9")
@pytest.mark.clause("SIM-1")
def test_a_statement_edited_past_one_variants_regex_fails_that_variant_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIM-9, SIM-1: with the claim's `FOR UPDATE SKIP LOCKED` edited away, building the
    no-skip-locked variant fails naming it, and every other variant still builds."""
    production = load_queries()
    edited = {name: Query(q.name, q.description,
                          q.sql.replace("FOR UPDATE SKIP LOCKED", "FOR NO KEY UPDATE SKIP LOCKED"))
              for name, q in production.items()}
    assert edited != production
    monkeypatch.setattr(broken, "load_queries", lambda: edited)
    with pytest.raises(VariantNoLongerApplies, match="the no-skip-locked variant no longer applies"):
        variant("no-skip-locked").build_rewrites()
    for name in sorted(set(VARIANTS) - {"no-skip-locked"}):
        assert len(variant(name).build_rewrites()) == len(VARIANTS[name].rewrites)
    monkeypatch.undo()
    assert variant("no-skip-locked").build_rewrites()  # production's SQL: it builds


@pytest.mark.clause("SIM-9")
def test_a_claim_only_rewrite_still_fails_when_the_claim_it_targets_changes_at_run_time() -> None:
    """SIM-9: the run-time half of the guard: a claim-only rewrite that no longer matches the
    claim statement it is sent raises instead of passing the statement through unchanged."""
    rewrite = Replace(r"ORDER BY due_at, id", "ORDER BY id").build()
    claim = load_queries()["claim_due_events"].sql
    assert "ORDER BY id" in rewrite(claim, {})[0]
    with pytest.raises(VariantNoLongerApplies, match="not in the claim statement"):
        rewrite(claim.replace("ORDER BY due_at, id", "ORDER BY due_at"), {})
