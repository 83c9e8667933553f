"""The one dispatch path shared by live ingest and the scheduler (REQ-0066).

``NudgingPlatform`` is the production ``Dispatcher``: the engine decides what the rules
want, the orchestrator decides what is delivered, and the result carries the outcome in
the domain's words (``DispatchOutcome``), the same for a live and a scheduled event; only
app.py maps it to the HTTP answer a live sender gets. A scheduler's batch may be decided
set-based (``decide_batch``, ``set_dispatch``): the same results, fewer statements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler.nudging.orchestrator import Orchestrator, as_recorded
from scheduler.nudging.rule_engine import RuleRefusal, evaluate
from scheduler.nudging.rules import Catalogue
from scheduler.nudging.set_dispatch import BatchDecisions, plan
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult


class NudgingPlatform:
    """Engine plus orchestrator, run inside the caller's transaction."""

    # Every effect is a row written in the session it is handed, and the outbound messages
    # leave only after the commit: calling it again for an event whose first call was rolled
    # back is safe, so a batch runs optimistically, with a replay after a failure (DEC-1.4).
    safe_to_repeat = True

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
                result.notifications.append(as_recorded(decision.notification))
            result.outbound.extend(decision.outbound)
        if result.outbound:
            result.outcome = DispatchOutcome.DELIVERED
        elif duplicates == len(candidates):
            result.outcome = DispatchOutcome.DUPLICATE
        return result


    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None) -> BatchDecisions | None:
        """Decide a claimed batch set-based: each event's result as ``__call__`` would give it,
        one after the other at ``now``, read in one statement; the writes are left to
        ``BatchDecisions.write``. ``None`` when only the per-event path applies (channels
        other than the built-in in-app one)."""
        return plan(self.catalogue, self.orchestrator, session, events, now, stop)
