"""The browsers' sessions (``web_sessions``): the console's and the inbox page's, in the
database so that any replica serves them (``web.http.sessions`` keeps the rules)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database.repository import Repository


class WebSessionRepository(Repository):
    """The rows of ``web_sessions``, by the hash of their secret or their public id."""

    def create(self, session: Session, *, public_id: str, secret_hash: str, subject: str, kind: str,
               now: datetime, expires_at: datetime, idle_seconds: int, user_agent: str | None) -> None:
        """Purge the sessions that have ended, then insert a new one."""
        session.execute(self.statements["purge_web_sessions"], {"now": now})
        session.execute(self.statements["insert_web_session"], {
            "id": public_id, "secret_hash": secret_hash, "subject": subject, "kind": kind, "now": now,
            "expires_at": expires_at, "idle_seconds": idle_seconds, "user_agent": user_agent,
        })

    def touch(self, session: Session, *, secret_hash: str, kind: str, now: datetime) -> dict[str, Any] | None:
        """The open session of this hash and kind, marked seen at ``now``; ``None`` if none."""
        row = session.execute(self.statements["touch_web_session"],
                              {"secret_hash": secret_hash, "kind": kind, "now": now}).mappings().first()
        return None if row is None else dict(row)

    def is_open(self, session: Session, *, secret_hash: str, kind: str, now: datetime) -> bool:
        """Whether the session of this hash and kind is open at ``now`` (not marked seen)."""
        return session.execute(self.statements["web_session_open"],
                               {"secret_hash": secret_hash, "kind": kind, "now": now}).first() is not None

    def delete_by_hash(self, session: Session, secret_hash: str) -> bool:
        """Delete the session of this hash; whether there was one."""
        return session.execute(self.statements["delete_web_session_by_hash"],
                               {"secret_hash": secret_hash}).first() is not None

    def end(self, session: Session, session_id: str, *, now: datetime, actor: str,
            source: str) -> dict[str, Any] | None:
        """Delete the session of a public id and record it in the audit trail (no scheduled
        event: the filter names the session); its row as it was, or ``None`` if unknown."""
        row = session.execute(self.statements["delete_web_session"], {"id": session_id}).mappings().first()
        if row is None:
            return None
        session.execute(self.statements["insert_operator_action"], {
            "now": now, "actor": actor, "source": source, "action": "end_session", "event_id": None,
            "filter": json.dumps({"session_id": row["id"], "subject": row["subject"], "kind": row["kind"]}),
            "count": 1, "reason": None})
        return dict(row)

    def list_open(self, session: Session, *, now: datetime, kind: str | None, limit: int) -> list[dict[str, Any]]:
        """The sessions that have not ended at ``now``, most recently seen first."""
        rows = session.execute(self.statements["list_web_sessions"], {"now": now, "kind": kind, "limit": limit})
        return [dict(r) for r in rows.mappings()]
