"""What may be stored, and storing it: a scheduled event (inserted, or its key's row
rewritten, REQ-0064), a participant's preferences, their notifications; and the change
context the history trigger reads.

What may be stored:

- a ``trigger_at`` is an aware instant from 2000-01-01 up to (not including) 9999-01-01, UTC,
  with an offset PostgreSQL reads (DEC-TRIGGER). PostgreSQL's ``timestamptz`` reaches far past
  Python's ``datetime`` (years 1 to 9999, in the zone it is read in), so a time near either end
  would be stored and then unreadable in some session zone, or sort before the claim's keyset
  start: stored, never claimed. Nothing a reminder needs lies before 2000, and the zero times
  senders send when they forgot the time (Go's ``0001-01-01T00:00:00Z``, Unix time 0) are
  refused as the mistakes they are. The offset stays under 16 hours either side of UTC
  (``+15:59`` is read, ``+16:00`` refused); every real zone is within 14. Every path that
  stores one checks it here: the API's schema (a 422 naming the field) and ``store_event``
  (the simulation's posts, an embedding host's code).
- an ``expires_at`` is an aware instant after ``trigger_at``, in the same range (EXP-1, EXP-5,
  DEC-EXPIRY): claimed after it (by the service's clock, the ``:now`` the claim binds), the
  row is not dispatched but ends ``expired`` (``claim_due_events``). A row without one gets
  the service's default window (``SCHEDULER_DEFAULT_EXPIRY_SECONDS``) when one is set,
  measured from its ``trigger_at`` (never from when it was stored: a delayed reminder is not
  born expired), the sum kept to the same range. The result is stored on the row, so a
  later change of the setting rewrites nothing.

The adapters reach the stores through ``scheduler.application`` (``ingest``, ``participants``);
what operators do to stored rows (list, reset, cancel) is ``scheduler.application``'s too.
Each store runs in its own short transaction and binds ``now`` from the caller's clock,
except ``store_event_in``, which runs in the caller's (a host's own code, ``scheduler.schedule``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.orm import Session

from scheduler.database.database import Database, row_as_json
from scheduler.database.events import EventRepository
from scheduler.types import DigitalTwinEvent

# -- what may be stored: the range of a trigger_at, an expiry (DEC-TRIGGER, DEC-EXPIRY) --

EARLIEST_TRIGGER = datetime(2000, 1, 1, tzinfo=UTC)  # the first storable instant
LATEST_TRIGGER = datetime(9999, 1, 1, tzinfo=UTC)  # the first instant past the range

# Before every row the table can hold that Python can read (the earliest aware UTC instant):
# where the claim's keyset starts, and what a wake-up without a time stands for ("look now").
BEFORE_EVERY_TRIGGER = datetime.min.replace(tzinfo=UTC)

# PostgreSQL's timestamptz input refuses a displacement of 16 hours or more ("time zone
# displacement out of range"): the set-based store sends its instants as text.
OFFSET_BOUND = timedelta(hours=16)
OFFSET_TEXT = "within \u00b115:59 of UTC (what PostgreSQL reads)"

RANGE_TEXT = f"{EARLIEST_TRIGGER:%Y-%m-%dT%H:%M:%SZ} (included) to {LATEST_TRIGGER:%Y-%m-%dT%H:%M:%SZ} (excluded)"


class TriggerOutOfRange(ValueError):
    """A ``trigger_at`` outside the storable range, not an aware datetime, or with an offset
    PostgreSQL does not read."""


def check_trigger_at(value: datetime) -> datetime:
    """``value`` if it is an aware instant in the storable range, with an offset PostgreSQL
    reads; else ``TriggerOutOfRange`` saying what the range is."""
    offset = value.utcoffset() if value.tzinfo is not None else None
    if offset is None:
        raise TriggerOutOfRange("must be an ISO 8601 instant with its offset (a naive time is ambiguous)")
    if abs(offset) >= OFFSET_BOUND:
        raise TriggerOutOfRange(f"must have an offset {OFFSET_TEXT}, got {value.isoformat()}")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-12:00 is year 10000 in UTC
        utc = LATEST_TRIGGER
    if not EARLIEST_TRIGGER <= utc < LATEST_TRIGGER:
        raise TriggerOutOfRange(f"must be from {RANGE_TEXT}, got {value.isoformat()}")
    return value


class ExpiryRefused(ValueError):
    """An ``expires_at`` that cannot be stored; ``field`` names the field the 422 names."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_expires_at(trigger_at: datetime, expires_at: datetime) -> datetime:
    """``expires_at`` if it is an aware instant in the storable range after ``trigger_at``;
    else ``ExpiryRefused`` naming ``expires_at``."""
    try:
        check_trigger_at(expires_at)
    except TriggerOutOfRange as exc:
        raise ExpiryRefused("expires_at", str(exc)) from None
    if expires_at <= trigger_at:
        raise ExpiryRefused("expires_at", f"must be after trigger_at ({trigger_at.isoformat()}), "
                                          f"got {expires_at.isoformat()}")
    return expires_at


