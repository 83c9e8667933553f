"""Operator actions on rows (reset one, bulk reset by filter) and their audit trail.

Every action is recorded in ``operator_actions`` (who: the token's ``sub`` or the CLI's
user; when: the injected clock; what, the filter, the count, the reason) and the rows it
touched in ``operator_action_events``, in the same transaction as the change itself.

A bulk reset acts on what its dry run counted: the rows that match the filter, are not
pending and have not changed since the dry run (``updated_at <= as_of``), at most ``cap``.
It works in chunks of ``chunk`` rows, each its own short transaction that skips rows a
poll holds (``FOR UPDATE SKIP LOCKED``), so it never holds the loop up; a row that
stopped matching between the count and the action is not touched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.orm import Session, sessionmaker

from scheduler.core.store import event_to_json, set_change_context
from scheduler.database.queries import statement
from scheduler.types import EVENT_STATUSES

BULK_CAP = 10_000
CHUNK = 500
FILTER_STATUSES = tuple(str(s) for s in EVENT_STATUSES)  # every status a row can have, cancelled included


class FilterError(ValueError):
    """A filter field is malformed; the message names it."""


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def parse_time(name: str, raw: str | None) -> datetime | None:
    """An ISO 8601 time with a zone from a form or query field; empty is ``None``."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise FilterError(f"{name}: not an ISO 8601 time: {raw!r}") from None
    if value.tzinfo is None:
        raise FilterError(f"{name}: give a time zone (e.g. 2026-11-30T09:00+00:00)")
    return value


@dataclass(frozen=True)
class EventFilter:
    """What the events page, the bulk reset and ``scheduler events reset`` select by."""

    status: str | None = None
    event_type: str | None = None
    user_id: str | None = None
    external_key: str | None = None
    community_id: str | None = None
    trigger_from: datetime | None = None
    trigger_to: datetime | None = None
    error_contains: str | None = None

    FIELDS = ("status", "event_type", "user_id", "external_key", "community_id",
              "trigger_from", "trigger_to", "error_contains")

    @classmethod
    def from_mapping(cls, values: Mapping[str, str]) -> EventFilter:
        """From query or form fields (empty means unset); a bad value is a ``FilterError``."""
        text = {k: (values.get(k) or "").strip() or None for k in cls.FIELDS}
        status = text["status"]
        if status is not None and status not in FILTER_STATUSES:
            raise FilterError(f"status: unknown status {status!r}; expected one of {', '.join(FILTER_STATUSES)}")
        for key, value in text.items():
            if value is not None and len(value) > 200:
                raise FilterError(f"{key}: at most 200 characters")
            if value is not None and "\x00" in value:
                raise FilterError(f"{key}: must not contain NUL characters")
        return cls(
            status=status, event_type=text["event_type"], user_id=text["user_id"],
            external_key=text["external_key"], community_id=text["community_id"],
            trigger_from=parse_time("trigger_from", text["trigger_from"]),
            trigger_to=parse_time("trigger_to", text["trigger_to"]),
            error_contains=text["error_contains"],
        )

    def params(self) -> dict[str, Any]:
        """The bound parameters of the filter's SQL."""
        values = asdict(self)
        error = values.pop("error_contains")
        values["error_like"] = _like(error) if error else None
        return values

    def as_json(self) -> dict[str, str]:
        """The fields that are set, as text (for the audit row and for links)."""
        return {k: (v.isoformat() if isinstance(v, datetime) else str(v))
                for k, v in asdict(self).items() if v is not None}

    def is_empty(self) -> bool:
        return not self.as_json()


def _record(session: Session, *, now: datetime, actor: str, source: str, action: str,
            event_id: str | None, filter: dict[str, str] | None, count: int, reason: str | None) -> int:
    action_id: int = session.execute(statement("insert_operator_action"), {
        "now": now, "actor": actor, "source": source, "action": action, "event_id": event_id,
        "filter": None if filter is None else json.dumps(filter), "count": count, "reason": reason,
    }).scalar_one()
    return action_id


def reset_one(sessions: sessionmaker[Session], event_id: str, now: datetime, *, actor: str,
              source: str, reason: str | None = None) -> dict[str, Any] | None:
    """The reset by hand of one row, recorded in the audit trail; ``None`` if no such row."""
    with sessions.begin() as session:
        set_change_context(session, "reset", actor)  # the row's history names the change and who
        row = session.execute(statement("reset_event"), {"id": event_id, "now": now}).mappings().first()
        if row is None:
            return None
        action_id = _record(session, now=now, actor=actor, source=source, action="reset",
                            event_id=event_id, filter=None, count=1, reason=reason)
        session.execute(statement("link_action_events"), {"action_id": action_id, "event_ids": [event_id]})
        return event_to_json(row)


def count_matching(sessions: sessionmaker[Session], where: EventFilter, *, cap: int = BULK_CAP) -> int:
    """The dry run: how many rows a bulk reset would touch now (``cap + 1`` means more than cap)."""
    with sessions.begin() as session:
        count: int = session.execute(statement("count_filtered_events"), {**where.params(), "cap": cap}).scalar_one()
        return count


@dataclass(frozen=True)
class BulkResult:
    action_id: int
    reset: int
    chunks: int


def bulk_reset(sessions: sessionmaker[Session], where: EventFilter, *, now: datetime, as_of: datetime,
               expected: int, actor: str, source: str, reason: str,
               cap: int = BULK_CAP, chunk: int = CHUNK) -> BulkResult:
    """Reset what the dry run at ``as_of`` counted (at most ``min(expected, cap)`` rows), in chunks."""
    if not reason.strip():
        raise FilterError("reason: a bulk reset needs a reason")
    limit = max(min(expected, cap), 0)
    with sessions.begin() as session:
        action_id = _record(session, now=now, actor=actor, source=source, action="bulk_reset",
                            event_id=None, filter=where.as_json(), count=0, reason=reason.strip())
    done, chunks, after = 0, 0, ""
    params = {**where.params(), "as_of": as_of, "now": now}
    while done < limit:
        with sessions.begin() as session:
            set_change_context(session, "reset", actor)
            ids = list(session.execute(statement("reset_filtered_chunk"), {
                **params, "after_id": after, "chunk": min(chunk, limit - done),
            }).scalars())
            if not ids:
                break
            session.execute(statement("link_action_events"), {"action_id": action_id, "event_ids": ids})
            done += len(ids)
            session.execute(statement("set_operator_action_count"), {"id": action_id, "count": done})
        chunks += 1
        after = max(ids)
    return BulkResult(action_id, done, chunks)


def _jsonable(row: Mapping[str, Any] | RowMapping) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


def list_actions(sessions: sessionmaker[Session], *, limit: int = 100, before_id: int | None = None) -> list[dict[str, Any]]:
    """The audit trail, newest first; ``before_id`` continues from the previous page."""
    with sessions.begin() as session:
        rows = session.execute(statement("list_operator_actions"), {"limit": limit, "before_id": before_id}).mappings()
        return [_jsonable(r) for r in rows]


def event_actions(sessions: sessionmaker[Session], event_id: str) -> list[dict[str, Any]]:
    with sessions.begin() as session:
        return [_jsonable(r) for r in session.execute(statement("event_actions"), {"event_id": event_id}).mappings()]


def event_notifications(sessions: sessionmaker[Session], event_id: str) -> list[dict[str, Any]]:
    with sessions.begin() as session:
        rows = session.execute(statement("event_notifications"), {"event_id": event_id}).mappings()
        return [_jsonable(r) for r in rows]
