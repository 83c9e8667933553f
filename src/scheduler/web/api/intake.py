"""The intake: the routes an event comes in by, to be stored for later or sent live now.

``IngestRoutes`` receives the database, the clock, the dispatch path (dispatcher and
publisher) and the body limit; a scheduled event is validated when stored (REQ-0063), a
live one goes through the same engine and orchestrator a scheduled event does (REQ-0066).
With an observer, a stored row keeps the POST's W3C ``traceparent`` and a live
dispatch gets a span of its own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import ingest
from scheduler.application.ingest import publish_committed
from scheduler.database.database import Database
from scheduler.nudging.facts import (
    ContractViolation,
    FactsContract,
    FactsMissing,
    check_facts_contract,
    host_contract_errors,
)
from scheduler.nudging.local_time import LocalTimeError
from scheduler.observability.observer import Observer
from scheduler.types import (
    Clock,
    DigitalTwinEvent,
    Dispatcher,
    DispatchOutcome,
    DispatchResult,
    Publisher,
)
from scheduler.web.http.answers import (
    DeferredOut,
    DuplicateOut,
    HTTPRefusal,
    IngestOut,
    NotificationOut,
    RuleRefusalOut,
    ScheduledEventOut,
    respond,
)
from scheduler.web.http.auth import actor_of, require
from scheduler.web.http.bodies import LiveEventIn, ScheduledEventIn, parse_body, read_json
from scheduler.web.http.params import Unprocessable, declares

EventBodyT = TypeVar("EventBodyT", ScheduledEventIn, LiveEventIn)

LIVE = "live"  # who publishes a live event's messages, in a failed push's log line
MISSING_FACTS_SCHEDULED = "Missing facts in scheduled event"
MISSING_FACTS_LIVE = "Missing facts in event"

# The live answers of REQ-0016, the only place a dispatch outcome becomes an HTTP status.
LIVE_STATUS: dict[DispatchOutcome, int] = {
    DispatchOutcome.DELIVERED: 200,
    DispatchOutcome.SUPPRESSED: 202,
    DispatchOutcome.NO_RULE_TRIGGERED: 204,
    DispatchOutcome.DUPLICATE: 409,
    DispatchOutcome.NO_RULE_FOR_SCENARIO: 400,
    DispatchOutcome.INVALID_EVENT: 422,
    # held in the participant's quiet hours: stored as a scheduled row due when they end (QUIET-7)
    DispatchOutcome.DEFERRED: 202,
}


def facts_refusal(facts: Any, contract: FactsContract | None,
                  missing_message: str = MISSING_FACTS_SCHEDULED) -> HTTPRefusal | Unprocessable | None:
    """How facts that break the contract are refused (``None``: they honour it), the same
    for every path that stores an event. The built-in contract (REQ-0012) keeps REQ-0063's
    two documented 422s (``missing_message``; ``invalid_facts_contract``); a host's own
    (DEC-FACTS-CONTRACT) is refused as every other 422, naming each field (absent facts
    are given to it as an empty object)."""
    if contract is not None:
        errors = host_contract_errors(contract, facts if facts is not None else {})
        return Unprocessable(errors, "facts refused by the facts contract: " + "; ".join(
            f"{e['field']}: {e['message']}" for e in errors)) if errors else None
    try:
        check_facts_contract(facts)
    except FactsMissing:
        return HTTPRefusal(422, missing_message)
    except ContractViolation as exc:
        return HTTPRefusal(422, {"error": "invalid_facts_contract", "errors": list(exc.errors)})
    return None


class IngestRoutes:
    """``POST /admin/scheduled-events`` and ``POST /admin/ingest-event``."""

    def __init__(self, *, database: Database, clock: Clock, dispatcher: Dispatcher,
                 publisher: Publisher, max_body_bytes: int, observer: Observer | None = None,
                 default_expiry: timedelta | None = None, facts_contract: FactsContract | None = None) -> None:
        self.database = database
        # the host's own facts contract (DEC-FACTS-CONTRACT), else the built-in one (REQ-0012)
        self.facts_contract = facts_contract
        self.clock = clock
        self.dispatcher = dispatcher
        self.publisher = publisher
        self.max_body_bytes = max_body_bytes
        # SCHEDULER_DEFAULT_EXPIRY_SECONDS: a row stored without expires_at gets trigger_at plus it
        self.default_expiry = default_expiry
        # observability: the live dispatch's span, the traceparent a stored row keeps
        self.observer = observer or Observer()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/admin/scheduled-events", self.create_scheduled_event, methods=["POST"]),
            Route("/admin/ingest-event", self.ingest_event, methods=["POST"]),
        ]

    @require("ingest")
    @declares()
    async def create_scheduled_event(self, request: Request) -> Response:
        """Store an event for later (REQ-0063, REQ-0064). Validated now, not when it fires."""
        body = await self._event_body(request, ScheduledEventIn, MISSING_FACTS_SCHEDULED)
        assert body.facts is not None
        row = await run_in_threadpool(
            self._store,
            self.database,
            event_type=body.event_type,
            user_id=body.user_id,
            community_id=body.community_id,
            external_key=body.external_key,
            trigger_at=body.trigger_at,
            expires_at=body.expires_at,
            default_expiry=self.default_expiry,
            facts=body.facts,
            now=self.clock.now(),
            actor=actor_of(request),
            # observability: the storing request's trace context, for the dispatch's link
            traceparent=self.observer.storing_traceparent(request.headers.get("traceparent")),
        )
        return respond(ScheduledEventOut.model_validate(row), 201)

    @staticmethod
    def _store(database: Database, **fields: Any) -> dict[str, Any]:
        """``ingest.store_scheduled_event``; an expiry it refuses (the default window past the
        range) is a 422 naming the field, as the schema's own checks are."""
        try:
            return ingest.store_scheduled_event(database, **fields)
        except ingest.ExpiryRefused as exc:
            raise Unprocessable.field(exc.field, exc.problem) from None

    @require("ingest")
    @declares()
    async def ingest_event(self, request: Request) -> Response:
        """The live path: the same engine and orchestrator a scheduled event goes through."""
        body = await self._event_body(request, LiveEventIn, MISSING_FACTS_LIVE)
        assert body.facts is not None
        event = DigitalTwinEvent(body.event_type, body.user_id, body.community_id, body.facts)
        now = self.clock.now()
        traceparent = self.observer.storing_traceparent(request.headers.get("traceparent"))
        result = await run_in_threadpool(self._dispatch_live, event, now, traceparent)
        status = LIVE_STATUS[result.outcome]
        if result.outcome is DispatchOutcome.DEFERRED:
            held = result.detail or {}
            return respond(DeferredOut(outcome=result.outcome, scheduled_event_id=held["id"],
                                       not_before=datetime.fromisoformat(held["not_before"])), status)
        if result.outcome.refused:
            return respond(RuleRefusalOut.model_validate({"detail": result.detail}), status)
        if result.outcome is DispatchOutcome.NO_RULE_TRIGGERED:
            return Response(status_code=status)
        notifications = [NotificationOut.model_validate(n) for n in result.notifications]
        if result.outcome is DispatchOutcome.DUPLICATE:
            detail = "duplicate: every rule that would fire already notified for this period"
            return respond(DuplicateOut(detail=detail, outcome=result.outcome, notifications=notifications), status)
        return respond(IngestOut(outcome=result.outcome, notifications=notifications), status)

    async def _event_body(self, request: Request, model: type[EventBodyT], missing_message: str) -> EventBodyT:
        """A validated event body whose facts honour the contract (REQ-0012), or the
        documented 422: ``missing_message`` for absent facts, ``invalid_facts_contract``."""
        body = parse_body(model, await read_json(request, self.max_body_bytes))
        refusal = facts_refusal(body.facts, self.facts_contract, missing_message)
        if refusal is not None:
            raise refusal
        if body.facts is None:  # absent facts a host's own contract accepts: stored as an empty object
            body.facts = {}
        return body

    def _dispatch_live(self, event: DigitalTwinEvent, now: datetime, traceparent: str | None) -> DispatchResult:
        # observability: the live dispatch's span (its statements inside); a broken host
        # dispatcher's NotADispatchResult is a 500
        try:
            with self.observer.live_dispatch(event.event_type) as dispatched:
                result = ingest.dispatch_live(self.database, self.dispatcher, event, now, dispatched=dispatched,
                                              default_expiry=self.default_expiry, traceparent=traceparent)
        except LocalTimeError as exc:
            # the participant's stored zone no longer loads (a tz database upgrade dropped it):
            # their state, not the sender's body, stands in the way; nothing was written (QUIET-8)
            raise HTTPException(409, f"participant {event.user_id!r} cannot be decided: their stored {exc}; "
                                     "set their preferences again with a zone the installed tz database "
                                     "holds") from None
        if result.refusal is not None:
            return result
        # after the commit, through the core's publish path (its logger names a failure)
        publish_committed(self.publisher, list(result.outbound), LIVE)
        return result