def stored_expires_at(trigger_at: datetime, expires_at: datetime | None,
                      default_window: timedelta | None) -> datetime | None:
    """The ``expires_at`` a row is stored with: the sender's (checked), else ``trigger_at``
    plus the default window when one is set, else none (REQ-0065's literal behaviour)."""
    if expires_at is not None:
        return check_expires_at(trigger_at, expires_at)
    if default_window is None:
        return None
    try:
        default = trigger_at + default_window
        check_trigger_at(default)
    except (OverflowError, TriggerOutOfRange):
        raise ExpiryRefused("trigger_at", f"with the service's default expiry window ({default_window}) its "
                                          f"expires_at would fall outside {RANGE_TEXT}; send an earlier "
                                          "trigger_at or an expires_at of its own") from None
    return default


# The last instant the storable range holds (``LATEST_TRIGGER`` is the first one past it).
LAST_STORABLE = LATEST_TRIGGER - timedelta(microseconds=1)


def held_expires_at(arrived_at: datetime, default_window: timedelta | None) -> datetime | None:
    """The ``expires_at`` of a live event its participant's quiet hours held (QUIET-7): its
    arrival plus the default window, or the last storable instant when the window reaches
    past the range (QUIET-9). The sender sent no time to correct, so nothing is refused:
    no claim inside the range can come after either."""
    if default_window is None:
        return None
    try:
        return stored_expires_at(arrived_at, None, default_window)
    except ExpiryRefused:
        return LAST_STORABLE


# -- storing --

EVENT_COLUMNS = (
    "id", "event_type", "user_id", "community_id", "external_key", "trigger_at", "expires_at", "facts",
    "status", "last_error", "created_at", "updated_at", "dispatched_at", "not_before",
)


def event_to_json(row: Mapping[str, Any] | RowMapping) -> dict[str, Any]:
    """A stored row as the API shows it: every column, times in ISO 8601."""
    return row_as_json({k: row[k] for k in EVENT_COLUMNS})


def store_event(
    database: Database,
    *,
    event_type: str,
    user_id: str,
    community_id: str | None,
    external_key: str | None,
    trigger_at: datetime,
    facts: Mapping[str, Any],
    now: datetime,
    event_id: str | None = None,
    actor: str | None = None,
    traceparent: str | None = None,
    expires_at: datetime | None = None,
    default_expiry: timedelta | None = None,
) -> dict[str, Any]:
    """Insert a row, or rewrite and reset the row of ``external_key`` (REQ-0064), atomically.

    ``event_id`` names a new row (default: a random UUID); the simulation passes seeded
    ids so that a replayed run claims rows in the same ``(trigger_at, id)`` order.
    ``actor`` (a token's subject) is recorded in the row's history. ``traceparent`` (W3C,
    already validated) is the storing request's trace context, which the dispatch links to.
    A ``trigger_at`` outside the storable range is a ``TriggerOutOfRange``.
    ``expires_at`` (after ``trigger_at``), else ``trigger_at + default_expiry`` when the
    service sets a window, is stored on the row (an ``ExpiryRefused`` names
    the field otherwise): claimed after it, the row ends ``expired`` (EXP-2).
    """
    check_trigger_at(trigger_at)  # before the expiry is worked out from it (DEC-TRIGGER)
    expiry = stored_expires_at(trigger_at, expires_at, default_expiry)
    with database.begin() as session:
        return event_to_json(store_event_in(
            session, database.events, event_type=event_type, user_id=user_id, community_id=community_id,
            external_key=external_key, trigger_at=trigger_at, facts=facts, now=now, expires_at=expiry,
            actor=actor, event_id=event_id, traceparent=traceparent))


