"""The decision is pure (ARCH-11): ``nudging.decision.decide`` takes what was read and returns
what to write; its dispatcher (``NudgingPlatform``) reads and writes through its repository."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest

from scheduler.nudging import decision
from scheduler.nudging.decision import BatchState, decide, evaluated_in_order
from scheduler.nudging.orchestrator import Orchestrator, Preferences
from scheduler.nudging.rules import load_catalogue
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.conftest import T0
from tests.helpers import reminder_facts

# What only the dispatcher may name: the session it runs in and the repository it reads and
# writes through.
IMPURE = {"session", "Session", "decisions", "DecisionRepository", "pipeline", "execute", "send"}
DISPATCHER = "NudgingPlatform"


def impure_names(tree: ast.Module) -> list[str]:
    """``function: name`` for each name of ``IMPURE`` a function or class of the module other
    than the dispatcher uses (a parameter, a variable, an attribute)."""
    found: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or node.name == DISPATCHER:
            continue
        for inner in ast.walk(node):
            name = (inner.id if isinstance(inner, ast.Name) else inner.arg if isinstance(inner, ast.arg)
                    else inner.attr if isinstance(inner, ast.Attribute) else None)
            if name in IMPURE:
                found.append(f"{node.name}: {name}")
    return found


@pytest.mark.clause("ARCH-11")
def test_no_function_of_the_decision_but_its_dispatchers_names_a_session_or_a_repository() -> None:
    """ARCH-11: in ``nudging.decision`` only ``NudgingPlatform`` names a session, the decisions'
    repository or a statement's sending; ``decide`` and what it calls get what was read."""
    tree = ast.parse(Path(inspect.getfile(decision)).read_text())
    assert impure_names(tree) == []
    assert "session" not in inspect.signature(decide).parameters


@pytest.mark.clause("ARCH-11")
def test_the_check_finds_a_decision_that_sends_its_own_read() -> None:
    """ARCH-11: the check is not vacuous: a ``decide`` handed the session and the repository
    (the read inside the decision) is found."""
    tree = ast.parse("def decide(session, events, *, decisions):\n"
                     "    return decisions.read_limits(session, events)\n")
    assert set(impure_names(tree)) == {"decide: session", "decide: decisions"}


@pytest.mark.clause("ARCH-11")
def test_a_batch_is_decided_with_no_session_at_all_from_what_was_read() -> None:
    """ARCH-11: with no database, ``decide`` over a state read by hand (a cap of one a day)
    delivers the first reminder, suppresses the second as rate limited and the third as a
    duplicate of the first, and returns the one write of all three."""
    catalogue = load_catalogue(None)
    first, second = reminder_facts(), reminder_facts(day="2026-12-01")  # another key
    events = [DigitalTwinEvent("commitment_reminder", "ann", "c-1", facts) for facts in (first, second, first)]
    candidates = evaluated_in_order(catalogue, events)
    state = BatchState({"ann": Preferences(None, 1)}, {}, {})
    decided = decide(Orchestrator(), events, candidates, state, T0)
    results = [r for r in decided.results if isinstance(r, DispatchResult)]
    assert [r.outcome for r in results] == [DispatchOutcome.DELIVERED, DispatchOutcome.SUPPRESSED,
                                            DispatchOutcome.DUPLICATE]
    statement, parameters = decided.write_statement()
    assert statement == "write_batch_decisions"
    written = json.loads(parameters["batch"])
    assert [(n["user_id"], n["status"], n["reason"]) for n in written["notifications"]] == [
        ("ann", "sent", None), ("ann", "suppressed", "rate_limited"), ("ann", "suppressed", "suppressed_dedup")]
    assert len(written["new_keys"]) == 2 and written["new_keys"][0]["duplicates"] == 1
