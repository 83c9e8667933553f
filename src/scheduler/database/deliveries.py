"""The outbox's statements (DEC-OUTBOX): the delivery worker's claim and record, the operator's
list and the metrics' gauges of ``deliveries`` (``scheduler.operations.delivery_worker``)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database import pipeline
from scheduler.database.repository import Repository


class DeliveryRepository(Repository):
    """``deliveries`` as the outbox: due rows leased and recorded, listed, counted."""

    def claim_due(self, session: Session, *, now: datetime, lease_until: datetime, worker: str,
                  limit: int, commit: bool = False) -> list[dict[str, Any]]:
        """Lease up to ``limit`` due rows to ``worker`` until ``lease_until``, counting the attempt;
        with ``commit``, the claim is its own transaction, BEGIN to COMMIT in one round trip, and
        walks the due index in order whatever the statistics say (``claim_by_due_order``)."""
        step = self.statements.step("claim_due_deliveries", {
            "now": now, "lease_until": lease_until, "worker": worker, "limit": limit})
        if not commit:
            return pipeline.send(session, [step])[0] or []
        plan = self.statements.step("claim_by_due_order", {}, fetch=False)
        return pipeline.send(session, [plan, step], commit=True)[1] or []

    def queue(self, session: Session, messages: Sequence[dict[str, Any]], *, now: datetime) -> list[int]:
        """Queue outbox rows in ``session``'s transaction (a host dispatcher's, OUTBOX-7): the ids
        written (a message whose idempotency key is queued already is not written again)."""
        found = session.execute(self.statements["queue_deliveries"], {"messages": json.dumps(list(messages)),
                                                                      "now": now})
        return [int(row[0]) for row in found]

    def record_attempts(self, session: Session, records: Sequence[dict[str, Any]], *, worker: str,
                        commit: bool = False) -> set[str]:
        """Write each attempt's record while ``worker`` still holds its lease; the ids written.
        With ``commit``, the record is its own transaction, BEGIN to COMMIT in one round trip."""
        step = self.statements.step("record_delivery_attempts", {"records": json.dumps(list(records)),
                                                                 "worker": worker})
        return {str(row["id"]) for row in pipeline.send(session, [step], commit=commit)[0] or []}

    def release(self, session: Session, rows: Sequence[dict[str, Any]], *, worker: str) -> set[str]:
        """Give back rows ``worker`` claimed and never sent (``{"id", "attempts"}`` each): the
        lease ends, the attempt is taken back; the ids released."""
        if not rows:
            return set()
        found = session.execute(self.statements["release_delivery_leases"],
                                {"rows": json.dumps(list(rows)), "worker": worker})
        return {str(row[0]) for row in found}

    def list(self, session: Session, *, status: str | None, channel: str | None, user_id: str | None,
             notification_id: str | None, limit: int) -> list[dict[str, Any]]:
        """The delivery log and the outbox, newest first, each filter optional."""
        rows = session.execute(self.statements["list_deliveries"], {
            "status": status, "channel": channel, "user_id": user_id, "notification_id": notification_id,
            "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def retry(self, session: Session, delivery_id: int, *, now: datetime) -> dict[str, Any] | None:
        """Queue one retrying or undeliverable row again (not while a worker holds it); the row."""
        row = session.execute(self.statements["retry_delivery"], {"id": delivery_id, "now": now}).mappings().first()
        return dict(row) if row is not None else None

    def get(self, session: Session, delivery_id: int) -> dict[str, Any] | None:
        row = session.execute(self.statements["get_delivery"], {"id": delivery_id}).mappings().first()
        return dict(row) if row is not None else None

    def list_retryable(self, session: Session, filters: dict[str, Any], *, before_id: int | None,
                       limit: int) -> builtins.list[dict[str, Any]]:
        """Retrying and undeliverable rows matching ``filters`` (statuses, channel, user_id), newest first."""
        rows = session.execute(self.statements["list_retryable_deliveries"],
                               {**filters, "before_id": before_id, "limit": limit}).mappings()
        return [dict(r) for r in rows]

    def count_retryable(self, session: Session, filters: dict[str, Any], *, now: datetime, cap: int) -> int:
        return int(session.execute(self.statements["count_retryable_deliveries"],
                                   {**filters, "now": now, "cap": cap}).scalar_one())

    def retry_chunk(self, session: Session, filters: dict[str, Any], *, now: datetime, as_of: datetime,
                    after_id: int, chunk: int) -> builtins.list[int]:
        """Queue again one chunk of the matching rows unchanged since ``as_of``, after ``after_id``."""
        found = session.execute(self.statements["retry_deliveries_chunk"], {
            **filters, "now": now, "as_of": as_of, "after_id": after_id, "chunk": chunk})
        return [int(row[0]) for row in found]

    def oldest_due_seconds(self, session: Session, now: datetime) -> float | None:
        """How long the outbox row due the longest has waited at ``now`` (None: none is due)."""
        seconds = session.execute(self.statements["oldest_due_delivery"], {"now": now}).scalar_one()
        return None if seconds is None else max(float(seconds), 0.0)

    def gauges(self, session: Session, now: datetime) -> dict[str, Any]:
        """Queued and retrying rows, and the oldest one's age in seconds at ``now``."""
        return dict(session.execute(self.statements["outbox_gauges"], {"now": now}).mappings().one())
