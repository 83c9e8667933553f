"""The outbox's statements (DEC-OUTBOX): the delivery worker's claim and record, the operator's
list and the metrics' gauges of ``deliveries`` (``scheduler.operations.delivery_worker``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database.repository import Repository


class DeliveryRepository(Repository):
    """``deliveries`` as the outbox: due rows leased and recorded, listed, counted."""

    def claim_due(self, session: Session, *, now: datetime, lease_until: datetime, worker: str,
                  limit: int) -> list[dict[str, Any]]:
        """Lease up to ``limit`` due rows to ``worker`` until ``lease_until``, counting the attempt."""
        rows = session.execute(self.statements["claim_due_deliveries"], {
            "now": now, "lease_until": lease_until, "worker": worker, "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def queue(self, session: Session, messages: Sequence[dict[str, Any]], *, now: datetime) -> list[int]:
        """Queue outbox rows in ``session``'s transaction (a host dispatcher's, OUTBOX-7): the ids
        written (a message whose idempotency key is queued already is not written again)."""
        found = session.execute(self.statements["queue_deliveries"], {"messages": json.dumps(list(messages)),
                                                                      "now": now})
        return [int(row[0]) for row in found]

    def record_attempts(self, session: Session, records: Sequence[dict[str, Any]], *, worker: str) -> set[str]:
        """Write each attempt's record while ``worker`` still holds its lease; the ids written."""
        found = session.execute(self.statements["record_delivery_attempts"],
                                {"records": json.dumps(list(records)), "worker": worker})
        return {str(row[0]) for row in found}

    def list(self, session: Session, *, status: str | None, channel: str | None, user_id: str | None,
             notification_id: str | None, limit: int) -> list[dict[str, Any]]:
        """The delivery log and the outbox, newest first, each filter optional."""
        rows = session.execute(self.statements["list_deliveries"], {
            "status": status, "channel": channel, "user_id": user_id, "notification_id": notification_id,
            "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def gauges(self, session: Session, now: datetime) -> dict[str, Any]:
        """Queued and retrying rows, and the oldest one's age in seconds at ``now``."""
        return dict(session.execute(self.statements["outbox_gauges"], {"now": now}).mappings().one())
