"""Participant locks: transaction-level advisory locks, one per participant.

Every decision about one participant (deduplication, preferences, the daily cap) happens
under that participant's lock, so the cap is exact across replicas. A claim only *tries*
the locks of the participants it claims and leaves a busy participant's rows alone (DEC-2);
the orchestrator takes one at a time, waiting (live ingest), which is re-entrant when the
batch already holds it. Both use the keys defined here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from sqlalchemy.orm import Session

from scheduler.queries import statement


def participant_lock_key(user_id: str) -> int:
    """A stable signed 64-bit advisory-lock key for one participant."""
    digest = hashlib.blake2b(f"nudging-participant:{user_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def try_lock_participants(session: Session, keys: Iterable[int]) -> set[int]:
    """Take whichever of these participant locks are free, without waiting; return those.

    A claim uses this: it never waits on a participant another transaction holds, so it
    can neither stall behind a held lock nor take part in a deadlock (DEC-2).
    """
    wanted = sorted(set(keys))
    if not wanted:
        return set()
    return {int(k) for k in session.execute(statement("try_lock_participants"), {"keys": wanted}).scalars()}


def lock_participant(session: Session, user_id: str) -> None:
    """Lock one participant until the transaction ends (waits while another holds it)."""
    session.execute(statement("lock_participant"), {"key": participant_lock_key(user_id)})
