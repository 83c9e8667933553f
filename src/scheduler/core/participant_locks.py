"""Participant locks: transaction-level advisory locks, one per participant.

Every decision about one participant (deduplication, preferences, the daily cap) happens
under that participant's lock, so the cap is exact across replicas. A claim only *tries*
the locks of the participants it claims, in its own statement, and leaves a busy
participant's rows alone (DEC-2); the orchestrator takes one at a time, waiting (live
ingest), which is re-entrant when the batch already holds it. Both use the keys defined
here (the claim's SQL computes the same key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from sqlalchemy.orm import Session

from scheduler.database.queries import statement


def participant_lock_key(user_id: str) -> int:
    """A stable signed 64-bit advisory-lock key for one participant: the first 8 bytes of
    ``sha256("nudging-participant:" + user_id)``, which the claim computes in SQL
    (``{{participant_lock_key}}`` in ``queries.sql``), so it try-locks in its own statement."""
    digest = hashlib.sha256(f"nudging-participant:{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Where a session remembers the participant locks its current transaction holds at its
# top level (outside any savepoint), so that an event does not ask for them again.
_HELD_LOCKS = "scheduler.core.participant_locks"


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


def lock_participant(session: Session, user_id: str) -> None:
    """Lock one participant until the transaction ends (waits while another holds it),
    unless this transaction already holds that lock (a batch's claim took it): a second,
    re-entrant request would be a round trip per event for nothing."""
    key = participant_lock_key(user_id)
    if not holds_participant_lock(session, key):
        session.execute(statement("lock_participant"), {"key": key})
