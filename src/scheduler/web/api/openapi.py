"""The OpenAPI document, derived from the pydantic models and the mounted routes."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute, Route

from scheduler.web.http.answers import (
    BulkItemOut,
    CancelConflictOut,
    DeferredOut,
    DeliveryOut,
    DuplicateOut,
    ErrorOut,
    FactsContractErrorOut,
    HealthOut,
    HistoryEntryOut,
    InboxNotificationOut,
    InboxPageOut,
    InboxSessionOut,
    IngestOut,
    NotificationOut,
    OperatorActionOut,
    PreferencesOut,
    PushSubscriptionOut,
    PushUnsubscribedOut,
    ReplicaOut,
    RuleRefusalOut,
    ScheduledEventOut,
    SchedulerHealthDetailOut,
    SchedulerHealthOut,
    ValidationErrorOut,
    WebSessionOut,
)
from scheduler.web.http.bodies import (
    InboxSignInIn,
    LiveEventIn,
    PreferencesIn,
    PushSubscriptionIn,
    PushUnsubscribeIn,
    ScheduledEventIn,
)
from scheduler.web.http.params import STREAM_ID_DIGITS, declared

if TYPE_CHECKING:
    from scheduler.nudging.facts import FactsContract

MODELS: tuple[type[BaseModel], ...] = (
    ScheduledEventIn, LiveEventIn, PreferencesIn, ScheduledEventOut, NotificationOut,
    IngestOut, DuplicateOut, PreferencesOut, SchedulerHealthOut, HealthOut, ErrorOut,
    ValidationErrorOut, FactsContractErrorOut, RuleRefusalOut, ReplicaOut, OperatorActionOut,
    HistoryEntryOut, CancelConflictOut, InboxNotificationOut, InboxPageOut, SchedulerHealthDetailOut,
    WebSessionOut, InboxSignInIn, InboxSessionOut, BulkItemOut, DeferredOut, DeliveryOut,
    PushSubscriptionIn, PushSubscriptionOut, PushUnsubscribeIn, PushUnsubscribedOut,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel] | None, description: str, many: bool = False) -> dict[str, Any]:
    if model is None:
        return {"description": description}
    schema: dict[str, Any] = {"type": "array", "items": _ref(model)} if many else _ref(model)
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _one_of(models: tuple[type[BaseModel], ...], description: str) -> dict[str, Any]:
    schema = {"anyOf": [_ref(m) for m in models]}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# A list paged by keyset: the body stays a plain list; the next page is named in headers.
PAGE_HEADERS = {
    "X-Next-Cursor": {"description": "the cursor of the next page; absent on the last page",
                      "schema": {"type": "string"}},
    "Link": {"description": 'the next page\'s URL, rel="next" (RFC 8288); absent on the last page',
             "schema": {"type": "string"}},
}

ERRORS = {
    "401": _json(ErrorOut, "missing, expired, malformed or invalid bearer token"),
    "403": _json(ErrorOut, "the token lacks the permission this route needs"),
    "422": _json(ValidationErrorOut, "malformed parameters or body; errors names each field"),
    "503": _json(ErrorOut, "the database is unavailable"),
}
# An open route needs no token, but one that is sent must be well formed and valid.
BAD_TOKEN = {"401": _json(ErrorOut, "an Authorization header was sent and it is malformed or its token invalid")}
TOO_LARGE = {"413": _json(ErrorOut, "body larger than SCHEDULER_MAX_BODY_BYTES")}
MISSING_FACTS = ("REQ-0063: facts absent, null or empty ({detail: 'Missing facts in ...'}), or without facts_version "
                 "and scenario as non-empty strings ({detail: {error: invalid_facts_contract, errors}}); "
                 "any other malformed body names its fields")

# (path, method) -> operation; the request and response schemas come from the models.
OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("/health", "get"): {"summary": "Liveness", "responses": {"200": _json(HealthOut, "alive"), **BAD_TOKEN}},
    ("/health/scheduler", "get"): {
        "summary": "Is the polling loop healthy, and why (no error text: that is /admin/health/scheduler)",
        "responses": {
            "200": _json(SchedulerHealthOut, "state running: the loop runs and polled recently; or degraded: it "
                                             "does, and an outbox delivery has been due and unsent for longer "
                                             "than SCHEDULER_DELIVERY_STALE_SECONDS"),
            "503": _json(SchedulerHealthOut, "state stopped (the loop task exited or never started), failing "
                                             "(its last poll failed: a database outage) or stale (no poll "
                                             "completed in three intervals); reason says which in words"),
            **BAD_TOKEN,
        },
    },
    ("/admin/health/scheduler", "get"): {
        "summary": "The loop's health with the last poll's error (permission: admin)",
        "responses": {
            **ERRORS,
            "200": _json(SchedulerHealthDetailOut, "state running, or degraded (an outbox delivery due and unsent "
                                                   "past SCHEDULER_DELIVERY_STALE_SECONDS)"),
            "503": _json(SchedulerHealthDetailOut, "state stopped, failing or stale; last_error is the last "
                                                   "failed poll's error"),
        },
    },
    ("/admin/scheduled-events", "post"): {
        "summary": "Store an event to dispatch later (permission: ingest)",
        "request": ScheduledEventIn,
        "responses": {"201": _json(ScheduledEventOut, "stored (or, for a known external_key, rewritten and reset)"),
                      **TOO_LARGE, **ERRORS,
                      "422": _one_of((ValidationErrorOut, ErrorOut, FactsContractErrorOut), MISSING_FACTS)},
    },
    ("/admin/scheduled-events/bulk", "post"): {
        "summary": "Store many events to dispatch later, each judged as a single POST; the valid ones in one "
                   "transaction (permission: ingest)",
        "request": ScheduledEventIn,
        "request_many": True,
        "responses": {"200": _json(BulkItemOut, "one result per item, in the order sent: 201 with the row "
                                                 "(rewritten: an existing key's row, reset), or 422 with the body "
                                                 "a single POST of it would get (also: larger than "
                                                 "SCHEDULER_MAX_BODY_BYTES; an external_key an earlier item gave)",
                                   many=True),
                      "413": _json(ErrorOut, "body larger than SCHEDULER_BULK_MAX_BODY_BYTES, or more items than "
                                             "SCHEDULER_BULK_MAX_EVENTS"),
                      **ERRORS,
                      "422": _json(ValidationErrorOut, "the body is not JSON, or not a JSON array")},
    },
    ("/admin/scheduled-events", "get"): {
        "summary": "List scheduled events by the one query model, newest change first, a page at a time "
                   "(permission: admin)",
        "responses": {"200": {**_json(ScheduledEventOut, "rows, newest change first (then by id)", many=True),
                              "headers": PAGE_HEADERS}, **ERRORS},
    },
    ("/admin/scheduled-events/{event_id}", "get"): {
        "summary": "One scheduled event (permission: admin)",
        "responses": {"200": _json(ScheduledEventOut, "the row"), "404": _json(ErrorOut, "no such row"), **ERRORS},
    },
    ("/admin/scheduled-events/{event_id}/reset", "post"): {
        "summary": "Reset a row by hand to pending (permission: admin)",
        "responses": {"200": _json(ScheduledEventOut, "the reset row"), "404": _json(ErrorOut, "no such row"),
                      **ERRORS},
    },
    ("/admin/ingest-event", "post"): {
        "summary": "Send a live event through the engine and orchestrator (permission: ingest)",
        "request": LiveEventIn,
        "responses": {
            "200": _json(IngestOut, "delivered on at least one channel"),
            "202": _one_of((IngestOut, DeferredOut), "created, but every delivery suppressed; or deferred: the "
                            "participant is in quiet hours, and the event is stored as a scheduled row "
                            "due at not_before"),
            "204": {"description": "no rule triggered"},
            "400": _json(RuleRefusalOut, "no enabled rule claims the scenario at that frequency"),
            "409": _one_of((DuplicateOut, ErrorOut), "every rule that would have fired was a duplicate; or "
                           "the participant's stored time_zone no longer loads (set their preferences again)"),
            **TOO_LARGE,
            **ERRORS,
            "422": _one_of(
                (ValidationErrorOut, ErrorOut, FactsContractErrorOut, RuleRefusalOut),
                MISSING_FACTS + "; or the rule engine refuses the event ({detail: {error, detail}}: "
                "an unusable time scope, facts a rule requires, a template variable the facts lack)",
            ),
        },
    },
    ("/admin/notifications", "get"): {
        "summary": "Participants' notifications with status and reason (permission: admin)",
        "responses": {"200": _json(NotificationOut, "notifications, newest first", many=True), **ERRORS},
    },
    ("/admin/deliveries", "get"): {
        "summary": "The delivery log and the outbox, each attempt's record with it, newest first (permission: admin)",
        "responses": {"200": _json(DeliveryOut, "deliveries, newest first", many=True), **ERRORS},
    },
    ("/admin/deliveries/{delivery_id}/retry", "post"): {
        "summary": "Queue a retrying or undeliverable delivery again, now, its attempts counted afresh; audited "
                   "(permission: admin)",
        "responses": {"200": _json(DeliveryOut, "the delivery, queued again"),
                      "404": _json(ErrorOut, "no such delivery"),
                      "409": _json(ErrorOut, "not retryable: queued, delivered, an in-app row, or being sent now"),
                      **ERRORS},
    },
    ("/admin/participants/{user_id}/preferences", "put"): {
        "summary": "Set a participant's enabled kinds, daily cap, time zone and quiet hours (permission: admin)",
        "request": PreferencesIn,
        "responses": {"200": _json(PreferencesOut, "the stored preferences"), **TOO_LARGE, **ERRORS},
    },
    ("/admin/participants/{user_id}/preferences", "get"): {
        "summary": "A participant's preferences, the defaults when none were set (permission: admin)",
        "responses": {"200": _json(PreferencesOut, "the preferences"), **ERRORS},
    },
    # Metrics and the operator API (the console's HTML pages are not API operations).
    ("/metrics", "get"): {
        "summary": "Prometheus metrics (open unless SCHEDULER_METRICS_REQUIRE_ADMIN)",
        "responses": {"200": {"description": "the Prometheus text format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}, **BAD_TOKEN},
    },
    ("/admin/replicas", "get"): {
        "summary": "Every replica's heartbeat, stale or not (permission: admin)",
        "responses": {"200": _json(ReplicaOut, "replicas, by name", many=True), **ERRORS},
    },
    ("/admin/audit", "get"): {
        "summary": "The operators' audit trail, newest first (permission: admin)",
        "responses": {"200": _json(OperatorActionOut, "operator actions", many=True), **ERRORS},
    },
}

_CANCEL = {
    "200": _json(ScheduledEventOut, "the row, cancelled (or already cancelled: the same row)"),
    "404": _json(ErrorOut, "no such row"),
    "409": _json(CancelConflictOut, "the row was already dispatched; it stays dispatched"),
    **ERRORS,
}
# Cancel, history, the participant's inbox.
OPERATIONS.update({
    ("/admin/scheduled-events/{event_id}", "delete"): {
        "summary": "Cancel a pending or failed row (permission: ingest)", "responses": _CANCEL,
    },
    ("/admin/scheduled-events/by-key/{external_key}", "delete"): {
        "summary": "Cancel the row of an external key (permission: ingest)", "responses": _CANCEL,
    },
    ("/admin/scheduled-events/{event_id}/history", "get"): {
        "summary": "Every change of a row, oldest first (permission: admin)",
        "responses": {"200": _json(HistoryEntryOut, "the changes", many=True),
                      "404": _json(ErrorOut, "no such row"), **ERRORS},
    },
    ("/me/notifications", "get"): {
        "summary": "The caller's own delivered notifications, newest first (any valid token; admin may pass user_id)",
        "responses": {"200": _json(InboxPageOut, "one page, newest first"), **ERRORS},
    },
    ("/me/notifications/stream", "get"): {
        "summary": "Server-sent events: the caller's notifications as they are delivered by any replica",
        "headers": {"Last-Event-ID": {"type": "integer", "minimum": 0, "maximum": 10**STREAM_ID_DIGITS - 1}},
        "responses": {
            "200": {"description": "text/event-stream: `id:` the stream number, `event: notification`, "
                                   "`data:` an InboxNotificationOut; comment heartbeats. Send Last-Event-ID "
                                   "(or ?after=) to replay what was missed.",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}},
            **ERRORS,
        },
    },
    ("/inbox", "get"): {
        "summary": "The participant's inbox page (signs in with a participant token, shows the stream)",
        "responses": {"200": {"description": "an HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}},
    },
})

# Sessions of the console and the inbox page.
OPERATIONS.update({
    ("/admin/sessions", "get"): {
        "summary": "The open browser sessions (console and inbox), most recently seen first (permission: admin)",
        "responses": {"200": _json(WebSessionOut, "open sessions", many=True), **ERRORS},
    },
    ("/admin/sessions/{session_id}", "delete"): {
        "summary": "End a session now: every replica refuses its cookie from the next request (permission: admin)",
        "responses": {"200": _json(WebSessionOut, "the session, ended"),
                      "404": _json(ErrorOut, "no session with that id (never, or already ended)"), **ERRORS},
    },
    ("/inbox/session", "post"): {
        "summary": "The inbox page signs in: a valid token opens a participant session; the answer sets its "
                   "HttpOnly cookie (scheduler_inbox), which the routes under /me accept",
        "request": InboxSignInIn,
        "responses": {
            "201": _json(InboxSessionOut, "signed in: the cookie holds the session's id, never the token"),
            "401": _json(ErrorOut, "the token is malformed, expired or not valid here"),
            "413": TOO_LARGE["413"],
            "415": _json(ErrorOut, "the body is not sent as application/json"),
            "422": _json(ValidationErrorOut, "malformed body; errors names each field"),
            "503": ERRORS["503"],
        },
    },
    ("/inbox/session", "get"): {
        "summary": "The inbox page's open session (by its cookie), with its CSRF token",
        "responses": {"200": _json(InboxSessionOut, "the open session"),
                      "401": _json(ErrorOut, "no open session: no cookie, or signed out, ended or expired"),
                      "503": ERRORS["503"]},
    },
    ("/inbox/session", "delete"): {
        "summary": "Sign out of the inbox page (header X-CSRF-Token): every replica refuses the cookie from now on",
        "responses": {"204": {"description": "signed out; the cookie is cleared"},
                      "401": _json(ErrorOut, "no open session"),
                      "403": _json(ErrorOut, "missing or wrong X-CSRF-Token"),
                      "503": ERRORS["503"]},
    },
})


# A participant's web-push subscriptions and the inbox page's service worker (PUSH-*).
_CSRF = {"X-CSRF-Token": {"type": "string", "description": "with the inbox page's session cookie only"}}
OPERATIONS.update({
    ("/me/push-subscriptions", "put"): {
        "summary": "Store the caller's browser push subscription (the W3C PushSubscription JSON) by its endpoint; "
                   "each notification sent to the caller is then pushed to it (any valid token, or the inbox "
                   "page's cookie with X-CSRF-Token)",
        "request": PushSubscriptionIn,
        "headers": _CSRF,
        "responses": {
            **ERRORS,
            **TOO_LARGE,
            "201": _json(PushSubscriptionOut, "stored, new"),
            "200": _json(PushSubscriptionOut, "stored: the same endpoint's keys and expiry replaced"),
            "403": _json(ErrorOut, "by the cookie, without its X-CSRF-Token"),
            "409": _json(ErrorOut, "web push is off on this service (no VAPID key)"),
            "415": _json(ErrorOut, "the body is not sent as application/json"),
            "422": _json(ValidationErrorOut, "not exactly a PushSubscription, or an endpoint on no allowed push "
                                             "service host; errors names each field (endpoint, keys.p256dh, ...)"),
        },
    },
    ("/me/push-subscriptions", "delete"): {
        "summary": "Remove the caller's push subscription of the body's endpoint, or every one of theirs without a "
                   "body (any valid token, or the inbox page's cookie with X-CSRF-Token)",
        "request": PushUnsubscribeIn,
        "request_optional": True,
        "headers": _CSRF,
        "responses": {
            **ERRORS,
            **TOO_LARGE,
            "200": _json(PushUnsubscribedOut, "how many were removed"),
            "403": _json(ErrorOut, "by the cookie, without its X-CSRF-Token"),
            "415": _json(ErrorOut, "a body not sent as application/json"),
        },
    },
    ("/inbox/service-worker.js", "get"): {
        "summary": "The inbox page's service worker: shows each web push as a notification",
        "responses": {"200": {"description": "JavaScript",
                              "content": {"text/javascript": {"schema": {"type": "string"}}}}},
    },
})


# The bodies whose ``facts`` a host's own facts contract judges (DEC-FACTS-CONTRACT).
FACTS_BODIES = ("ScheduledEventIn", "LiveEventIn")
HOST_FACTS_REFUSED = ("facts refused by the service's facts contract ({detail, errors: [{field, message}]}, "
                      "a field of the contract's named facts.<path>), or any other malformed body, each field named")


def _host_facts(contract: FactsContract, schemas: dict[str, Any], ref: dict[str, Any] | None) -> None:
    """``facts`` of the bodies as the host's contract says: its model's schema (``ref``), or an
    object judged by its callable (named, with the first line of its docstring). Absent facts
    are given to the contract as an empty object, so the contract, not the schema, requires them."""
    name = getattr(contract, "__qualname__", type(contract).__qualname__)
    doc = (inspect.getdoc(contract) or "").strip().splitlines()
    said = f": {doc[0]}" if doc else ""
    if ref is not None:
        facts: dict[str, Any] = {**ref, "description": f"Validated by the service's facts contract, {name}{said}"}
    else:
        facts = {"type": "object", "description": f"Judged by the service's facts contract, {name}{said} "
                                                  "(an object; a refusal names facts)"}
    for body in FACTS_BODIES:
        schema = schemas.get(body)
        if schema is None:
            continue
        schema["properties"]["facts"] = facts
        schema["required"] = [field for field in schema.get("required", []) if field != "facts"]


def _contract_model(contract: FactsContract | None) -> type[BaseModel] | None:
    return contract if isinstance(contract, type) and issubclass(contract, BaseModel) else None


def openapi_document(routes: Sequence[BaseRoute], root_path: str = "",
                     facts_contract: FactsContract | None = None) -> dict[str, Any]:
    """OpenAPI 3.1 for the routes actually mounted (an undocumented route is an error).

    ``root_path`` is where the app is mounted (the ASGI ``root_path``): it becomes the
    ``servers`` entry, so the paths stay relative to the app and clients call the right URLs.
    ``facts_contract``, the service's own (DEC-FACTS-CONTRACT), is what the bodies' ``facts``
    are described by (a pydantic model's JSON schema among the components, or an object judged
    by a callable) instead of the built-in contract, and the facts 422s say so.
    """
    model = _contract_model(facts_contract)
    refs, definitions = models_json_schema(
        [(m, "validation" if m.__name__.endswith("In") else "serialization") for m in MODELS]
        + ([(model, "validation")] if model is not None else []),
        ref_template="#/components/schemas/{model}",
    )
    if facts_contract is not None:
        ref = dict(refs[(model, "validation")]) if model is not None else None
        _host_facts(facts_contract, definitions.setdefault("$defs", {}), ref)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route) or not route.include_in_schema:
            continue
        for method in sorted((route.methods or set()) - {"HEAD"}):
            key = (route.path_format, method.lower())
            if key not in OPERATIONS:
                raise KeyError(f"route {method} {route.path_format} has no OpenAPI description")
            spec = dict(OPERATIONS[key])
            operation: dict[str, Any] = {"summary": spec["summary"], "responses": spec["responses"]}
            if facts_contract is not None and "request" in spec and spec["request"].__name__ in FACTS_BODIES:
                responses = copy.deepcopy(spec["responses"])  # OPERATIONS is shared: never changed
                responses["422"]["description"] = HOST_FACTS_REFUSED + (
                    "; or the dispatcher refuses the live event" if key[0] == "/admin/ingest-event" else "")
                operation["responses"] = responses
            params = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in route.param_convertors
            ]
            # Query parameters from the endpoint's own declaration (scheduler.web.http.params):
            # what is validated is what is documented. Any other parameter is a 422.
            params += [
                {"name": name, "in": "query", "required": False, "schema": param.schema,
                 **({"description": param.description} if param.description else {})}
                for name, param in (declared(route.endpoint) or {}).items()
            ]
            params += [
                {"name": name, "in": "header", "required": False, "schema": schema}
                for name, schema in spec.get("headers", {}).items()
            ]
            if params:
                operation["parameters"] = params
            if "request" in spec:
                body_schema: dict[str, Any] = _ref(spec["request"])
                if spec.get("request_many"):
                    body_schema = {"type": "array", "items": body_schema}
                operation["requestBody"] = {
                    "required": not spec.get("request_optional"),
                    "content": {"application/json": {"schema": body_schema}},
                }
            if route.path_format.startswith(("/admin", "/me")):
                operation["security"] = [{"bearer": []}]
            paths.setdefault(route.path_format, {})[method.lower()] = operation
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "scheduler", "version": "0.1.0",
                 "description": "Scheduled events for the nudging platform (REQ-0063 to REQ-0067)."},
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
    }
    if root_path.rstrip("/"):
        document["servers"] = [{"url": root_path.rstrip("/")}]
    return document


def merged_document(host: dict[str, Any], ours: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A host's OpenAPI 3.1 document with ``ours`` (the mounted parts' document) merged in: our
    paths under ``prefix`` (where the host mounts them), our component schemas and security
    scheme beside its own. The host's document is not changed; a path, schema or security scheme
    both define differently is a ``ValueError`` naming it (never one silently replacing the other)."""
    if not str(host.get("openapi", "")).startswith("3.1"):
        raise ValueError(f"the host's OpenAPI document is version {host.get('openapi')!r}; the scheduler's "
                         "paths can be merged into an OpenAPI 3.1 document only")
    merged = {**host, "paths": dict(host.get("paths") or {}),
              "components": {name: dict(section) for name, section in (host.get("components") or {}).items()}}
    base = prefix.rstrip("/")
    for path, operations in ours["paths"].items():
        full = base + path
        if full in merged["paths"]:
            raise ValueError(f"the host's OpenAPI document already has the path {full}, which the scheduler "
                             f"mounted at {base or '/'} serves")
        merged["paths"][full] = operations
    for section, entries in ours["components"].items():
        into = merged["components"].setdefault(section, {})
        for name, entry in entries.items():
            if name in into and into[name] != entry:
                raise ValueError(f"the host's OpenAPI document defines components.{section}.{name} otherwise "
                                 "than the scheduler's: rename the host's")
            into[name] = entry
    return merged
