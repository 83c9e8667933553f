"""Storing many scheduled events at once: one transaction, a fixed number of statements.

``store_events`` is the set-based twin of ``core.store.store_event``: every event is one
element of a JSON array bound to ``store_events_batch`` (an ``INSERT ... SELECT FROM
jsonb_to_recordset ... ON CONFLICT (external_key) DO UPDATE``), so a thousand events cost
the same two statements as one (the change context for the history trigger, then the
store). Each row ends exactly as the single store leaves it (REQ-0064: a known key's row is
rewritten and reset to pending; the history trigger records ``stored`` or ``rewritten``;
the trigger ``tr_scheduled_events_announce_due`` announces every pending row to prompt-mode replicas).

Keyed rows are taken in the order of their keys (BATCH-4), so two batches sharing keys wait
for each other in one order and never deadlock. The keys of one call must be distinct: the
callers (the batch route, ``scheduler events import``) refuse a repeat first.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.core.store import check_trigger_at, event_to_json
from scheduler.database.database import Database

STATEMENTS = 2  # set_change_context and store_events_batch, whatever the number of events


@dataclass(frozen=True)
class NewEvent:
    """One event to store, already validated (the same fields as ``store_event``'s)."""

    event_type: str
    user_id: str
    community_id: str | None
    external_key: str | None
    trigger_at: datetime
    facts: Mapping[str, Any]
    event_id: str | None = None
    expires_at: datetime | None = None  # as stored: the sender's, or trigger_at plus the default window


@dataclass(frozen=True)
class Stored:
    """One stored event: its row as the API shows it, and whether an existing key's row was rewritten."""

    row: dict[str, Any]
    rewritten: bool


class RepeatedKey(ValueError):
    """Two events of one call share an external key (the callers refuse the later ones first)."""


def store_events(
    database: Database,
    events: Sequence[NewEvent],
    *,
    now: datetime,
    actor: str | None = None,
    traceparent: str | None = None,
) -> list[Stored]:
    """Store ``events`` in one transaction (all or none), answering one ``Stored`` per event, in order.

    ``actor`` and ``traceparent`` are the single store's: the history's actor, the storing
    request's trace context (one request, so one for every row). A ``trigger_at`` outside
    the storable range is a ``TriggerOutOfRange``; a key given twice a ``RepeatedKey``.
    """
    seen: set[str] = set()
    items: list[dict[str, Any]] = []
    for index, event in enumerate(events):
        check_trigger_at(event.trigger_at)  # every path that stores one keeps to the range (DEC-TRIGGER)
        if event.external_key is not None:
            if event.external_key in seen:
                raise RepeatedKey(f"external_key {event.external_key!r} is given twice")
            seen.add(event.external_key)
        items.append({
            "ord": index,
            "id": event.event_id or str(uuid.uuid4()),
            "event_type": event.event_type,
            "user_id": event.user_id,
            "community_id": event.community_id,
            "external_key": event.external_key,
            "trigger_at": event.trigger_at.isoformat(),
            "expires_at": event.expires_at.isoformat() if event.expires_at is not None else None,
            "facts": event.facts,
        })
    if not items:
        return []
    with database.begin() as session:
        # the history trigger reads these, as for the single store ("rewritten" names the
        # upsert's UPDATE path; an INSERT records "stored" whatever they say)
        database.events.set_change_context(session, "rewritten", actor)
        rows = database.events.store_many(session, items=json.dumps(items), now=now, traceparent=traceparent)
    by_key = {row["external_key"]: row for row in rows if row["external_key"] is not None}
    by_id = {row["id"]: row for row in rows}
    stored: list[Stored] = []
    for item in items:
        row = by_key[item["external_key"]] if item["external_key"] is not None else by_id[item["id"]]
        stored.append(Stored(event_to_json(row), rewritten=not row["inserted"]))
    return stored
