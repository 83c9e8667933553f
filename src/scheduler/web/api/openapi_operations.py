"""The documented operations of the API, route by route: each one's summary, request, parameters and
answers, with the models they name (``scheduler.web.api.openapi`` builds the document from them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

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
from scheduler.web.http.params import STREAM_ID_DIGITS

if TYPE_CHECKING:
    pass

MODELS: tuple[type[BaseModel], ...] = (
    ScheduledEventIn, LiveEventIn, PreferencesIn, ScheduledEventOut, NotificationOut,
    IngestOut, DuplicateOut, PreferencesOut, SchedulerHealthOut, HealthOut, ErrorOut,
    ValidationErrorOut, FactsContractErrorOut, RuleRefusalOut, ReplicaOut, OperatorActionOut,
    HistoryEntryOut, CancelConflictOut, InboxNotificationOut, InboxPageOut, SchedulerHealthDetailOut,
    WebSessionOut, InboxSignInIn, InboxSessionOut, BulkItemOut, DeferredOut, DeliveryOut,
    PushSubscriptionIn, PushSubscriptionOut, PushUnsubscribeIn, PushUnsubscribedOut,
)


def model_ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel] | None, description: str, many: bool = False) -> dict[str, Any]:
    if model is None:
        return {"description": description}
    schema: dict[str, Any] = {"type": "array", "items": model_ref(model)} if many else model_ref(model)
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _one_of(models: tuple[type[BaseModel], ...], description: str) -> dict[str, Any]:
    schema = {"anyOf": [model_ref(m) for m in models]}
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
