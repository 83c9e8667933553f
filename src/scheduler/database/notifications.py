"""The notifications' repositories: how they are decided and how the inbox reads them.

``DecisionRepository`` holds the one decision's statements (``nudging.decision``): the read of
what a batch's decisions need, after the participants' locks, and the one write of everything
decided (DEC-1.5). ``InboxRepository`` holds the participants' inbox's: the stream's numbers and
its NOTIFY, the stream's rows, a participant's delivered notifications (``web.inbox``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, time
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database import pipeline
from scheduler.database.events import locks_to_take
from scheduler.database.repository import Repository

# The statements a decision's write may name (``BatchDecisions.write_statement``).
WRITES = frozenset({"write_batch_decisions"})


class DecisionRepository(Repository):
    """Reads and writes of deduplication keys, preferences, notifications and deliveries."""

    def read_limits(self, session: Session, users: Sequence[str], keys: Sequence[str],
                    window_start: datetime, window_end: datetime) -> dict[str, Any]:
        """Take the lock of every participant of ``users`` this transaction does not hold yet
        (a live event's; the claim holds a batch's, DEC-2), then read the keys already taken,
        the participants' preferences (zone and quiet hours too) and the times of their sent
        notifications in ``[window_start, window_end)`` (the decision counts those of each
        participant's own day, QUIET-4): one round trip."""
        locks = [self.statements.step("lock_participant", {"key": key}, fetch=False)
                 for key in locks_to_take(session, users)]
        answers = pipeline.send(session, [*locks, self.statements.step("read_batch_limits", {
            "user_ids": list(users), "window_start": window_start, "window_end": window_end, "keys": list(keys),
        })])
        return (answers[-1] or [{}])[0]

    def write(self, session: Session, statement: str, params: Mapping[str, Any]) -> None:
        """Run a decision's one write (``statement``, one of ``WRITES``) in its own round trip."""
        if statement not in WRITES:
            raise ValueError(f"{statement!r} is not a decision's write ({', '.join(sorted(WRITES))})")
        pipeline.send(session, [self.statements.step(statement, params, fetch=False)])

    def set_preferences(self, session: Session, user_id: str, *, enabled_kinds: Sequence[str] | None,
                        max_per_day: int, now: datetime, time_zone: str | None = None,
                        quiet_start: time | None = None, quiet_end: time | None = None) -> dict[str, Any]:
        """Insert or replace a participant's preferences; the row as stored. A change of their
        zone or quiet hours releases their held rows in the same statement (``not_before``
        cleared: each is decided again at the next claim, QUIET-5)."""
        row = session.execute(self.statements["upsert_preferences"], {
            "user_id": user_id, "enabled_kinds": None if enabled_kinds is None else list(enabled_kinds),
            "max_per_day": max_per_day, "time_zone": time_zone, "quiet_start": quiet_start,
            "quiet_end": quiet_end, "now": now,
        }).mappings().one()
        return dict(row)

    def get_preferences(self, session: Session, user_id: str) -> dict[str, Any] | None:
        """A participant's stored preferences row, ``None`` when none was set."""
        row = session.execute(self.statements["get_preferences"], {"user_id": user_id}).mappings().one_or_none()
        return None if row is None else dict(row)


class InboxRepository(Repository):
    """Reads and numbering of ``notifications`` for the inbox."""

    def number_for_stream(self, session: Session, notification_ids: list[str], *, lock_key: int,
                          channel: str, commit: bool = False) -> list[int]:
        """Give each notification its stream number (once), under the stream's order lock
        (held to the commit: numbers commit in the order they are given), and NOTIFY
        ``channel`` with the newest (delivered with the commit); the numbers, in order.

        The lock and the numbering go in one round trip (``database.pipeline``), with the
        transaction's BEGIN when it opens here and, with ``commit``, its COMMIT: the session's
        transaction has then ended (a publisher's own, after a batch committed)."""
        steps = [self.statements.step("lock_stream_order", {"key": lock_key}, fetch=False),
                 self.statements.step("number_for_stream", {"ids": notification_ids, "channel": channel})]
        numbered = pipeline.send(session, steps, commit=commit)[1] or []
        return sorted(int(row["stream_seq"]) for row in numbered)

    def number_unnumbered(self, session: Session, *, lock_key: int, channel: str, limit: int) -> list[int]:
        """Number the sent notifications a failed numbering left without a stream number
        (at most ``limit``, oldest first), as ``number_for_stream`` does: a repair that
        takes the stream's order lock only when there is something to number."""
        ids = [str(i) for i in session.execute(self.statements["unnumbered_for_stream"],
                                                {"limit": limit}).scalars()]
        return self.number_for_stream(session, ids, lock_key=lock_key, channel=channel) if ids else []

    def stream_tail(self, session: Session, *, after: int, limit: int) -> list[dict[str, Any]]:
        """The stream's rows numbered after ``after``, in stream order."""
        rows = session.execute(self.statements["stream_tail"], {"after": after, "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def stream_head(self, session: Session) -> int:
        """The stream's newest number."""
        return int(session.execute(self.statements["stream_head"]).scalar_one())

    def participant_stream_after(self, session: Session, *, user_id: str, after: int,
                                 limit: int) -> list[dict[str, Any]]:
        """One participant's stream rows after ``after`` (a reconnecting stream's replay)."""
        rows = session.execute(self.statements["participant_stream_after"],
                               {"user_id": user_id, "after": after, "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def participant_notifications(self, session: Session, *, user_id: str, before_at: datetime | None,
                                  before_id: str | None, limit: int) -> list[dict[str, Any]]:
        """A participant's delivered notifications, newest first, before a keyset position."""
        rows = session.execute(self.statements["participant_notifications"], {
            "user_id": user_id, "before_at": before_at, "before_id": before_id, "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def list_notifications(self, session: Session, *, user_id: str | None, status: str | None,
                           limit: int) -> list[dict[str, Any]]:
        """Notifications, newest first, of a participant and a status when given."""
        rows = session.execute(self.statements["list_notifications"],
                               {"user_id": user_id, "status": status, "limit": limit}).mappings()
        return [dict(r) for r in rows]
