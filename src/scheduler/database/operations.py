"""The operations' statements: the replicas' heartbeats, the metrics' and the overview's
figures, retention's election and deletes (``scheduler.operations``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from scheduler.database.repository import Repository


class OperationsRepository(Repository):
    """``scheduler_replicas``, ``scheduler_maintenance`` and the figures read from the events."""

    def write_heartbeat(self, session: Session, row: Mapping[str, Any]) -> None:
        """Upsert a replica's row."""
        session.execute(self.statements["upsert_heartbeat"], dict(row))

    def delete_gone_replicas(self, conn: Connection | Session, cutoff: datetime) -> int:
        """Forget the replicas silent since ``cutoff`` (retention's run); how many."""
        return int(conn.execute(self.statements["delete_gone_replicas"], {"cutoff": cutoff}).rowcount)  # type: ignore[attr-defined]

    def delete_replica(self, session: Session, replica_id: str) -> None:
        session.execute(self.statements["delete_replica"], {"replica_id": replica_id})

    def list_replicas(self, session: Session, now: datetime) -> list[dict[str, Any]]:
        """Every replica's heartbeat, with ``stale`` judged at ``now``."""
        return [dict(r) for r in session.execute(self.statements["list_replicas"], {"now": now}).mappings()]

    def backlog(self, session: Session, now: datetime) -> dict[str, Any]:
        """Due pending rows (``backlog``) and the oldest one's ``oldest_trigger_at``."""
        return dict(session.execute(self.statements["backlog_gauges"], {"now": now}).mappings().one())

    def lateness(self, session: Session, *, since: datetime, now: datetime) -> dict[str, Any]:
        """The dispatches' lateness percentiles since ``since``."""
        return dict(session.execute(self.statements["lateness_percentiles"],
                                    {"since": since, "now": now}).mappings().one())

    def failures_by_kind(self, session: Session, *, since: datetime, sample: int) -> list[dict[str, Any]]:
        rows = session.execute(self.statements["failures_by_kind"], {"since": since, "sample": sample}).mappings()
        return [dict(r) for r in rows]

    def count_failed_since(self, session: Session, since: datetime) -> int:
        return int(session.execute(self.statements["count_failed_since"], {"since": since}).scalar_one())

    def try_retention_lock(self, conn: Connection, key: int) -> bool:
        """Retention's election, for the current transaction only."""
        return bool(conn.execute(self.statements["try_retention_lock"], {"key": key}).scalar())

    def claim_maintenance_run(self, conn: Connection, *, task: str, now: datetime, interval_seconds: float) -> bool:
        """Start a run of ``task`` unless one started within the interval; whether it started."""
        return conn.execute(self.statements["claim_maintenance_run"],
                            {"task": task, "now": now, "interval_seconds": interval_seconds}).first() is not None

    def delete_finished(self, conn: Connection, *, cutoff: datetime, batch_size: int) -> list[str]:
        """Delete up to ``batch_size`` rows finished before ``cutoff``; their ids."""
        return [str(i) for i in conn.execute(self.statements["delete_expired_events"],
                                             {"cutoff": cutoff, "batch_size": batch_size}).scalars().all()]

    def delete_old_notifications(self, conn: Connection, *, cutoff: datetime, batch_size: int) -> dict[str, int]:
        """Delete up to ``batch_size`` notifications created before ``cutoff`` with their
        deliveries (none of them outstanding or undeliverable), and up to ``batch_size`` of a host's
        delivered outbox rows: how many notifications, deliveries and host rows went."""
        found = conn.execute(self.statements["delete_old_notifications"],
                             {"cutoff": cutoff, "batch_size": batch_size}).mappings().one()
        return {k: int(v) for k, v in found.items()}

    # -- the audit trail (``scheduler.application.commands``, ``.audit``) -----------------------

    def record_action(self, session: Session, *, now: datetime, actor: str, source: str, action: str,
                      event_id: str | None, filter_json: str | None, count: int, reason: str | None) -> int:
        """An operator's action in the audit trail; its id."""
        return int(session.execute(self.statements["insert_operator_action"], {
            "now": now, "actor": actor, "source": source, "action": action, "event_id": event_id,
            "filter": filter_json, "count": count, "reason": reason}).scalar_one())

    def link_action_events(self, session: Session, action_id: int, event_ids: list[str]) -> None:
        session.execute(self.statements["link_action_events"], {"action_id": action_id, "event_ids": event_ids})

    def set_action_count(self, session: Session, action_id: int, count: int) -> None:
        session.execute(self.statements["set_operator_action_count"], {"id": action_id, "count": count})

    def list_actions(self, session: Session, *, limit: int, before_id: int | None) -> list[dict[str, Any]]:
        """The audit trail, newest first, before ``before_id``."""
        rows = session.execute(self.statements["list_operator_actions"], {"limit": limit, "before_id": before_id})
        return [dict(r) for r in rows.mappings()]

    def event_actions(self, session: Session, event_id: str) -> list[dict[str, Any]]:
        """The operator actions that changed one row, newest first."""
        rows = session.execute(self.statements["event_actions"], {"event_id": event_id}).mappings()
        return [dict(r) for r in rows]

    def event_notifications(self, session: Session, event_id: str) -> list[dict[str, Any]]:
        """The notifications one row produced, oldest first."""
        rows = session.execute(self.statements["event_notifications"], {"event_id": event_id}).mappings()
        return [dict(r) for r in rows]
