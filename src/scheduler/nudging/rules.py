"""The rule catalogue: rules loaded from JSON files, with sandboxed Jinja2 templates.

A template that names a variable the facts do not carry is a refusal (StrictUndefined),
never an empty string in a participant's message. Templates run in Jinja's sandbox, so
facts rendered into a message cannot reach Python.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from jinja2 import StrictUndefined, Template
from jinja2.sandbox import SandboxedEnvironment

from scheduler.nudging.facts import Frequency
from scheduler.types import DigitalTwinEvent

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
