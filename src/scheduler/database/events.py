"""The scheduled events' statements: the claim, the batch's outcomes with its COMMIT, the
next pending trigger (``core``); storing, listing, changing and counting rows.

And the participants' locks: transaction-level advisory locks, one per participant. Every
decision about one participant (deduplication, preferences, the daily cap) happens under
that participant's lock, so the cap is exact across replicas. A claim only *tries* the
locks of the participants it claims, in its own statement, leaves a busy participant's rows
alone (DEC-2) and remembers those it got; the one decision (``nudging.decision``, through
``DecisionRepository.read_limits``) takes, waiting, those its transaction does not hold yet
(a live event's), so an event of a claimed batch asks for none. The key is defined here
(the claim's SQL computes the same), below both peers that share it (ARCH-5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database import pipeline
from scheduler.database.repository import Repository


def participant_lock_key(user_id: str) -> int:
    """A stable signed 64-bit advisory-lock key for one participant: the first 8 bytes of
    ``sha256("nudging-participant:" + user_id)``, which the claim computes in SQL
    (``{{participant_lock_key}}`` in ``queries.sql``), so it try-locks in its own statement."""
    digest = hashlib.sha256(f"nudging-participant:{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Where a session remembers the participant locks its current transaction holds at its
# top level (outside any savepoint), so that an event does not ask for them again.
_HELD_LOCKS = "scheduler.database.events.participant_locks"


def remember_participant_locks(session: Session, keys: Iterable[int]) -> None:
    """Note that the current transaction holds the advisory locks ``keys`` to its end.

    Only locks taken at the top level count: a lock taken inside a savepoint is released
    if the savepoint rolls back, so it is not remembered.
    """
    if session.in_nested_transaction():
        return
    transaction = session.get_transaction()
    held: tuple[object, set[int]] | None = session.info.get(_HELD_LOCKS)
    if held is None or held[0] is not transaction:
        held = (transaction, set())
        session.info[_HELD_LOCKS] = held
    held[1].update(keys)


def holds_participant_lock(session: Session, key: int) -> bool:
    """True when the current transaction took ``key`` at its top level (see above)."""
    held = session.info.get(_HELD_LOCKS)
    return held is not None and held[0] is session.get_transaction() and key in held[1]


def locks_to_take(session: Session, user_ids: Iterable[str]) -> list[int]:
    """The lock keys of ``user_ids`` this transaction does not hold yet, in a stable order (to
    be taken, waiting, with ``lock_participant`` statements): a second, re-entrant request for
    a lock the claim took would be a round trip per event for nothing."""
    keys = sorted({participant_lock_key(user_id) for user_id in user_ids})
    return [key for key in keys if not holds_participant_lock(session, key)]


class EventRepository(Repository):
    """The loop's reads and writes of ``scheduled_events``."""

    def claim(self, session: Session, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One round of the claim (``claim_due_events``), sent with the transaction's BEGIN in
        one round trip: the rows it locked or ended expired. The statement try-locked each
        participant once: those it got are remembered, so the events' decisions ask for none."""
        [rows] = pipeline.send(session, [self.statements.step("claim_due_events", params)])
        remember_participant_locks(session, {participant_lock_key(r["user_id"]) for r in rows or () if r["held"]})
        return rows or []

    def record_outcomes(self, session: Session, outcomes: Mapping[str, list[Any]]) -> None:
        """Write the outcomes (``record_outcomes``'s arrays) now, in its own round trip."""
        session.execute(self.statements["record_outcomes"], dict(outcomes))

    def commit_with(self, session: Session, *, statement: str | None = None,
                    params: Mapping[str, Any] | None = None) -> None:
        """Send ``statement`` (a named statement of this schema: the outcomes, or a batch's one
        write) and ``COMMIT`` in one message; no statement: the COMMIT alone."""
        steps = [] if statement is None else [self.statements.step(statement, params or {}, fetch=False)]
        pipeline.send(session, steps, commit=True)

    def next_pending_trigger(self, session: Session, after: datetime) -> datetime | None:
        """The earliest pending ``trigger_at`` after ``after``, from the pending index."""
        value = session.execute(self.statements["next_pending_trigger"], {"now": after}).scalar()
        return value if isinstance(value, datetime) else None

    # -- what senders and operators do to rows (``core.store``, ``scheduler.application``) --

    def set_change_context(self, session: Session, change: str | None, actor: str | None) -> None:
        """Name the change and who made it for the history trigger, for this transaction only."""
        session.execute(self.statements["set_change_context"], {"change": change or "", "actor": actor or ""})

    def store(self, session: Session, params: Mapping[str, Any], *, by_key: bool) -> dict[str, Any]:
        """Insert a row (``insert_event``), or rewrite and reset the row of its external key
        (``upsert_event_by_key``, REQ-0064); the row as stored."""
        name = "upsert_event_by_key" if by_key else "insert_event"
        return dict(session.execute(self.statements[name], dict(params)).mappings().one())

    def store_held(self, session: Session, params: Mapping[str, Any]) -> dict[str, Any]:
        """Store a live event its participant's quiet hours held, as a scheduled row due at
        ``not_before`` (``insert_held_event``, QUIET-7); the row as stored."""
        return dict(session.execute(self.statements["insert_held_event"], params).mappings().one())

    def store_many(self, session: Session, *, items: str, now: datetime,
                   traceparent: str | None) -> list[dict[str, Any]]:
        """Store the JSON array ``items`` in one statement (``store_events_batch``); the rows,
        each with ``inserted``."""
        rows = session.execute(self.statements["store_events_batch"],
                               {"items": items, "now": now, "traceparent": traceparent}).mappings().all()
        return [dict(r) for r in rows]

    def get(self, session: Session, event_id: str) -> dict[str, Any] | None:
        row = session.execute(self.statements["get_event"], {"id": event_id}).mappings().first()
        return None if row is None else dict(row)

    def page(self, session: Session, statement: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One page of a list (``statement``: one of ``PAGES``)."""
        if statement not in PAGES:
            raise ValueError(f"{statement!r} is not a page of scheduled events ({', '.join(sorted(PAGES))})")
        return [dict(r) for r in session.execute(self.statements[statement], dict(params)).mappings()]

    def history(self, session: Session, event_id: str) -> list[dict[str, Any]]:
        """Every change of a row, oldest first."""
        return [dict(r) for r in session.execute(self.statements["event_history"], {"id": event_id}).mappings()]

    def lock(self, session: Session, *, event_id: str | None = None,
             external_key: str | None = None) -> dict[str, Any] | None:
        """Lock the row of ``event_id`` (or of ``external_key``) to the transaction's end; the row."""
        if event_id is not None:
            row = session.execute(self.statements["lock_event_by_id"], {"id": event_id}).mappings().first()
        else:
            row = session.execute(self.statements["lock_event_by_key"],
                                  {"external_key": external_key}).mappings().first()
        return None if row is None else dict(row)

    def change(self, session: Session, statement: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Reset or cancel one locked row (``statement``: one of ``CHANGES``); the row as changed."""
        if statement not in CHANGES:
            raise ValueError(f"{statement!r} is not a change of one row ({', '.join(sorted(CHANGES))})")
        return dict(session.execute(self.statements[statement], dict(params)).mappings().one())

    def count_filtered(self, session: Session, params: Mapping[str, Any]) -> int:
        """How many rows a bulk command's filter matches (at most ``cap + 1``)."""
        return int(session.execute(self.statements["count_filtered_events"], dict(params)).scalar_one())

    def change_filtered_chunk(self, session: Session, params: Mapping[str, Any]) -> list[str]:
        """Change the next chunk of rows a bulk command's filter matches; their ids."""
        return [str(i) for i in session.execute(self.statements["change_filtered_chunk"], dict(params)).scalars()]

    def count_indexed(self, session: Session, statement: str, cap: int) -> int:
        """A status's count from its partial index (``count_pending``, ``count_failed``), at most ``cap + 1``."""
        if statement not in INDEXED_COUNTS:
            raise ValueError(f"{statement!r} is not an indexed count ({', '.join(sorted(INDEXED_COUNTS))})")
        return int(session.execute(self.statements[statement], {"cap": cap}).scalar_one())

    def estimate_by_status(self, session: Session) -> dict[str, Any]:
        """The planner's statistics of ``status`` (for the estimates past the exact counts)."""
        return dict(session.execute(self.statements["estimate_events_by_status"]).mappings().one())

    def estimate_size(self, session: Session) -> int | None:
        """The planner's estimate of the table's rows (``None`` before any ANALYZE)."""
        value = session.execute(self.statements["estimate_events"]).scalar_one()
        return None if value is None else int(value)

    def count_by_status(self, session: Session, statuses: list[str]) -> dict[str, int]:
        """The exact count of every status in ``statuses`` (a status with no row is absent)."""
        rows = session.execute(self.statements["count_events_by_status"], {"statuses": statuses})
        return {str(status): int(count) for status, count in rows}


# The named statements the repository's generic methods take, by concern.
PAGES = frozenset({"filter_events_page", "filter_pending_page", "list_events"})
CHANGES = frozenset({"reset_event", "cancel_event"})
INDEXED_COUNTS = frozenset({"count_pending", "count_failed"})
