"""The rule engine: from a DigitalTwinEvent to the notifications its rules want to send.

The engine decides nothing about delivery (that is the orchestrator's job) and writes
nothing. A refusal here is the sender's fault, said as a ``DispatchOutcome``: a live
request gets the answer the live ingest route maps it to (``LIVE_STATUS``), and a scheduled event records it as ``failed``
with the reason in ``last_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError, UndefinedError

from scheduler.nudging.facts import (
    INVALID_TIME_SCOPE,
    ContractViolation,
    FactsMissing,
    TimeScope,
    TimeScopeError,
    check_facts_contract,
    parse_time_scope,
)
from scheduler.nudging.rules import Catalogue, Rule
from scheduler.types import DigitalTwinEvent, DispatchOutcome


@dataclass(frozen=True)
class RuleRefusal(Exception):
    """The rule engine refuses the event as sent: ``outcome`` says how (no rule for the
    scenario, or an event the rules cannot use), ``reason`` is the machine-readable word."""

    outcome: DispatchOutcome
    reason: str
    detail: Any

    def __str__(self) -> str:
        return self.reason if self.detail in (None, "") else f"{self.reason}: {self.detail}"


@dataclass(frozen=True)
class Candidate:
    """A notification a rule wants to send, before deduplication, preferences and the cap."""

    rule: Rule
    scope: TimeScope
    scenario: str
    title: str
    body: str

    def dedup_key(self, event: DigitalTwinEvent) -> str:
        """``<rule>:<user>:<community or empty>:<scope>`` (REQ-0033)."""
        return f"{self.rule.id}:{event.user_id}:{event.community_id or ''}:{self.scope.value}"


def _render(rule: Rule, context: Mapping[str, Any]) -> tuple[str, str]:
    try:
        return rule.title.render(context), rule.body.render(context)
    except UndefinedError as exc:
        raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "template_variable_missing", f"rule {rule.id}: {exc.message}") from exc
    except TemplateError as exc:  # includes the sandbox's SecurityError
        raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "template_error", f"rule {rule.id}: {exc}") from exc


def evaluate(catalogue: Catalogue, event: DigitalTwinEvent) -> list[Candidate]:
    """Run the rules that claim this event; return the notifications they want.

    Raises ``RuleRefusal`` for the sender's errors: a broken facts contract, an unusable
    time scope, no enabled rule for the scenario at that frequency, missing facts a rule
    requires, or a template naming a variable the facts lack. An evaluator that raises
    is not the sender's fault: its exception propagates.
    """
    try:
        facts = check_facts_contract(event.facts)
    except FactsMissing as exc:
        raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "missing_facts", str(exc)) from exc
    except ContractViolation as exc:
        raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "invalid_facts_contract", list(exc.errors)) from exc
    try:
        scope = parse_time_scope(facts)
    except TimeScopeError as exc:
        raise RuleRefusal(DispatchOutcome.INVALID_EVENT, INVALID_TIME_SCOPE, exc.args[0] if exc.args else None) from exc
    scenario = str(facts["scenario"])
    rules = catalogue.matching(scenario, scope.frequency)
    if not rules:
        raise RuleRefusal(DispatchOutcome.NO_RULE_FOR_SCENARIO, "no_rule_for_scenario", f"no enabled rule claims scenario {scenario!r} at {scope.frequency} frequency")
    for rule in rules:
        missing = [name for name in rule.required_facts if facts.get(name) in (None, "")]
        if missing:
            raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "missing_required_facts", f"rule {rule.id} needs {', '.join(missing)}")
    candidates = []
    for rule in rules:
        extra: Mapping[str, Any] = {}
        evaluator = rule.evaluator()
        if evaluator is not None:
            verdict = evaluator(event)
            if verdict is False:
                continue
            if isinstance(verdict, Mapping):
                extra = verdict
        context = {
            **facts,
            **extra,
            "scope": scope.value,
            "frequency": scope.frequency,
            "user_id": event.user_id,
            "community_id": event.community_id,
            "event_type": event.event_type,
        }
        title, body = _render(rule, context)
        candidates.append(Candidate(rule, scope, scenario, title, body))
    return candidates
