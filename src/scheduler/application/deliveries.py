"""What operators do to the outbox (OUTBOX-9..11): list what did not get through, and retry it.

The console and ``POST /admin/deliveries/{id}/retry`` run these commands and nothing else.
A retry acts only on ``retrying`` and ``undeliverable`` rows that no worker holds (a live
lease: the row is being sent right now, and its attempt's record is the row's): the row is
``queued`` again, due at once, with its attempts counted afresh (the retry policy runs
again from its first attempt); ``last_error`` stays until the next attempt replaces it, and
the idempotency key is the same, so a receiver still drops a repeat. Every retry is audited
like the console's other commands: one ``operator_actions`` row (who, through which
adapter, why, the delivery's id or the filter, how many rows) in the same transaction as the
change (``retry_delivery``) or before the first chunk (``bulk_retry``, whose count follows
the chunks). A bulk retry acts on what its dry run counted: matching rows unchanged since
(``updated_at <= as_of``), at most ``cap``, in chunks that skip rows a worker holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from scheduler.application.commands import BULK_CAP, CHUNK, MAX_REASON, Actor, BulkResult
from scheduler.application.events import QueryError
from scheduler.database.database import Database, row_as_json


class Retryable(StrEnum):
    """The outbox statuses an operator may retry (``DeliveryRowStatus``'s)."""

    RETRYING = "retrying"
    UNDELIVERABLE = "undeliverable"


# The filter fields of the list and the bulk retry (a form's, a query string's).
FILTER_FIELDS = ("status", "channel", "user_id")


@dataclass(frozen=True)
class DeliveryQuery:
    """Which retryable rows: one status (both when ``None``), a channel, a participant."""

    status: Retryable | None = None
    channel: str | None = None
    user_id: str | None = None

    @classmethod
    def from_mapping(cls, fields: Mapping[str, str]) -> DeliveryQuery:
        """The filter from a form's fields; an empty field is no filter, a bad status a ``QueryError``."""
        status = (fields.get("status") or "").strip()
        if status and status not in {str(s) for s in Retryable}:
            raise QueryError("status", f"a retry acts on {', '.join(str(s) for s in Retryable)}, not {status[:40]!r}")
        channel, user_id = (fields.get("channel") or "").strip(), (fields.get("user_id") or "").strip()
        if len(channel) > 32 or len(user_id) > 200:
            raise QueryError("channel" if len(channel) > 32 else "user_id", "too long")
        return cls(Retryable(status) if status else None, channel or None, user_id or None)

    def as_json(self) -> dict[str, str]:
        """The filter's set fields (the audit row's ``filter``, a link's query string)."""
        found = {"status": self.status, "channel": self.channel, "user_id": self.user_id}
        return {k: str(v) for k, v in found.items() if v is not None}

    def params(self) -> dict[str, Any]:
        statuses = [str(self.status)] if self.status is not None else [str(s) for s in Retryable]
        return {"statuses": statuses, "channel": self.channel, "user_id": self.user_id}


MAX_ID = 2**63 - 1


def delivery_id_of(raw: str) -> int | None:
    """A delivery's id from a path segment: ASCII digits naming a bigint id, else ``None`` (no
    such delivery: the route's 404, never another error)."""
    if not raw or len(raw) > 19 or not raw.isascii() or not raw.isdigit():
        return None
    value = int(raw)
    return value if 1 <= value <= MAX_ID else None


RetryOutcome = Literal["retried", "not_retryable", "missing"]


@dataclass(frozen=True)
class RetryResult:
    """What a retry found: ``retried`` (``delivery`` is the row, queued again),
    ``not_retryable`` (the row as it is: queued, delivered, an in-app row, or being sent now:
    recorded with count 0) or ``missing`` (nothing recorded)."""

    outcome: RetryOutcome
    delivery: dict[str, Any] | None
    action_id: int | None


def list_retryable(database: Database, query: DeliveryQuery, *, before_id: int | None = None,
                   limit: int = 50) -> list[dict[str, Any]]:
    """Retrying and undeliverable rows, newest first (``before_id``: the previous page's last)."""
    with database.begin() as session:
        return [row_as_json(r) for r in database.deliveries.list_retryable(
            session, query.params(), before_id=before_id, limit=limit)]


def _reason(reason: str | None) -> str | None:
    return (reason or "").strip()[:MAX_REASON] or None


def retry_delivery(database: Database, delivery_id: int | None, *, now: datetime, actor: Actor,
                   reason: str | None = None) -> RetryResult:
    """Queue one retrying or undeliverable row again, due at ``now``; audited. ``None`` (an id
    that names no row, ``delivery_id_of``) is ``missing``."""
    if delivery_id is None:
        return RetryResult("missing", None, None)
    with database.begin() as session:
        row = database.deliveries.retry(session, delivery_id, now=now)
        found = row if row is not None else database.deliveries.get(session, delivery_id)
        if found is None:
            return RetryResult("missing", None, None)
        action_id = database.operations.record_action(
            session, now=now, actor=actor.name, source=actor.source, action="retry_delivery", event_id=None,
            filter_json=json.dumps({"delivery_id": delivery_id}), count=int(row is not None), reason=_reason(reason))
        return RetryResult("retried" if row is not None else "not_retryable", row_as_json(found), action_id)


def count_retryable(database: Database, query: DeliveryQuery, *, now: datetime, cap: int = BULK_CAP) -> int:
    """The dry run: how many rows a bulk retry would queue now (``cap + 1``: more than ``cap``)."""
    with database.begin() as session:
        return database.deliveries.count_retryable(session, query.params(), now=now, cap=cap)


def bulk_retry(database: Database, query: DeliveryQuery, *, now: datetime, as_of: datetime, expected: int,
               actor: Actor, reason: str, cap: int = BULK_CAP, chunk: int = CHUNK) -> BulkResult:
    """Queue again what the dry run at ``as_of`` counted (at most ``min(expected, cap)`` rows), in chunks."""
    why = _reason(reason)
    if why is None:
        raise QueryError("reason", "a bulk retry needs a reason")
    limit = max(min(expected, cap), 0)
    with database.begin() as session:
        action_id = database.operations.record_action(
            session, now=now, actor=actor.name, source=actor.source, action="bulk_retry_deliveries", event_id=None,
            filter_json=json.dumps(query.as_json()), count=0, reason=why)
    done, chunks, after = 0, 0, 0
    while done < limit:
        with database.begin() as session:
            ids = database.deliveries.retry_chunk(session, query.params(), now=now, as_of=as_of, after_id=after,
                                                  chunk=min(chunk, limit - done))
            if not ids:
                break
            done += len(ids)
            database.operations.set_action_count(session, action_id, done)
        chunks += 1
        after = max(ids)
    return BulkResult(action_id, done, chunks)


__all__ = ["DeliveryQuery", "RetryResult", "Retryable", "bulk_retry", "count_retryable", "delivery_id_of",
           "list_retryable", "retry_delivery"]
