"""``POST /admin/scheduled-events/bulk``: many scheduled events in one request (BATCH-*).

The body is a JSON array of up to ``SCHEDULER_BULK_MAX_EVENTS`` events (more is a 413),
read through the one bounded reader with a bound of its own
(``SCHEDULER_BULK_MAX_BODY_BYTES``). ``check_items`` judges each item exactly as a single
POST judges its body (REQ-0063: the same schema, the same facts contract, the same 422
bodies; an item larger than ``SCHEDULER_MAX_BODY_BYTES`` is a 422 of its own), and refuses
an external key already given by an earlier item, naming that item. The valid items are
stored together by ``application.ingest.store_scheduled_events`` (one transaction, two statements); the answer is a
200 listing one result per item, in order (DEC-BATCH). ``scheduler events import`` runs the
same ``check_items`` and the same store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application.ingest import (
    ExpiryRefused,
    NewEvent,
    Stored,
    store_scheduled_events,
    stored_expires_at,
)
from scheduler.database.database import Database
from scheduler.nudging.facts import FactsContract
from scheduler.observability.observer import Observer
from scheduler.types import Clock
from scheduler.web.api.intake import facts_refusal
from scheduler.web.http.answers import BulkItemOut, HTTPRefusal, ScheduledEventOut, respond
from scheduler.web.http.auth import actor_of, require
from scheduler.web.http.bodies import ScheduledEventIn, parse_body, read_json
from scheduler.web.http.params import Unprocessable, declares

NOT_AN_ARRAY = "body must be a JSON array of scheduled events"


@dataclass(frozen=True)
class Refusal:
    """An item refused: ``body`` is what a single POST of it would have been answered (a 422)."""

    body: dict[str, Any]


def _unprocessable(exc: Unprocessable) -> Refusal:
    return Refusal(exc.body().model_dump(mode="json", exclude_unset=True))


def item_size(payload: Any) -> int:
    """The item's size as compact JSON in UTF-8: what the least a sender could have sent of it weighs."""
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def check_item(payload: Any, *, max_item_bytes: int, default_expiry: timedelta | None = None,
               facts_contract: FactsContract | None = None) -> NewEvent | Refusal:
    """One item judged as a single POST's body is (REQ-0063), or its refusal; its
    ``expires_at`` as the single store keeps it (the sender's, or the default window, EXP-5).
    ``facts_contract`` is the host's own (DEC-FACTS-CONTRACT), else the built-in one."""
    try:
        size = item_size(payload)
    except RecursionError:
        return _unprocessable(Unprocessable.field("body", "is nested too deeply", "body is nested too deeply"))
    if size > max_item_bytes:
        message = f"is larger than {max_item_bytes} bytes, the bound of one event (SCHEDULER_MAX_BODY_BYTES)"
        return _unprocessable(Unprocessable.field("body", message, f"event {message}"))
    try:
        body = parse_body(ScheduledEventIn, payload)
    except Unprocessable as exc:
        return _unprocessable(exc)
    refused = facts_refusal(body.facts, facts_contract)
    if isinstance(refused, HTTPRefusal):
        return Refusal({"detail": refused.detail})
    if refused is not None:
        return _unprocessable(refused)
    facts = body.facts if body.facts is not None else {}  # absent facts a host's own contract accepts
    try:
        expires_at = stored_expires_at(body.trigger_at, body.expires_at, default_expiry)
    except ExpiryRefused as exc:
        return _unprocessable(Unprocessable.field(exc.field, exc.problem))
    return NewEvent(event_type=body.event_type, user_id=body.user_id, community_id=body.community_id,
                    external_key=body.external_key, trigger_at=body.trigger_at, facts=facts,
                    expires_at=expires_at)


def repeated_key(first: int, *, what: str = "item") -> Refusal:
    """The refusal of an item whose external key an earlier item (``first``) already gave."""
    message = f"repeats the external_key of {what} {first}; a key appears once per request"
    return _unprocessable(Unprocessable.field("external_key", message))


