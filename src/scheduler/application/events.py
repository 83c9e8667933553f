"""The one query model of scheduled events, and the records the application layer returns.

``EventQuery`` is what every adapter selects rows by: the API list
(``GET /admin/scheduled-events``), the console's events page and bulk actions,
``scheduler events list|reset`` and the bulk commands. Its fields bind the one WHERE
fragment of queries.sql (``event_filter``); each page statement adds only its order and
keyset. A ``Cursor`` continues a page where the previous one stopped (no OFFSET): it is
opaque to clients (URL-safe base64 of the order, the last row's sort time and id) and is
parsed strictly, like every other field a stranger sends.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import RowMapping

from scheduler.core.store import event_to_json
from scheduler.database.database import Database
from scheduler.types import EventStatus
from scheduler.whole_numbers import digits_value

MAX_TEXT = 200
MAX_LIMIT = 1000


class QueryError(ValueError):
    """A query field is malformed; the message names it (``field: problem``)."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


class EventOrder(StrEnum):
    """The orders a page of rows comes in (each one walks an index of its own)."""

    # The API's order from the start: newest change first, ties by id ascending.
    CHANGED = "changed"
    # The console's: newest change first, ties by id descending (the (updated_at, id)
    # indexes walked backwards, so a page reads one page of rows even among equal times).
    CHANGED_DESC = "changed-desc"
    # Pending rows next due first: the claim's order, on the pending partial index.
    DUE = "due"


_PAGE_STATEMENT = {
    EventOrder.CHANGED: "list_events",
    EventOrder.CHANGED_DESC: "filter_events_page",
    EventOrder.DUE: "filter_pending_page",
}


def parse_time(name: str, raw: str | None) -> datetime | None:
    """An ISO 8601 time with a zone from a form or query field; empty is ``None``."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise QueryError(name, f"not an ISO 8601 time: {raw!r}") from None
    if value.tzinfo is None:
        raise QueryError(name, "give a time zone (e.g. 2026-11-30T09:00+00:00)")
    return value


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: strictly after the row sorted at (``at``, ``id``)."""

    order: EventOrder
    at: datetime
    id: str

    def encode(self) -> str:
        raw = json.dumps([str(self.order), self.at.isoformat(), self.id], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        """The cursor a previous page gave; anything else is a ``QueryError`` naming ``cursor``."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            order, at, event_id = json.loads(raw)
            when = datetime.fromisoformat(at)
            if when.tzinfo is None or not isinstance(event_id, str) or len(event_id) > MAX_TEXT:
                raise ValueError(token)
            return cls(EventOrder(order), when, event_id)
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
            raise QueryError("cursor", "not a cursor this service gave (use the one of the previous page)") from None


FILTER_FIELDS = ("status", "event_type", "user_id", "external_key", "community_id",
                 "trigger_from", "trigger_to", "error_contains")


@dataclass(frozen=True)
class EventQuery:
    """What rows of ``scheduled_events`` to select: every field optional, all of them ANDed.

    ``status`` takes any ``EventStatus`` (``cancelled`` included); ``trigger_from`` is
    inclusive and ``trigger_to`` exclusive; ``error_contains`` matches ``last_error`` in any
    case. ``cursor`` and ``limit`` page a list; the bulk commands ignore them.
    """

    status: EventStatus | None = None
    event_type: str | None = None
    user_id: str | None = None
    external_key: str | None = None
    community_id: str | None = None
    trigger_from: datetime | None = None
    trigger_to: datetime | None = None
    error_contains: str | None = None
    cursor: Cursor | None = field(default=None, compare=False)
    limit: int = 100

    @classmethod
    def from_mapping(cls, values: Mapping[str, str], *, limit: int = 100) -> EventQuery:
        """From query or form fields (empty means unset; ``cursor`` and ``limit`` too);
        a bad value is a ``QueryError`` naming its field."""
        text: dict[str, str | None] = {}
        for key in (*FILTER_FIELDS, "cursor", "limit"):
            value = (values.get(key) or "").strip() or None
            if value is not None and len(value) > (MAX_TEXT * 4 if key == "cursor" else MAX_TEXT):
                raise QueryError(key, f"at most {MAX_TEXT} characters")
            if value is not None and "\x00" in value:
                raise QueryError(key, "must not contain NUL characters")
            if value is not None and not _valid_unicode(value):
                raise QueryError(key, "contains an unpaired surrogate, which is not valid Unicode")
            text[key] = value
        status = text["status"]
        if status is not None and status not in {str(s) for s in EventStatus}:
            expected = ", ".join(EventStatus)
            raise QueryError("status", f"unknown status {status!r}; expected one of {expected}")
        raw_limit = text["limit"]
        if raw_limit is not None:
            parsed = digits_value(raw_limit, len(str(MAX_LIMIT)))
            if parsed is None or not 1 <= parsed <= MAX_LIMIT:
                raise QueryError("limit", f"must be a whole number from 1 to {MAX_LIMIT} (ASCII digits only)")
            limit = parsed
        query = cls(
            status=EventStatus(status) if status else None, event_type=text["event_type"],
            user_id=text["user_id"], external_key=text["external_key"], community_id=text["community_id"],
            trigger_from=parse_time("trigger_from", text["trigger_from"]),
            trigger_to=parse_time("trigger_to", text["trigger_to"]),
            error_contains=text["error_contains"], limit=limit,
        )
        return replace(query, cursor=Cursor.decode(text["cursor"])) if text["cursor"] else query

    def params(self) -> dict[str, Any]:
        """The bound parameters of the ``event_filter`` fragment."""
        values = {k: getattr(self, k) for k in FILTER_FIELDS}
        error = values.pop("error_contains")
        values["status"] = str(self.status) if self.status is not None else None
        values["error_like"] = _like(error) if error else None
        return values

    def as_json(self) -> dict[str, str]:
        """The filter fields that are set, as text (for the audit row and for links)."""
        return {k: (v.isoformat() if isinstance(v, datetime) else str(v))
                for k in FILTER_FIELDS if (v := getattr(self, k)) is not None}

    def is_empty(self) -> bool:
        return not self.as_json()

    def default_order(self) -> EventOrder:
        """The console's: pending rows next due first, the others newest change first."""
        return EventOrder.DUE if self.status is EventStatus.PENDING else EventOrder.CHANGED_DESC


@dataclass(frozen=True)
class EventRecord:
    """One stored scheduled event, every column (times as ``datetime``)."""

    id: str
    event_type: str
    user_id: str
    community_id: str | None
    external_key: str | None
    trigger_at: datetime
    facts: dict[str, Any]
    status: EventStatus
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None
    expires_at: datetime | None = None  # claimed after it, the row ends expired (EXP-2)
    not_before: datetime | None = None  # held in quiet hours until it (QUIET-2)

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | RowMapping) -> EventRecord:
        return cls(
            id=row["id"], event_type=row["event_type"], user_id=row["user_id"],
            community_id=row["community_id"], external_key=row["external_key"], trigger_at=row["trigger_at"],
            facts=row["facts"], status=EventStatus(row["status"]), last_error=row["last_error"],
            created_at=row["created_at"], updated_at=row["updated_at"], dispatched_at=row["dispatched_at"],
            # the console's page statements select fewer columns than the API's
            expires_at=row.get("expires_at"),
            not_before=row.get("not_before"),
        )

    def as_json(self) -> dict[str, Any]:
        """As the API shows it: every column, times in ISO 8601."""
        return event_to_json({**asdict(self), "status": str(self.status)})


