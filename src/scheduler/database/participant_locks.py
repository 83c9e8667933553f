"""Participant locks: transaction-level advisory locks, one per participant.

Every decision about one participant (deduplication, preferences, the daily cap) happens
under that participant's lock, so the cap is exact across replicas. A claim only *tries*
the locks of the participants it claims, in its own statement, and leaves a busy
participant's rows alone (DEC-2); the one decision (``nudging.decision``) takes, waiting,
those its transaction does not hold yet (a live event's), so an event of a claimed batch
asks for none. Both use the keys defined here (the claim's SQL computes the same key), which
live beside the statements rather than in either of the two peers that share them (ARCH-5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from sqlalchemy.orm import Session


def participant_lock_key(user_id: str) -> int:
    """A stable signed 64-bit advisory-lock key for one participant: the first 8 bytes of
    ``sha256("nudging-participant:" + user_id)``, which the claim computes in SQL
    (``{{participant_lock_key}}`` in ``queries.sql``), so it try-locks in its own statement."""
    digest = hashlib.sha256(f"nudging-participant:{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Where a session remembers the participant locks its current transaction holds at its
# top level (outside any savepoint), so that an event does not ask for them again.
_HELD_LOCKS = "scheduler.database.participant_locks"


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
