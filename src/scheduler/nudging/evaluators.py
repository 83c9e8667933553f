"""Example evaluators referenced by the shipped catalogue (``module:function`` in a rule).

An evaluator returns ``False`` to decline, ``True`` to fire, or a mapping of extra
template variables to fire with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.types import DigitalTwinEvent


def below_target(event: DigitalTwinEvent) -> bool | Mapping[str, Any]:
    """Fire when self-consumption is below the participant's target (default 60 %)."""
    facts = event.facts
    try:
        share = float(facts["self_consumption_pct"])
        target = float(facts.get("target_pct", 60))
    except (TypeError, ValueError):
        return False
    if share >= target:
        return False
    return {"gap_pct": round(target - share, 1)}
