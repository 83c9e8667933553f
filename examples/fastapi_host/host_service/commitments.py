"""The host's own code: a commitment and its reminder, saved in one transaction.

``save_commitment`` writes the host's ``commitments`` row and schedules its reminder with
``scheduler.schedule_async`` on the same ``AsyncSession``: both are committed by the host's
commit, and a rollback (the host's own failure after it, or a reminder the facts contract
refuses, ``scheduler.InvalidEvent``) takes both. The reminder's key is the commitment's, so
saving it again rewrites the one reminder (the POST's upsert by key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import scheduler
from scheduler import SchedulerService

INSERT = text("INSERT INTO commitments (user_id, commitment, minutes, remind_at)"
              " VALUES (:user_id, :commitment, :minutes, :remind_at) RETURNING id")
LINK = text("UPDATE commitments SET reminder_id = :reminder_id WHERE id = :id")


@dataclass(frozen=True)
class Saved:
    commitment_id: int
    reminder_id: str


async def save_commitment(session: AsyncSession, service: SchedulerService, *, user_id: str, commitment: str,
                          minutes: int | None, remind_at: datetime) -> Saved:
    """The commitment and its reminder in ``session``'s transaction; nothing is committed here."""
    commitment_id = int((await session.execute(INSERT, {"user_id": user_id, "commitment": commitment,
                                                        "minutes": minutes, "remind_at": remind_at})).scalar_one())
    facts = {"commitment": commitment, **({"minutes": minutes} if minutes is not None else {})}
    reminder = await scheduler.schedule_async(
        session, service=service, event_type="commitment_reminder", user_id=user_id, trigger_at=remind_at,
        facts=facts, external_key=f"commitment-{commitment_id}", actor="host-commitments")
    await session.execute(LINK, {"reminder_id": reminder.id, "id": commitment_id})
    return Saved(commitment_id, reminder.id)
