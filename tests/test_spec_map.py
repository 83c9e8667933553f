"""specs/ maps every clause to the tests that prove it; this reads the map both ways.

Clauses are the ``### ID — statement`` headings of ``specs/*.md``, each followed by a
``Proved by:`` list of test node ids. Tests carry ``@pytest.mark.clause("ID")``. Both are
read by ``harness.spec_report.specs``, the parser the spec report uses too; the markers
are read from the source (not from a pytest run), so the check holds whatever subset of the
suite is selected.
"""

from __future__ import annotations

from pathlib import Path

from harness.spec_report.specs import markers_in_source, parse_specs

ROOT = Path(__file__).resolve().parent.parent


def spec_clauses() -> dict[str, set[str]]:
    """Clause id -> test node ids listed under it, over every spec page."""
    return {cid: set(clause.tests) for cid, clause in parse_specs(ROOT / "specs").clauses.items()}


def test_markers() -> dict[str, set[str]]:
    """Test node id -> the clauses its markers name, read from every test module's source."""
    return markers_in_source(ROOT)


test_markers.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def test_no_clause_is_defined_twice() -> None:
    """Each clause ID heads one clause only, across every page of specs/."""
    assert parse_specs(ROOT / "specs").problems == []


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
