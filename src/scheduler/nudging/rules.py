"""The rules: a catalogue loaded from JSON files, and the engine that runs it on an event.

A rule claims scenarios at a frequency and makes a message from sandboxed Jinja2 templates.
A template that names a variable the facts do not carry is a refusal (StrictUndefined),
never an empty string in a participant's message; templates run in Jinja's sandbox, so
facts rendered into a message cannot reach Python.

The engine (``evaluate``) turns a DigitalTwinEvent into the notifications its rules want to
send; it decides nothing about delivery (that is ``nudging.decision``'s) and writes nothing.
A refusal is the sender's fault, said as a ``DispatchOutcome``: a live request gets the
answer the live route maps it to (``LIVE_STATUS``), and a scheduled event records it as
``failed`` with the reason in ``last_error``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from jinja2 import StrictUndefined, Template, TemplateError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

from scheduler.nudging.facts import (
    INVALID_TIME_SCOPE,
    ContractViolation,
    FactsMissing,
    Frequency,
    TimeScope,
    TimeScopeError,
    check_facts_contract,
    parse_time_scope,
)
from scheduler.types import DigitalTwinEvent, DispatchOutcome

DEFAULT_CATALOGUE = Path(__file__).parent / "rules_catalogue"
FREQUENCIES: tuple[Frequency, ...] = ("daily", "weekly", "monthly", "yearly")

EvaluatorResult = bool | Mapping[str, Any]
Evaluator = Callable[[DigitalTwinEvent], EvaluatorResult]

_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


class CatalogueError(ValueError):
    """A rule file is malformed; the message names the file and the rule."""


@dataclass(frozen=True)
class Rule:
    """One rule: which scenarios at which frequency it claims, and the message it makes."""

    id: str
    enabled: bool
    scenarios: tuple[str, ...]
    frequency: Frequency
    kind: str
    required_facts: tuple[str, ...]
    title_template: str
    body_template: str
    evaluator_path: str | None = None

    @property
    def title(self) -> Template:
        return _compiled(self.title_template)

    @property
    def body(self) -> Template:
        return _compiled(self.body_template)

    def evaluator(self) -> Evaluator | None:
        if self.evaluator_path is None:
            return None
        return _import_evaluator(self.evaluator_path)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "enabled": self.enabled,
            "scenarios": list(self.scenarios),
            "frequency": self.frequency,
            "kind": self.kind,
            "required_facts": list(self.required_facts),
            "evaluator": self.evaluator_path,
        }


_TEMPLATES: dict[str, Template] = {}


def _compiled(source: str) -> Template:
    template = _TEMPLATES.get(source)
    if template is None:
        template = _ENV.from_string(source)
        _TEMPLATES[source] = template
    return template


def _import_evaluator(path: str) -> Evaluator:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise CatalogueError(f"evaluator {path!r} must look like 'package.module:function'")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise CatalogueError(f"evaluator {path!r} cannot be imported: {exc}") from exc
    if not callable(func):
        raise CatalogueError(f"evaluator {path!r} is not callable")
    return cast(Evaluator, func)


def _parse_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: a rule must be a JSON object")
    rule_id = raw.get("id")
    if not isinstance(rule_id, str) or not rule_id:
        raise CatalogueError(f"{where}: every rule needs a non-empty string 'id'")
    where = f"{where}: rule {rule_id!r}"
    scenarios = raw.get("scenarios")
    if not isinstance(scenarios, list) or not scenarios or not all(isinstance(s, str) and s for s in scenarios):
        raise CatalogueError(f"{where}: 'scenarios' must be a non-empty list of strings")
    frequency = raw.get("frequency")
    if frequency not in FREQUENCIES:
        raise CatalogueError(f"{where}: 'frequency' must be one of {', '.join(FREQUENCIES)}")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        raise CatalogueError(f"{where}: 'kind' must be a non-empty string")
    required = raw.get("required_facts", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise CatalogueError(f"{where}: 'required_facts' must be a list of strings")
    title, body = raw.get("title"), raw.get("body")
    if not isinstance(title, str) or not isinstance(body, str):
        raise CatalogueError(f"{where}: 'title' and 'body' templates must be strings")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise CatalogueError(f"{where}: 'enabled' must be true or false")
    evaluator = raw.get("evaluator")
    if evaluator is not None and not isinstance(evaluator, str):
        raise CatalogueError(f"{where}: 'evaluator' must be 'module:function'")
    unknown = set(raw) - {"id", "enabled", "scenarios", "frequency", "kind", "required_facts",
                          "title", "body", "evaluator", "description"}
    if unknown:
        raise CatalogueError(f"{where}: unknown fields {sorted(unknown)}")
    rule = Rule(
        id=rule_id,
        enabled=enabled,
        scenarios=tuple(scenarios),
        frequency=cast(Frequency, frequency),
        kind=kind,
        required_facts=tuple(required),
        title_template=title,
        body_template=body,
        evaluator_path=evaluator,
    )
    try:
        rule.title  # noqa: B018 - compile now so that a syntax error fails at load time
        rule.body  # noqa: B018
    except Exception as exc:
        raise CatalogueError(f"{where}: template does not compile: {exc}") from exc
    try:
        rule.evaluator()  # import now: a typo in a rule file fails at start, not at dispatch
    except CatalogueError as exc:
        raise CatalogueError(f"{where}: {exc}") from exc
    return rule


@dataclass(frozen=True)
class Catalogue:
    """The loaded rules, in file order."""

    rules: tuple[Rule, ...]

    def scenarios(self) -> tuple[str, ...]:
        """The scenarios the enabled rules claim, in file order: the event types this
        catalogue is written for (the shipped ones send each under its scenario's name)."""
        return tuple(dict.fromkeys(s for r in self.rules if r.enabled for s in r.scenarios))

    def matching(self, scenario: str, frequency: Frequency) -> list[Rule]:
        """Enabled rules that claim ``scenario`` at ``frequency``."""
        return [r for r in self.rules if r.enabled and scenario in r.scenarios and r.frequency == frequency]


def load_catalogue(directory: Path | None = None) -> Catalogue:
    """Load every ``*.json`` in ``directory`` (default: the example catalogue shipped here).

    Each file holds one rule object or a list of them; rule ids must be unique.
    """
    directory = directory or DEFAULT_CATALOGUE
    if not directory.is_dir():
        raise CatalogueError(f"rules directory {directory} does not exist")
    rules: list[Rule] = []
    seen: set[str] = set()
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CatalogueError(f"{path}: not valid JSON: {exc}") from exc
        for raw in data if isinstance(data, list) else [data]:
            rule = _parse_rule(raw, str(path))
            if rule.id in seen:
                raise CatalogueError(f"{path}: rule id {rule.id!r} is defined twice")
            seen.add(rule.id)
            rules.append(rule)
    return Catalogue(tuple(rules))


# -- the engine: an event's rules run ---------------------------------------------------


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
        raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "template_variable_missing",
                          f"rule {rule.id}: {exc.message}") from exc
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
        raise RuleRefusal(DispatchOutcome.NO_RULE_FOR_SCENARIO, "no_rule_for_scenario",
                          f"no enabled rule claims scenario {scenario!r} at {scope.frequency} frequency")
    for rule in rules:
        missing = [name for name in rule.required_facts if facts.get(name) in (None, "")]
        if missing:
            raise RuleRefusal(DispatchOutcome.INVALID_EVENT, "missing_required_facts",
                              f"rule {rule.id} needs {', '.join(missing)}")
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
