"""Cancel by an operator (issue 17 §4): one row, or every row a filter selects, audited.

``cancel_one`` is the API's cancel (``scheduler.web.lifecycle``: lock the row, then cancel a
pending or failed one; a dispatched row stays dispatched) with the audit record written in
the same transaction. ``bulk_cancel`` works as ``audit.bulk_reset`` does: it acts on what
its dry run (``count_cancellable``) counted at ``as_of`` (pending or failed rows matching the
filter that have not changed since), at most ``min(expected, cap)`` rows, in chunks of
``chunk``, each its own short transaction that skips rows a poll holds
(``FOR UPDATE SKIP LOCKED``): a row being dispatched ends dispatched, never both. Every
action is recorded in ``operator_actions`` with who, when, the filter, the count and the
(required) reason, and linked to the rows it touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from scheduler.application.audit import BULK_CAP, CHUNK, EventFilter, FilterError, _record
from scheduler.core.store import event_to_json, set_change_context
from scheduler.database.queries import statement

CancelOutcome = Literal["cancelled", "already_cancelled", "dispatched", "missing"]


@dataclass(frozen=True)
class CancelDone:
    """What an operator's cancel found: the row (None when missing) and what became of it."""

    outcome: CancelOutcome
    row: dict[str, Any] | None


@dataclass(frozen=True)
class BulkCancelled:
    action_id: int
    cancelled: int
    chunks: int


def _reason(reason: str | None) -> str:
    text = (reason or "").strip()
    if not text:
        raise FilterError("reason: a cancel needs a reason")
    return text[:2000]


def cancel_one(sessions: sessionmaker[Session], event_id: str, now: datetime, *, actor: str, source: str,
               reason: str | None) -> CancelDone:
    """Cancel one pending or failed row and record it, in one transaction (only a change is recorded)."""
    why = _reason(reason)
    with sessions.begin() as session:
        # waits for a batch that is dispatching the row, then reads its newest version
        locked = session.execute(statement("lock_event_by_id"), {"id": event_id}).mappings().first()
        if locked is None:
            return CancelDone("missing", None)
        if locked["status"] in ("dispatched", "cancelled"):
            outcome: CancelOutcome = "dispatched" if locked["status"] == "dispatched" else "already_cancelled"
            return CancelDone(outcome, event_to_json(locked))
        set_change_context(session, "cancelled", actor)  # the row's history names the change and who
        row = session.execute(statement("cancel_event"), {"id": event_id, "now": now}).mappings().one()
        action_id = _record(session, now=now, actor=actor, source=source, action="cancel",
                            event_id=event_id, filter=None, count=1, reason=why)
        session.execute(statement("link_action_events"), {"action_id": action_id, "event_ids": [event_id]})
        return CancelDone("cancelled", event_to_json(row))


def count_cancellable(sessions: sessionmaker[Session], where: EventFilter, *, cap: int = BULK_CAP) -> int:
    """The dry run: how many rows a bulk cancel would touch now (``cap + 1`` means more than cap)."""
    with sessions.begin() as session:
        count: int = session.execute(statement("count_cancellable_events"),
                                     {**where.params(), "cap": cap}).scalar_one()
        return count


def bulk_cancel(sessions: sessionmaker[Session], where: EventFilter, *, now: datetime, as_of: datetime,
                expected: int, actor: str, source: str, reason: str,
                cap: int = BULK_CAP, chunk: int = CHUNK) -> BulkCancelled:
    """Cancel what the dry run at ``as_of`` counted (at most ``min(expected, cap)`` rows), in chunks."""
    why = _reason(reason)
    limit = max(min(expected, cap), 0)
    with sessions.begin() as session:
        action_id = _record(session, now=now, actor=actor, source=source, action="bulk_cancel",
                            event_id=None, filter=where.as_json(), count=0, reason=why)
    done, chunks, after = 0, 0, ""
    params = {**where.params(), "as_of": as_of, "now": now}
    while done < limit:
        with sessions.begin() as session:
            set_change_context(session, "cancelled", actor)
            ids = list(session.execute(statement("cancel_filtered_chunk"), {
                **params, "after_id": after, "chunk": min(chunk, limit - done),
            }).scalars())
            if not ids:
                break
            session.execute(statement("link_action_events"), {"action_id": action_id, "event_ids": ids})
            done += len(ids)
            session.execute(statement("set_operator_action_count"), {"id": action_id, "count": done})
        chunks += 1
        after = max(ids)
    return BulkCancelled(action_id, done, chunks)
