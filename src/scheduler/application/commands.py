"""What operators and senders do to scheduled events: reset, cancel, one row or by query.

Every adapter runs these and nothing else: the API routes, the console, the ``scheduler
events`` commands and the replica simulation (which so proves the very commands
production runs). Each command:

- acts only on rows in its source statuses, the same set for every adapter:
  ``RESETTABLE`` (every status: a cancelled row can be reset, and a pending one is
  re-stamped; see DEC-12 in specs/decisions.md) and ``CANCELLABLE`` (pending, failed);
- is audited: one ``operator_actions`` row (who, through which adapter, why, the query,
  how many rows it changed) and the rows it changed in ``operator_action_events``, in the
  same transaction as the change; a command that found its row but changed nothing (a
  second cancel, a cancel of a dispatched row) is recorded with ``count`` 0;
- names the change and the actor for the row's history trigger;
- returns a typed record, never a dict.

A one-row command locks its row first (``SELECT ... FOR UPDATE``), so it waits for a batch
that is dispatching the row and then decides on the row's newest status: a row is never
both dispatched and cancelled. A bulk command acts on what its dry run counted: the rows
that match the query, are in a source status and have not changed since the dry run
(``updated_at <= as_of``), at most ``cap``; it works in chunks of ``chunk`` rows, each its
own short transaction that skips rows a poll holds (``FOR UPDATE SKIP LOCKED``), so it
never holds the loop up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy.orm import Session

from scheduler.application.events import EventQuery, EventRecord, QueryError
from scheduler.database.database import Database
from scheduler.types import EventStatus

# The source statuses of each command, from the status enum; every adapter uses these.
RESETTABLE: frozenset[EventStatus] = frozenset(EventStatus)
CANCELLABLE: frozenset[EventStatus] = frozenset({EventStatus.PENDING, EventStatus.FAILED})
BULK_CAP = 10_000
CHUNK = 500
MAX_REASON = 2000


@dataclass(frozen=True)
class Actor:
    """Who acts (a token's subject, ``cli:$USER``, ``simulation``) and through which adapter."""

    name: str
    source: Literal["api", "console", "cli", "simulation", "host"]


ResetOutcome = Literal["reset", "missing"]
CancelOutcome = Literal["cancelled", "already_cancelled", "dispatched", "expired", "missing"]


@dataclass(frozen=True)
class ResetResult:
    """What a reset found: ``reset`` (``event`` is the row, pending again) or ``missing``
    (no such row, nothing recorded)."""

    outcome: ResetOutcome
    event: EventRecord | None
    action_id: int | None


@dataclass(frozen=True)
class CancelResult:
    """What a cancel found: ``cancelled``; ``already_cancelled`` (the same row, nothing
    written to it); ``dispatched`` (it stays dispatched: the API's 409); or ``missing``."""

    outcome: CancelOutcome
    event: EventRecord | None
    action_id: int | None


@dataclass(frozen=True)
class BulkResult:
    """A bulk command's audit row, how many rows it changed, in how many chunks."""

    action_id: int
    changed: int
    chunks: int


def sources_json(sources: frozenset[EventStatus]) -> list[str]:
    """Source statuses in the enum's order, as the SQL binds them."""
    return [str(s) for s in EventStatus if s in sources]


def _clean_reason(reason: str | None) -> str | None:
    return (reason or "").strip()[:MAX_REASON] or None


def _record(session: Session, database: Database, *, now: datetime, actor: Actor, action: str, event_id: str | None,
            query: EventQuery | None, count: int, reason: str | None) -> int:
    return database.operations.record_action(
        session, now=now, actor=actor.name, source=actor.source, action=action, event_id=event_id,
        filter_json=None if query is None else json.dumps(query.as_json()), count=count, reason=reason)


def _one_row(database: Database, *, action: str, change: str, update: str,
             sources: frozenset[EventStatus], now: datetime, actor: Actor, reason: str | None,
             event_id: str | None, external_key: str | None) -> tuple[EventRecord | None, bool, int | None]:
    """Lock the row, change it if its status is a source, record the action: (row, changed, action id)."""
    with database.begin() as session:
        return _one_row_in(session, database, action=action, change=change, update=update, sources=sources, now=now,
                           actor=actor, reason=reason, event_id=event_id, external_key=external_key)


def _one_row_in(session: Session, database: Database, *, action: str, change: str, update: str,
                sources: frozenset[EventStatus], now: datetime, actor: Actor, reason: str | None,
                event_id: str | None, external_key: str | None) -> tuple[EventRecord | None, bool, int | None]:
    """``_one_row`` in the caller's transaction."""
    if (event_id is None) == (external_key is None):
        raise ValueError("name the row by exactly one of event_id and external_key")
    locked = database.events.lock(session, event_id=event_id, external_key=external_key)
    if locked is None:
        return None, False, None
    row, changed = locked, EventStatus(locked["status"]) in sources
    if changed:
        database.events.set_change_context(session, change, actor.name)  # the row's history names the change and who
        row = database.events.change(session, update, {"id": locked["id"], "now": now,
                                                       "sources": sources_json(sources)})
    action_id = _record(session, database, now=now, actor=actor, action=action, event_id=locked["id"], query=None,
                        count=int(changed), reason=_clean_reason(reason))
    if changed:
        database.operations.link_action_events(session, action_id, [locked["id"]])
    return EventRecord.from_row(row), changed, action_id


def reset(database: Database, event_id: str, *, now: datetime, actor: Actor,
          reason: str | None = None) -> ResetResult:
    """The reset by hand (REQ-0065): a row back to pending, ``dispatched_at`` and
    ``last_error`` cleared; the loop takes it again when due (its ``trigger_at``, and so its
    place in the claim order, are kept)."""
    row, changed, action_id = _one_row(database, action="reset", change="reset", update="reset_event",
                                       sources=RESETTABLE, now=now, actor=actor, reason=reason,
                                       event_id=event_id, external_key=None)
    if row is None or not changed:  # every status is RESETTABLE: an existing row is always reset
        return ResetResult("missing", None, None)
    return ResetResult("reset", row, action_id)


def cancel(database: Database, *, now: datetime, actor: Actor, event_id: str | None = None,
           external_key: str | None = None, reason: str | None = None) -> CancelResult:
    """Withdraw the row named by ``event_id`` or ``external_key``: a ``CANCELLABLE`` row
    becomes ``cancelled`` (terminal; the claim never takes it); a failed row keeps its error."""
    row, changed, action_id = _one_row(database, action="cancel", change="cancelled", update="cancel_event",
                                       sources=CANCELLABLE, now=now, actor=actor, reason=reason,
                                       event_id=event_id, external_key=external_key)
    return _cancel_result(row, changed, action_id)


def cancel_in(session: Session, database: Database, *, now: datetime, actor: Actor, event_id: str | None = None,
              external_key: str | None = None, reason: str | None = None) -> CancelResult:
    """``cancel`` in the caller's transaction (a host's own code, ``scheduler.cancel``): the
    row's change and its audit entry are committed with the caller's commit, gone with its rollback."""
    row, changed, action_id = _one_row_in(session, database, action="cancel", change="cancelled",
                                          update="cancel_event", sources=CANCELLABLE, now=now, actor=actor,
                                          reason=reason,
                                          event_id=event_id, external_key=external_key)
    return _cancel_result(row, changed, action_id)


def _cancel_result(row: EventRecord | None, changed: bool, action_id: int | None) -> CancelResult:
    if row is None:
        return CancelResult("missing", None, None)
    if changed:
        return CancelResult("cancelled", row, action_id)
    # dispatched and expired are terminal outcomes of the loop's: a cancel cannot undo either (EXP-3)
    outcome: CancelOutcome = ("dispatched" if row.status is EventStatus.DISPATCHED
                              else "expired" if row.status is EventStatus.EXPIRED else "already_cancelled")
    return CancelResult(outcome, row, action_id)


def count_matching(database: Database, query: EventQuery, sources: frozenset[EventStatus],
                   *, cap: int = BULK_CAP) -> int:
    """The dry run: how many rows a bulk command over ``sources`` would change now
    (``cap + 1`` means more than ``cap``)."""
    with database.begin() as session:
        return database.events.count_filtered(session, {**query.params(), "sources": sources_json(sources), "cap": cap})


# A bulk command by the status it sets: its audit action, its history change, the statuses it acts on.
_BULK: dict[EventStatus, tuple[str, str, frozenset[EventStatus]]] = {
    EventStatus.PENDING: ("bulk_reset", "reset", RESETTABLE),
    EventStatus.CANCELLED: ("bulk_cancel", "cancelled", CANCELLABLE),
}


def _bulk(database: Database, query: EventQuery, *, to: EventStatus, now: datetime, as_of: datetime,
          expected: int, actor: Actor, reason: str, cap: int, chunk: int) -> BulkResult:
    action, change, sources = _BULK[to]
    why = _clean_reason(reason)
    if why is None:
        raise QueryError("reason", f"a bulk {action.removeprefix('bulk_')} needs a reason")
    limit = max(min(expected, cap), 0)
    with database.begin() as session:
        action_id = _record(session, database, now=now, actor=actor, action=action, event_id=None, query=query,
                            count=0, reason=why)
    done, chunks, after = 0, 0, ""
    params = {**query.params(), "sources": sources_json(sources), "as_of": as_of, "now": now, "to": str(to)}
    while done < limit:
        with database.begin() as session:
            database.events.set_change_context(session, change, actor.name)
            ids = database.events.change_filtered_chunk(session, {**params, "after_id": after,
                                                                  "chunk": min(chunk, limit - done)})
            if not ids:
                break
            database.operations.link_action_events(session, action_id, ids)
            done += len(ids)
            database.operations.set_action_count(session, action_id, done)
        chunks += 1
        after = max(ids)
    return BulkResult(action_id, done, chunks)


def bulk_reset(database: Database, query: EventQuery, *, now: datetime, as_of: datetime,
               expected: int, actor: Actor, reason: str, cap: int = BULK_CAP, chunk: int = CHUNK) -> BulkResult:
    """Reset what the dry run at ``as_of`` counted (at most ``min(expected, cap)`` ``RESETTABLE`` rows), in chunks."""
    return _bulk(database, query, to=EventStatus.PENDING, now=now, as_of=as_of, expected=expected, actor=actor,
                 reason=reason,
                 cap=cap, chunk=chunk)


def bulk_cancel(database: Database, query: EventQuery, *, now: datetime, as_of: datetime,
                expected: int, actor: Actor, reason: str, cap: int = BULK_CAP, chunk: int = CHUNK) -> BulkResult:
    """Cancel what the dry run at ``as_of`` counted (at most ``min(expected, cap)`` ``CANCELLABLE`` rows), in chunks."""
    return _bulk(database, query, to=EventStatus.CANCELLED, now=now, as_of=as_of, expected=expected, actor=actor,
                 reason=reason,
                 cap=cap, chunk=chunk)
