"""The participants' inbox: the stream's numbers and its NOTIFY, the stream's rows, a
participant's delivered notifications (``web.inbox``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database.repository import Repository


class InboxRepository(Repository):
    """Reads and numbering of ``notifications`` for the inbox."""

    def number_for_stream(self, session: Session, notification_ids: list[str], *, lock_key: int,
                          channel: str) -> list[int]:
        """Give each notification its stream number (once), under the stream's order lock
        (held to the commit: numbers commit in the order they are given), and NOTIFY
        ``channel`` with the newest (delivered with the commit); the numbers, in order."""
        session.execute(self.statements["lock_stream_order"], {"key": lock_key})
        numbers = sorted(int(n) for n in session.execute(
            self.statements["number_for_stream"], {"ids": notification_ids}).scalars())
        if numbers:
            session.execute(self.statements["notify_inbox"], {"channel": channel, "payload": str(numbers[-1])})
        return numbers

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
