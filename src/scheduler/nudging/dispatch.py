"""The one dispatch path shared by live ingest and the scheduler (REQ-0066).

``NudgingPlatform`` is the production ``Dispatcher``: the engine decides what the rules
want, the one decision (``nudging.decision``) what is delivered, and the result carries the
outcome in the domain's words (``DispatchOutcome``), the same for a live and a scheduled
event; only ``web.api.ingest`` maps it to the HTTP answer a live sender gets. A live event (and
an event of the scheduler's per-event path) is a batch of one; a claimed batch is decided
whole (``decide_batch``), its write left to the scheduler, who sends it with the COMMIT.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler.database.decisions import DecisionRepository
from scheduler.nudging.decision import BatchDecisions, Check, decide
from scheduler.nudging.orchestrator import Orchestrator
from scheduler.nudging.rules import Catalogue
from scheduler.types import BatchDispatcher, DigitalTwinEvent, DispatchResult


class NudgingPlatform(BatchDispatcher):
    """Engine plus orchestrator, run inside the caller's transaction. It declares both
    capabilities (``BatchDispatcher``): it decides a claimed batch whole, and it is safe to call
    again."""

    # Every effect is a row written in the session it is handed, and the outbound messages
    # leave only after the commit: calling it again for an event whose first call was rolled
    # back is safe, so a batch runs optimistically, with a replay after a failure (DEC-1.4).
    safe_to_repeat = True

    def __init__(self, catalogue: Catalogue, orchestrator: Orchestrator | None = None, *,
                 decisions: DecisionRepository | None = None) -> None:
        """``decisions``: the reads and writes of the service's ``Database`` (its schema's;
        ``SchedulerService`` passes its own); by default the default schema's, ``scheduler``."""
        self.catalogue = catalogue
        self.orchestrator = orchestrator or Orchestrator()
        self.decisions = decisions if decisions is not None else DecisionRepository.of()

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        """Decide one event as a batch of one and write its decision (one read, one write;
        the participant's lock first unless this transaction holds it). An evaluator's own
        error propagates."""
        decided = decide(self.catalogue, self.orchestrator, session, [event], now, decisions=self.decisions)
        [result] = decided.results
        if isinstance(result, Exception):
            raise result
        if decided.writes_anything:
            self.decisions.write(session, *decided.write_statement())
        return result

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None, check: Check | None = None) -> BatchDecisions:
        """Decide a claimed batch: each event's result as ``__call__`` gives it, one after the
        other at ``now``, read in one statement; the write (``BatchDecisions.write_statement``)
        is left to the caller. ``stop`` and ``check``: see ``decision.decide``."""
        return decide(self.catalogue, self.orchestrator, session, events, now, decisions=self.decisions,
                      stop=stop, check=check)
