"""Context: the rule catalogue.

In our words: rules are loaded from files (an example set ships, with a commitment
reminder). Each has an id, an enabled flag, the scenarios and the frequency it claims, a
kind, the facts it requires, title and body templates, and optionally an evaluator
(``module:function``) that may decline. Templates are sandboxed Jinja2 with
StrictUndefined: a variable the facts lack is a refusal, never an empty string.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from scheduler.nudging.rules import CatalogueError, RuleRefusal, evaluate, load_catalogue
from scheduler.types import DigitalTwinEvent, DispatchOutcome
from tests.conftest import INGEST
from tests.helpers import reminder_facts


def write_rules(tmp_path: Path, *rules: dict[str, object]) -> Path:
    (tmp_path / "rules.json").write_text(json.dumps(list(rules)))
    return tmp_path


def rule(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "r1", "scenarios": ["s"], "frequency": "daily", "kind": "reminder",
        "required_facts": [], "title": "Hello {{ name }}", "body": "Body for {{ scope }}",
    }
    return {**base, **changes}


def event(**facts: object) -> DigitalTwinEvent:
    return DigitalTwinEvent("t", "p1", None, {"facts_version": "1", "scenario": "s", "date": "2026-11-30", **facts})


@pytest.mark.clause("CTX-RULES.1")
def test_the_shipped_catalogue_loads_and_includes_a_commitment_reminder() -> None:
    """CTX-RULES.1: rules come from files; the example set has an enabled daily commitment reminder."""
    catalogue = load_catalogue()
    reminder = next(r for r in catalogue.rules if r.id == "commitment-reminder")
    assert (reminder.enabled, reminder.frequency, reminder.kind) == (True, "daily", "reminder")
    assert catalogue.matching("commitment_reminder", "daily") == [reminder]
    assert catalogue.matching("commitment_reminder", "weekly") == []


@pytest.mark.clause("CTX-RULES.1")
@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), (json.dumps([rule(frequency="hourly")]), "frequency"),
     (json.dumps([rule(), rule()]), "defined twice"), (json.dumps([rule(title="{{ broken")]), "does not compile"),
     (json.dumps([rule(evaluator="no.such.module:f")]), "cannot be imported"),
     (json.dumps([rule(colour="red")]), "unknown")],
    ids=["json", "frequency", "duplicate-id", "template", "evaluator", "unknown-field"],
)
def test_a_malformed_catalogue_is_refused_with_a_message_naming_the_problem(
    tmp_path: Path, content: str, message: str
) -> None:
    """CTX-RULES.1: a bad rule file fails at load time, naming the file and the problem."""
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(CatalogueError, match=message) as refused:
        load_catalogue(tmp_path)
    assert "bad.json" in str(refused.value)


@pytest.mark.clause("CTX-RULES.2")
def test_a_template_variable_the_facts_lack_is_a_refusal_not_an_empty_string(tmp_path: Path) -> None:
    """CTX-RULES.2: StrictUndefined: a missing variable refuses the event (live 422)."""
    catalogue = load_catalogue(write_rules(tmp_path, rule()))
    with pytest.raises(RuleRefusal) as refused:
        evaluate(catalogue, event())
    assert (refused.value.outcome, refused.value.reason) == (DispatchOutcome.INVALID_EVENT, "template_variable_missing")
    [candidate] = evaluate(catalogue, event(name="Ada"))
    assert (candidate.title, candidate.body) == ("Hello Ada", "Body for 2026-11-30")


@pytest.mark.clause("CTX-RULES.3")
def test_an_evaluator_can_decline_or_fire_with_extra_variables() -> None:
    """CTX-RULES.3: the weekly self-consumption rule's evaluator declines above target, fires below."""
    catalogue = load_catalogue()
    week = {"facts_version": "1", "scenario": "self_consumption", "week": "2026-W48"}
    assert evaluate(catalogue, DigitalTwinEvent("t", "p", None, {**week, "self_consumption_pct": 75})) == []
    [candidate] = evaluate(catalogue, DigitalTwinEvent("t", "p", None, {**week, "self_consumption_pct": 42.5}))
    assert "17.5 points below" in candidate.body


@pytest.mark.clause("CTX-RULES.4")
def test_a_disabled_rule_claims_nothing_so_its_scenario_is_a_400(client: TestClient) -> None:
    """CTX-RULES.4: no enabled rule for the scenario at that frequency is the sender's 400."""
    body = {"event_type": "t", "user_id": "p1",
            "facts": {"facts_version": "1", "scenario": "yearly_review", "period": "2026"}}
    answer = client.post("/admin/ingest-event", headers=INGEST, json=body)
    assert answer.status_code == 400
    assert answer.json()["detail"]["error"] == "no_rule_for_scenario"


@pytest.mark.clause("CTX-RULES.5")
def test_facts_rendered_into_a_message_cannot_execute_anything(tmp_path: Path) -> None:
    """CTX-RULES.5: facts are data: template syntax in them is printed, and the sandbox blocks internals."""
    catalogue = load_catalogue(write_rules(tmp_path, rule(title="{{ name }}", body="{{ name.__class__.__mro__ }}")))
    with pytest.raises(RuleRefusal) as refused:
        evaluate(catalogue, event(name="{{ 7 * 7 }}"))
    assert refused.value.outcome is DispatchOutcome.INVALID_EVENT
    safe = load_catalogue(write_rules(tmp_path, rule(title="{{ name }}", body="ok")))
    [candidate] = evaluate(safe, event(name="{{ 7 * 7 }}{% raw %}"))
    assert candidate.title == "{{ 7 * 7 }}{% raw %}"


@pytest.mark.clause("CTX-RULES.1")
def test_required_facts_missing_are_named_in_the_refusal() -> None:
    """CTX-RULES.1: a rule's required facts are checked before it runs; the refusal names them."""
    facts = reminder_facts()
    del facts["commitment"]
    with pytest.raises(RuleRefusal, match="commitment") as refused:
        evaluate(load_catalogue(), DigitalTwinEvent("t", "p", None, facts))
    assert refused.value.reason == "missing_required_facts"
