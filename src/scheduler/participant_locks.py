"""Participant locks: transaction-level advisory locks, one per participant.

Every decision about one participant (deduplication, preferences, the daily cap) happens
under that participant's lock, so the cap is exact across replicas. The loop takes every
lock a batch needs up front, in one global order; the orchestrator takes one at a time
(a no-op when the batch already holds it). Both use the keys defined here.
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


def lock_participants(session: Session, user_ids: Iterable[str]) -> None:
    """Lock several participants in one global order (sorted keys), so that two batches
    that share participants can never wait on each other in a cycle."""
    keys = sorted({participant_lock_key(u) for u in user_ids})
    if keys:
        session.execute(statement("lock_participants"), {"keys": keys}).all()


def lock_participant(session: Session, user_id: str) -> None:
    """Lock one participant until the transaction ends."""
    session.execute(statement("lock_participant"), {"key": participant_lock_key(user_id)})
