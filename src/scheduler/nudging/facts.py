"""The facts contract (REQ-0012) and the time scope (REQ-0020, REQ-0021).

One implementation, used by both routes and by the engine: a scheduled event is
checked against the contract when it is stored, and its time scope only when it fires.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

if TYPE_CHECKING:
    from pydantic import BaseModel

Frequency = Literal["daily", "weekly", "monthly", "yearly"]
TIME_FIELDS = ("time", "date", "week", "period")
REQUIRED_STRINGS = ("facts_version", "scenario")
INVALID_TIME_SCOPE = "missing_or_invalid_time_scope"


class FactsMissing(ValueError):
    """``facts`` is absent, null or empty."""


@dataclass(frozen=True)
class ContractViolation(ValueError):
    """``facts`` is present but lacks ``facts_version`` or ``scenario`` as non-empty strings."""

    errors: tuple[dict[str, str], ...]

    def __str__(self) -> str:
        return "invalid_facts_contract: " + "; ".join(e["message"] for e in self.errors)


def check_facts_contract(facts: Any) -> Mapping[str, Any]:
    """Return ``facts`` if it honours the contract; raise ``FactsMissing`` or ``ContractViolation``."""
    if facts is None or (isinstance(facts, Mapping) and not facts):
        raise FactsMissing("facts are missing or empty")
    if not isinstance(facts, Mapping):
        raise ContractViolation(
            ({"field": "facts", "message": "facts must be a JSON object"},)
        )
    errors = []
    for name in REQUIRED_STRINGS:
        value = facts.get(name)
        if value is None:
            errors.append({"field": f"facts.{name}", "message": f"facts.{name} is required"})
        elif not isinstance(value, str):
            errors.append({"field": f"facts.{name}", "message": f"facts.{name} must be a string"})
        elif not value.strip():
            errors.append({"field": f"facts.{name}", "message": f"facts.{name} must not be empty"})
    if errors:
        raise ContractViolation(tuple(errors))
    return facts


# A host's own facts contract (``SchedulerService(facts_contract=...)``, DEC-FACTS-CONTRACT): a
# pydantic model the facts must validate as, or a callable that raises ``ValueError`` (its
# message the refusal's) for facts it refuses. It replaces the built-in one wherever an event
# is stored: the single POST, the batch route, the import and ``scheduler.schedule``.
FactsContract: TypeAlias = "type[BaseModel] | Callable[[Mapping[str, Any]], object]"


def host_contract_errors(contract: FactsContract, facts: Mapping[str, Any]) -> list[dict[str, str]]:
    """The ``{field, message}`` of each way ``facts`` breaks the host's ``contract`` (empty: it
    honours it). A pydantic refusal names each field (``facts.<path>``); a ``ValueError`` of a
    callable names ``facts`` with its message. Anything else the contract raises is the host's
    bug and propagates."""
    from pydantic import BaseModel, ValidationError

    try:
        if isinstance(contract, type) and issubclass(contract, BaseModel):
            contract.model_validate(dict(facts))
        else:
            cast("Callable[[Mapping[str, Any]], object]", contract)(facts)
    except ValidationError as exc:
        return [{"field": ".".join(["facts", *(str(part) for part in error["loc"])]), "message": error["msg"]}
                for error in exc.errors(include_url=False)] or [{"field": "facts", "message": str(exc)}]
    except ValueError as exc:
        return [{"field": "facts", "message": str(exc) or "refused by the facts contract"}]
    return []


@dataclass(frozen=True)
class TimeScope:
    """The period an event speaks of, e.g. ``2026-W48`` (weekly)."""

    frequency: Frequency
    value: str


class TimeScopeError(ValueError):
    """The facts carry no usable time scope."""

    def __str__(self) -> str:
        return INVALID_TIME_SCOPE + (f": {self.args[0]}" if self.args else "")


# ASCII digits only: \d alone also matches fullwidth or Arabic-Indic digits, which int() reads as 2026,
# so one period could be spelt several ways and slip past deduplication.
_DAILY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$", re.ASCII)
_WEEKLY = re.compile(r"^(\d{4})-W(\d{2})$", re.ASCII)
_MONTHLY = re.compile(r"^(\d{4})-(\d{2})$", re.ASCII)
_YEARLY = re.compile(r"^(\d{4})$", re.ASCII)


def _valid_daily(text: str) -> bool:
    match = _DAILY.match(text)
    if not match:
        return False
    try:
        date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return False
    return True


def _valid_weekly(text: str) -> bool:
    match = _WEEKLY.match(text)
    if not match:
        return False
    try:
        date.fromisocalendar(int(match[1]), int(match[2]), 1)
    except ValueError:
        return False
    return True


def _valid_monthly(text: str) -> bool:
    match = _MONTHLY.match(text)
    return match is not None and 1 <= int(match[2]) <= 12


def parse_time_scope(facts: Mapping[str, Any]) -> TimeScope:
    """The frequency and value of the first non-empty of ``time``, ``date``, ``week``, ``period``.

    Only the first non-empty field counts (trimmed); if it is not one of the four
    shapes the event is refused with ``missing_or_invalid_time_scope``.
    """
    for name in TIME_FIELDS:
        raw = facts.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise TimeScopeError(f"facts.{name} must be a string")
        candidate = raw.strip()
        if not candidate:
            continue
        if _valid_daily(candidate):
            return TimeScope("daily", candidate)
        if _valid_weekly(candidate):
            return TimeScope("weekly", candidate)
        if _valid_monthly(candidate):
            return TimeScope("monthly", candidate)
        if _YEARLY.match(candidate):
            return TimeScope("yearly", candidate)
        raise TimeScopeError(f"facts.{name}={candidate!r} is not YYYY-MM-DD, YYYY-Www, YYYY-MM or YYYY")
    raise TimeScopeError("none of facts.time, facts.date, facts.week, facts.period is set")
