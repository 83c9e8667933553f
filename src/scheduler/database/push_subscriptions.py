"""The participants' web-push subscriptions (``push_subscriptions``, migration 0002): stored and
removed by ``PUT``/``DELETE /me/push-subscriptions`` (``web.inbox.push``), removed by the
delivery worker when a push service answers 404 or 410 (PUSH-*)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database.repository import Repository


class PushSubscriptionRepository(Repository):
    """The rows of ``push_subscriptions``, by participant and endpoint."""

    def upsert(self, session: Session, *, user_id: str, endpoint: str, p256dh: bytes, auth: bytes,
               expiration_time: datetime | None, now: datetime, keep: int) -> dict[str, Any]:
        """Store the subscription by its endpoint (new, or replacing the same endpoint's keys,
        expiry and owner) and keep the participant's ``keep`` most recently updated; the row
        with ``created`` (new) and ``evicted`` (how many older ones went)."""
        return dict(session.execute(self.statements["upsert_push_subscription"], {
            "user_id": user_id, "endpoint": endpoint, "p256dh": p256dh, "auth": auth,
            "expiration_time": expiration_time, "now": now, "keep": keep}).mappings().one())

    def delete(self, session: Session, *, user_id: str, endpoint: str | None) -> int:
        """Remove the participant's subscription of ``endpoint`` (every one when None); how many."""
        return len(session.execute(self.statements["delete_push_subscriptions"],
                                   {"user_id": user_id, "endpoint": endpoint}).all())

    def of_participant(self, session: Session, user_id: str) -> list[dict[str, Any]]:
        """The participant's subscriptions, oldest first (their keys are not read)."""
        rows = session.execute(self.statements["participant_push_subscriptions"], {"user_id": user_id}).mappings()
        return [dict(r) for r in rows]

    def remove_gone(self, session: Session, gone: Sequence[tuple[int, datetime]]) -> set[int]:
        """Remove each ``(id, subscribed_at)`` subscription a push service said is gone, only as
        it was when its push was sent; the ids removed."""
        if not gone:
            return set()
        document = json.dumps([{"id": i, "subscribed_at": at.isoformat()} for i, at in gone])
        return {int(r[0]) for r in session.execute(self.statements["remove_gone_push_subscriptions"],
                                                   {"gone": document})}
