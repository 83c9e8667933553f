"""The one dispatch path shared by live ingest and the scheduler (REQ-0066).

``NudgingPlatform`` is the production ``Dispatcher``: the engine decides what the rules
want, the orchestrator decides what is delivered, and the result carries the outcome in
the domain's words (``DispatchOutcome``), the same for a live and a scheduled event; only
app.py maps it to the HTTP answer a live sender gets.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.nudging.orchestrator import Orchestrator
from scheduler.nudging.rule_engine import RuleRefusal, evaluate
from scheduler.nudging.rules import Catalogue
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult


class NudgingPlatform:
    """Engine plus orchestrator, run inside the caller's transaction."""

    def __init__(self, catalogue: Catalogue, orchestrator: Orchestrator | None = None) -> None:
        self.catalogue = catalogue
        self.orchestrator = orchestrator or Orchestrator()

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        try:
            candidates = evaluate(self.catalogue, event)
        except RuleRefusal as refusal:
            return DispatchResult(
                outcome=refusal.outcome,
                refusal=str(refusal),
                detail={"error": refusal.reason, "detail": refusal.detail},
            )
        if not candidates:
            return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)
        result = DispatchResult(outcome=DispatchOutcome.SUPPRESSED)
        duplicates = 0
        for candidate in candidates:
            decision = self.orchestrator.decide(session, event, candidate, now)
            duplicates += decision.duplicate
            if decision.notification is not None:
                result.notifications.append(_as_recorded(decision.notification))
            result.outbound.extend(decision.outbound)
        if result.outbound:
            result.outcome = DispatchOutcome.DELIVERED
        elif duplicates == len(candidates):
            result.outcome = DispatchOutcome.DUPLICATE
        return result


def _as_recorded(row: dict[str, Any]) -> dict[str, Any]:
    """A notification as it was recorded: the insert's ``now`` parameter is its ``created_at``."""
    notification = {k: v for k, v in row.items() if k != "now"}
    notification["created_at"] = row["now"]
    return notification