def check_items(payloads: Sequence[Any], *, max_item_bytes: int, default_expiry: timedelta | None = None,
                first_of_key: dict[str, int] | None = None, positions: Sequence[int] | None = None,
                what: str = "item", facts_contract: FactsContract | None = None) -> list[NewEvent | Refusal]:
    """Each payload judged on its own (``check_item``), then a key already given refused
    naming where it was first given. ``first_of_key`` (key -> position) carries the keys seen
    across calls (an import's chunks); ``positions`` names the items (default: their indexes)."""
    seen = first_of_key if first_of_key is not None else {}
    checked: list[NewEvent | Refusal] = []
    for offset, payload in enumerate(payloads):
        position = positions[offset] if positions is not None else offset
        result = check_item(payload, max_item_bytes=max_item_bytes, default_expiry=default_expiry,
                            facts_contract=facts_contract)
        if isinstance(result, NewEvent) and result.external_key is not None:
            first = seen.setdefault(result.external_key, position)
            if first != position:
                result = repeated_key(first, what=what)
        checked.append(result)
    return checked


def store_checked(database: Database, checked: Sequence[NewEvent | Refusal], **store: Any
                  ) -> list[Stored | Refusal]:
    """Store the valid items of ``checked`` together (``store_scheduled_events``); each item's
    result, in order."""
    valid = [item for item in checked if isinstance(item, NewEvent)]
    stored = iter(store_scheduled_events(database, valid, **store))
    return [item if isinstance(item, Refusal) else next(stored) for item in checked]


class BulkStoreRoutes:
    """``POST /admin/scheduled-events/bulk``."""

    def __init__(self, *, database: Database, clock: Clock, max_events: int, max_body_bytes: int,
                 max_item_bytes: int, observer: Observer | None = None,
                 default_expiry: timedelta | None = None, facts_contract: FactsContract | None = None) -> None:
        self.database = database
        self.facts_contract = facts_contract  # the host's own (DEC-FACTS-CONTRACT), else the built-in one
        self.default_expiry = default_expiry  # SCHEDULER_DEFAULT_EXPIRY_SECONDS, as the single POST's
        self.clock = clock
        self.max_events = max_events
        self.max_body_bytes = max_body_bytes
        self.max_item_bytes = max_item_bytes
        self.observer = observer or Observer()

    def routes(self) -> list[BaseRoute]:
        return [Route("/admin/scheduled-events/bulk", self.store_many, methods=["POST"])]

    @require("ingest")
    @declares()
    async def store_many(self, request: Request) -> Response:
        """Store many events for later: each judged as a single POST (REQ-0063), the valid
        ones stored in one transaction (REQ-0064 for keys); one result per item, in order."""
        payload = await read_json(request, self.max_body_bytes)
        if not isinstance(payload, list):
            raise Unprocessable.field("body", "must be a JSON array of scheduled events", NOT_AN_ARRAY)
        if len(payload) > self.max_events:
            raise HTTPException(413, f"more than {self.max_events} events in one request (SCHEDULER_BULK_MAX_EVENTS)")
        checked = check_items(payload, max_item_bytes=self.max_item_bytes, default_expiry=self.default_expiry,
                              facts_contract=self.facts_contract)
        # observability: the storing request's trace context, as a single POST's rows keep
        traceparent = self.observer.storing_traceparent(request.headers.get("traceparent"))
        with self.observer.store_bulk(len(payload)) as done:
            results = await run_in_threadpool(
                store_checked, self.database, checked, now=self.clock.now(), actor=actor_of(request),
                traceparent=traceparent)
            refused = sum(isinstance(result, Refusal) for result in results)
            done(len(results) - refused, refused)
        return respond([_item_out(index, result) for index, result in enumerate(results)])


def _item_out(index: int, result: Stored | Refusal) -> BulkItemOut:
    if isinstance(result, Refusal):
        return BulkItemOut.model_validate({"index": index, "status": 422, "error": result.body})
    return BulkItemOut(index=index, status=201, rewritten=result.rewritten,
                        event=ScheduledEventOut.model_validate(result.row))