@dataclass(frozen=True)
class EventPage:
    """One page of rows in the query's order, and the cursor of the next page (None: last page)."""

    rows: list[dict[str, Any]]
    next_cursor: Cursor | None


def list_events(database: Database, query: EventQuery,
                order: EventOrder = EventOrder.CHANGED) -> EventPage:
    """One page of ``query`` in ``order``, continuing after ``query.cursor``.

    ``EventOrder.CHANGED`` answers every column as JSON (the API's rows); the console's
    orders answer the columns its list shows, as stored. A cursor of another order is a
    ``QueryError``."""
    cursor = query.cursor
    if cursor is not None and cursor.order is not order:
        raise QueryError("cursor", "it continues another list (use the one of the previous page)")
    if order is EventOrder.DUE and query.status not in (None, EventStatus.PENDING):
        raise QueryError("status", "the due order lists pending rows only")
    params = {**query.params(), "after_at": cursor.at if cursor else None, "after_id": cursor.id if cursor else "",
              "limit": query.limit + 1}
    with database.begin() as session:
        found = database.events.page(session, _PAGE_STATEMENT[order], params)
    more = len(found) > query.limit
    found = found[: query.limit]
    next_cursor = None
    if more:
        last = found[-1]
        next_cursor = Cursor(order, last["due_at"] if order is EventOrder.DUE else last["updated_at"], last["id"])
    rows = [event_to_json(r) for r in found] if order is EventOrder.CHANGED else [dict(r) for r in found]
    return EventPage(rows, next_cursor)


def get_event(database: Database, event_id: str) -> EventRecord | None:
    """One row by id, or None."""
    with database.begin() as session:
        row = database.events.get(session, event_id)
        return EventRecord.from_row(row) if row else None
