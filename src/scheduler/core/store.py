"""The core's writes and reads of a sender's and a participant's rows: a scheduled event
stored (inserted, or its key's row rewritten, REQ-0064), a participant's preferences,
their notifications; and the change context the history trigger reads.

The adapters reach these through ``scheduler.application`` (``ingest``, ``participants``);
what operators do to stored rows (list, reset, cancel) is ``scheduler.application``'s too.

Each function runs in its own short transaction and binds ``now`` from the caller's clock,
except ``store_event_in``, which runs in the caller's (a host's own code, ``scheduler.schedule``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, time, timedelta
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.orm import Session

from scheduler.core.expiry import held_expires_at, stored_expires_at
from scheduler.core.trigger_range import check_trigger_at
from scheduler.database.database import Database
from scheduler.database.events import EventRepository
from scheduler.database.rows import row_as_json
from scheduler.types import DigitalTwinEvent

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
    A ``trigger_at`` outside the storable range is a ``TriggerOutOfRange`` (``core.trigger_range``).
    ``expires_at`` (after ``trigger_at``), else ``trigger_at + default_expiry`` when the
    service sets a window, is stored on the row (``core.expiry``; an ``ExpiryRefused`` names
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
