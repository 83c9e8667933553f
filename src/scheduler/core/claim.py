"""The claim: lock up to a batch of due pending rows whose participants are free (DEC-2).

A row whose participant's advisory lock is held elsewhere (another batch, a live event, an
operator) is left exactly as it is: still pending, no error, no effect. The claim then
takes a further round past such rows, so a busy participant at the head of the queue does
not empty the batch.

One round is one statement: the row locks and the participants' try-locks together
(``claim_due_events``), sent with the transaction's BEGIN in one round trip (DEC-1,
``database.pipeline``). The same statement ends rows claimed after their ``expires_at``
``expired`` (EXP-2): they come back marked, take no batch slot, and are never dispatched.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.core.trigger_range import BEFORE_EVERY_TRIGGER
from scheduler.database.events import EventRepository
from scheduler.database.participant_locks import participant_lock_key, remember_participant_locks
from scheduler.types import ClaimedEvent, EventOutcome

# The start of the claim's keyset: before every row, whatever its trigger_at (the storable
# range starts long after it, and no row Python can read sorts before it), so every due row
# is claimable (DEC-TRIGGER).
_BEFORE_ALL = (BEFORE_EVERY_TRIGGER, "")


def claim_params(now: datetime, batch_size: int) -> dict[str, Any]:
    """The bind parameters of a claim's first round (benchmarks and plan tests use them too)."""
    return {"now": now, "batch_size": batch_size, "after_due": _BEFORE_ALL[0],
            "after_id": _BEFORE_ALL[1], "busy": []}


def claim_rounds(session: Session, now: datetime, batch_size: int,
                 events_repository: EventRepository) -> tuple[list[ClaimedEvent], list[str], list[EventOutcome]]:
    """Lock up to ``batch_size`` rows due at ``now``, oldest first, in ``session``'s
    transaction, never waiting for a lock; return them, the ids of the rows skipped
    because their participant was busy, and the rows the claim ended expired."""
    busy: set[str] = set()
    events: list[ClaimedEvent] = []
    skipped: list[str] = []
    ended: list[EventOutcome] = []
    after = _BEFORE_ALL
    # Rounds go on until the batch is full or nothing more is due: however many participants
    # are busy at the head of the queue, the rest of the batch goes ahead (BUSY-1, DEC-2).
    # This ends: each further round starts after the last row seen (no row is read twice) and
    # follows a round that skipped rows, i.e. found at least one participant busy for the first
    # time (rows of known busy participants are excluded), so a poll takes at most one round
    # per busy participant, plus one.
    while True:
        wanted = batch_size - len(events)
        params = {**claim_params(now, wanted), "after_due": after[0], "after_id": after[1],
                  "busy": sorted(busy)}
        returned = events_repository.claim(session, params)
        ended.extend(EventOutcome.expired(r["id"], r["event_type"], r["trigger_at"], r["last_error"], now)
                     for r in returned if r["expired"])
        rows = [r for r in returned if not r["expired"]]
        if not rows:
            break
        # the keyset is the claim's order: due_at (trigger_at, or a held row's not_before)
        after = (rows[-1]["due_at"], rows[-1]["id"])
        # the statement try-locked each participant once: remember those it got, so that
        # the events' decisions ask for none of them (participant_locks.locks_to_take)
        remember_participant_locks(session, {participant_lock_key(r["user_id"]) for r in rows if r["held"]})
        round_skipped = 0
        for r in rows:
            if not r["held"]:
                busy.add(r["user_id"])
                skipped.append(r["id"])
                round_skipped += 1
                continue
            events.append(
                ClaimedEvent(
                    id=r["id"],
                    event_type=r["event_type"],
                    user_id=r["user_id"],
                    community_id=r["community_id"],
                    trigger_at=r["trigger_at"],
                    facts=dict(r["facts"]),
                    traceparent=r["traceparent"],
                    not_before=r["not_before"],
                )
            )
        # Fewer rows than asked: nothing more is due. None skipped: the batch is full.
        if len(rows) < wanted or round_skipped == 0:
            break
    return events, skipped, ended
