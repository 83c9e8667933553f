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

    def write_heartbeat(self, session: Session, row: Mapping[str, Any], *, gone_before: datetime) -> None:
        """Upsert a replica's row and delete the rows of replicas silent since ``gone_before``."""
        session.execute(self.statements["upsert_heartbeat"], dict(row))
        session.execute(self.statements["delete_gone_replicas"], {"cutoff": gone_before})

    def delete_replica(self, session: Session, replica_id: str) -> None:
        session.execute(self.statements["delete_replica"], {"replica_id": replica_id})

    def list_replicas(self, session: Session, now: datetime) -> list[dict[str, Any]]:
        """Every replica's heartbeat, with ``stale`` judged at ``now``."""
        return [dict(r) for r in session.execute(self.statements["list_replicas"], {"now": now}).mappings()]

    def replicas_by_state(self, session: Session, now: datetime) -> dict[str, int]:
        rows = session.execute(self.statements["count_replicas_by_state"], {"now": now}).mappings()
        return {str(r["state"]): int(r["count"]) for r in rows}

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
