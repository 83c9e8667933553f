"""The scheduled events' statements the loop runs: the claim, the batch's outcomes with its
COMMIT, the next pending trigger (``core``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database import pipeline
from scheduler.database.repository import Repository


class EventRepository(Repository):
    """The loop's reads and writes of ``scheduled_events``."""

    def claim(self, session: Session, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One round of the claim (``claim_due_events``), sent with the transaction's BEGIN in
        one round trip: the rows it locked or ended expired."""
        [rows] = pipeline.send(session, [self.statements.step("claim_due_events", params)])
        return rows or []

    def record_outcomes(self, session: Session, outcomes: Mapping[str, list[Any]]) -> None:
        """Write the outcomes (``record_outcomes``'s arrays) now, in its own round trip."""
        session.execute(self.statements["record_outcomes"], dict(outcomes))

    def commit_with(self, session: Session, *, statement: str | None = None,
                    params: Mapping[str, Any] | None = None) -> None:
        """Send ``statement`` (a named statement of this schema: the outcomes, or a batch's one
        write) and ``COMMIT`` in one message; no statement: the COMMIT alone."""
        steps = [] if statement is None else [self.statements.step(statement, params or {}, fetch=False)]
        pipeline.send(session, [*steps, pipeline.command("COMMIT")])

    def next_pending_trigger(self, session: Session, after: datetime) -> datetime | None:
        """The earliest pending ``trigger_at`` after ``after``, from the pending index."""
        value = session.execute(self.statements["next_pending_trigger"], {"now": after}).scalar()
        return value if isinstance(value, datetime) else None