def store_event_in(
    session: Session,
    events: EventRepository,
    *,
    event_type: str,
    user_id: str,
    community_id: str | None,
    external_key: str | None,
    trigger_at: datetime,
    facts: Mapping[str, Any],
    now: datetime,
    expires_at: datetime | None,
    actor: str | None = None,
    event_id: str | None = None,
    traceparent: str | None = None,
) -> dict[str, Any]:
    """``store_event``'s insert or upsert by key on the caller's ``session``, in the caller's
    transaction (committed with its commit, gone with its rollback), with ``events`` (the
    service's schema): a host's own code scheduling beside its own rows, and ``store_event``
    inside its own transaction. ``expires_at`` is the one to store (already worked out); the
    stored row is returned as read."""
    check_trigger_at(trigger_at)  # every path that stores one keeps to the range (DEC-TRIGGER)
    params = {
        "id": event_id or str(uuid.uuid4()),
        "event_type": event_type,
        "user_id": user_id,
        "community_id": community_id,
        "external_key": external_key,
        "trigger_at": trigger_at,
        "expires_at": expires_at,
        "facts": json.dumps(facts),
        "now": now,
        "traceparent": traceparent,
    }
    # the one insert, or upsert by key (REQ-0064), of every single store
    if params["external_key"] is not None or actor is not None:
        # the history trigger reads these; "rewritten" names the upsert's UPDATE path
        events.set_change_context(session, "rewritten", actor)
    # a row that becomes pending is announced to prompt-mode replicas by the database
    # (the trigger ``tr_scheduled_events_announce_due``), whatever path wrote it: NOTIFY is
    # delivered when the transaction commits, and not at all when it rolls back
    return events.store(session, params, by_key=params["external_key"] is not None)


def store_held_live_event(session: Session, events: EventRepository, event: DigitalTwinEvent, *, now: datetime,
                          not_before: datetime, default_expiry: timedelta | None = None,
                          traceparent: str | None = None) -> dict[str, Any]:
    """In the live dispatch's transaction, store a live event its participant's quiet hours
    held as a scheduled row: ``trigger_at`` its arrival (``now``), due at ``not_before``, the
    same facts, the service's default expiry window, kept to the storable range (QUIET-7,
    QUIET-9); the row as the API shows it."""
    params = {
        "id": str(uuid.uuid4()), "event_type": event.event_type, "user_id": event.user_id,
        "community_id": event.community_id, "expires_at": held_expires_at(now, default_expiry),
        "facts": json.dumps(dict(event.facts)), "now": now, "traceparent": traceparent, "not_before": not_before,
    }
    events.set_change_context(session, "held", None)
    return event_to_json(events.store_held(session, params))


def list_notifications(
    database: Database, *, user_id: str | None, status: str | None, limit: int
) -> list[dict[str, Any]]:
    with database.begin() as session:
        rows = database.inbox.list_notifications(session, user_id=user_id, status=status, limit=limit)
        return [row_as_json(r) for r in rows]


def list_deliveries(database: Database, *, status: str | None, channel: str | None,
                    user_id: str | None, notification_id: str | None, limit: int) -> list[dict[str, Any]]:
    """The delivery log and the outbox, newest first, each filter optional."""
    with database.begin() as session:
        rows = database.deliveries.list(session, status=status, channel=channel, user_id=user_id,
                                        notification_id=notification_id, limit=limit)
        return [row_as_json(r) for r in rows]


def set_preferences(
    database: Database,
    user_id: str,
    *,
    enabled_kinds: Sequence[str] | None,
    max_per_day: int,
    now: datetime,
    time_zone: str | None = None,
    quiet_start: time | None = None,
    quiet_end: time | None = None,
) -> dict[str, Any]:
    """Set a participant's preferences (the stored row, its columns); a change of their zone or
    quiet hours releases their held rows (``not_before`` cleared: each is decided again at the
    next claim, QUIET-5)."""
    with database.begin() as session:
        row = database.decisions.set_preferences(session, user_id, enabled_kinds=enabled_kinds,
                                                 max_per_day=max_per_day, now=now, time_zone=time_zone,
                                                 quiet_start=quiet_start, quiet_end=quiet_end)
        return row_as_json(row)


def get_preferences(database: Database, user_id: str) -> dict[str, Any] | None:
    """A participant's stored preferences row (its columns), ``None`` when none was set."""
    with database.begin() as session:
        row = database.decisions.get_preferences(session, user_id)
        return None if row is None else row_as_json(row)
