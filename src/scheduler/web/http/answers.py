"""What the service answers: the response models, the JSON answer built from one, and the
error shapes. Every answer is built from one of these (``respond``), so ``/openapi.json``
describes exactly what is sent. Times keep Python's ISO 8601 form (``+00:00``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer
from starlette.responses import JSONResponse

from scheduler.types import (
    DeliveryRowStatus,
    DispatchOutcome,
    EventStatus,
    NotificationStatus,
    SchedulerMode,
)


def respond(model: BaseModel | Sequence[BaseModel], status_code: int = 200) -> JSONResponse:
    """The JSON answer built from its response model (or a list of them). Optional fields
    the handler did not set are left out rather than sent as null."""
    if isinstance(model, BaseModel):
        return JSONResponse(model.model_dump(mode="json", exclude_unset=True), status_code=status_code)
    return JSONResponse([item.model_dump(mode="json", exclude_unset=True) for item in model], status_code=status_code)


Timestamp = Annotated[datetime, PlainSerializer(lambda value: value.isoformat(), return_type=str, when_used="json")]


class _Out(BaseModel):
    # The published schema forbids extra properties; validation merely drops them.
    model_config = ConfigDict(json_schema_extra={"additionalProperties": False})


class ScheduledEventOut(_Out):
    id: str
    event_type: str
    user_id: str
    community_id: str | None
    external_key: str | None
    trigger_at: Timestamp
    expires_at: Timestamp | None = Field(
        description="claimed after this instant, the row ends expired instead of dispatched; null: never expires")
    facts: dict[str, Any]
    status: EventStatus
    last_error: str | None
    created_at: Timestamp
    updated_at: Timestamp
    dispatched_at: Timestamp | None
    not_before: Timestamp | None = Field(
        default=None, description="held in its participant's quiet hours until this instant (UTC); null: not held")


class NotificationOut(_Out):
    id: str
    user_id: str
    community_id: str | None
    rule_id: str
    kind: str
    scenario: str
    time_scope: str
    dedup_key: str
    title: str
    body: str
    status: NotificationStatus
    reason: str | None
    source: Literal["live", "scheduled"]
    scheduled_event_id: str | None
    created_at: Timestamp


class DeliveryOut(_Out):
    """One row of ``deliveries``: the in-app log's, or an outbox row with its attempts' record."""

    id: int
    notification_id: str
    user_id: str
    channel: str
    status: DeliveryRowStatus
    detail: str | None
    created_at: Timestamp
    idempotency_key: str | None
    attempts: int
    next_attempt_at: Timestamp | None
    lease_until: Timestamp | None
    last_error: str | None
    delivered_at: Timestamp | None
    provider_status: int | None
    provider_answer: str | None
    updated_at: Timestamp | None


class IngestOut(_Out):
    """A live event's answer: what the dispatch path decided and the notifications it made."""

    outcome: DispatchOutcome
    notifications: list[NotificationOut]


class DeferredOut(_Out):
    """202 ``deferred``: the participant is in quiet hours; the event is stored as a scheduled
    row due when they end (QUIET-7)."""

    outcome: DispatchOutcome
    scheduled_event_id: str
    not_before: Timestamp


class DuplicateOut(IngestOut):
    """409: every rule that would have fired already notified for this period."""

    detail: str


class QuietHoursOut(_Out):
    start: str = Field(description="HH:MM, local")
    end: str = Field(description="HH:MM, local; before start: the next day")


class PreferencesOut(_Out):
    user_id: str
    enabled_kinds: list[str] | None
    max_per_day: int
    time_zone: str = Field(description="an IANA name; UTC when none was set")
    quiet_hours: QuietHoursOut | None
    updated_at: Timestamp | None = Field(description="null: never set (the defaults)")


class WakeupsOut(_Out):
    """How the loop is woken: on its interval (literal), by LISTEN, or by timed wake-ups."""

    by: Literal["interval", "listen", "timer"]
    reason: str | None = None
    next_wake_at: Timestamp | None = None


class ClockOut(_Out):
    """How this replica tells time: the database's clock as measured (production), or the
    clock a test or an embedding app injected (DEC-10)."""

    source: Literal["database", "injected"]
    synced: bool | None = Field(description="whether the database's time has been read yet (null: injected)")
    offset_seconds: float | None = Field(description="the database's clock minus this host's, at the last sync")
    round_trip_seconds: float | None = Field(description="how long the last reading took (the clock's bound on lag)")
    synced_at: Timestamp | None


class SchedulerHealthOut(_Out):
    """``GET /health/scheduler`` (open): is the loop healthy and why, without error text."""

    status: Literal["healthy", "degraded", "unhealthy"]
    state: Literal["running", "degraded", "stale", "failing", "stopped"]
    reason: str
    running: bool
    started_at: Timestamp | None
    last_poll_at: Timestamp | None
    last_error_at: Timestamp | None
    polls: int
    dispatched: int
    failed: int
    expired: int = Field(description="rows this replica's claims ended expired (claimed after their expires_at)")
    consecutive_failures: int
    skipped_busy: int
    stale: bool
    poll_seconds: float
    mode: SchedulerMode
    wakeups: WakeupsOut
    clock: ClockOut
    oldest_due_delivery_seconds: float | None = Field(
        None, description="how long the outbox's longest-due delivery has waited (0 when none is due; null when "
                          "unreadable); past SCHEDULER_DELIVERY_STALE_SECONDS the state is degraded")


class SchedulerHealthDetailOut(SchedulerHealthOut):
    """``GET /admin/health/scheduler`` (admin): the same, with the last poll's error."""

    last_error: str | None


class ReplicaOut(_Out):
    """One replica's heartbeat (``GET /admin/replicas``)."""

    replica_id: str
    name: str
    host: str
    pid: int
    mode: SchedulerMode
    poll_seconds: float
    started_at: Timestamp
    last_poll_at: Timestamp | None
    seen_at: Timestamp
    last_error: str | None
    consecutive_failures: int
    polls: int = Field(description="polls of this replica that completed (`/metrics` counts every poll "
                                   "and the failed ones apart)")
    dispatched: int
    failed: int
    expired: int = Field(description="events its claims ended expired (EXP-2)")
    stale: bool = Field(description="silent for three of its poll intervals")
    state: Literal["ok", "failing", "stale"]


class OperatorActionOut(_Out):
    """One entry of the operators' audit trail (``GET /admin/audit``)."""

    id: int
    at: Timestamp
    actor: str
    source: str
    action: str
    event_id: str | None
    filter: dict[str, Any] | None
    count: int
    reason: str | None


class WebSessionOut(_Out):
    """A signed-in browser (``GET /admin/sessions``); ``id`` names it, its secret is never shown."""

    id: str
    subject: str = Field(description="the token's sub at sign-in")
    kind: Literal["admin", "participant"] = Field(description="admin: the console; participant: the inbox page")
    created_at: Timestamp
    expires_at: Timestamp = Field(description="the absolute end: the token's exp or SCHEDULER_SESSION_MAX_SECONDS")
    last_seen_at: Timestamp
    idle_seconds: int = Field(description="the session ends when unused this long (SCHEDULER_SESSION_IDLE_SECONDS)")
    ends_at: Timestamp = Field(description="when it ends if unused from now: min(expires_at, last_seen_at + idle)")
    user_agent: str | None


class InboxSessionOut(_Out):
    """The inbox page's session (``/inbox/session``): whose it is, when it ends, its CSRF token."""

    subject: str
    expires_at: Timestamp
    idle_seconds: int
    csrf: str = Field(description="send as X-CSRF-Token to sign out")


class HealthOut(_Out):
    status: Literal["ok"]


# -- errors -------------------------------------------------------------------------------
# Every 4xx and 5xx is a JSON object with ``detail``. 422s name the offending fields
# (``ValidationErrorOut``) except the two shapes REQ-0063 documents for the facts
# contract; a live event the rules refuse keeps REQ-0016's ``{error, detail}``.


class ErrorOut(_Out):
    """401, 403, 404, 413, 500, 503, and REQ-0063's "Missing facts in ..." 422."""

    detail: str


class FieldErrorOut(_Out):
    field: str = Field(description="The offending field as a dotted path (``body`` for the body as a whole).")
    message: str


class ValidationErrorOut(_Out):
    """422: a malformed body, parameter or value; ``errors`` names each field."""

    detail: str
    errors: list[FieldErrorOut] = Field(min_length=1)


class FactsContractDetail(_Out):
    error: Literal["invalid_facts_contract"]
    errors: list[FieldErrorOut] = Field(min_length=1)


class FactsContractErrorOut(_Out):
    """422 (REQ-0063): facts present but without facts_version or scenario as non-empty strings."""

    detail: FactsContractDetail


class RuleRefusalDetail(_Out):
    error: str = Field(
        description="The rule engine's reason, e.g. no_rule_for_scenario, missing_or_invalid_time_scope.")
    detail: Any = None


class RuleRefusalOut(_Out):
    """400 or 422 from the live path (REQ-0016): the rule engine refused the event."""

    detail: RuleRefusalDetail


class HistoryEntryOut(_Out):
    """One change of a scheduled event (``GET /admin/scheduled-events/{id}/history``)."""

    id: int
    event_id: str
    at: Timestamp = Field(description="the row's updated_at after the change (the service's clock)")
    change: Literal["stored", "rewritten", "dispatched", "failed", "reset", "cancelled", "expired", "pending",
                    "updated"]
    actor: str | None = Field(description="the token's subject; null for the polling loop")
    status: EventStatus
    changes: dict[str, list[Any]] = Field(description="column -> [before, after], for each column that changed")


class CancelConflictOut(_Out):
    detail: str
    event: ScheduledEventOut


class BulkItemOut(_Out):
    """One item of ``POST /admin/scheduled-events/bulk``'s answer, in the order sent (BATCH-2)."""

    index: int = Field(ge=0, description="the item's position in the array sent (from 0)")
    status: Literal[201, 422] = Field(
        description="201: stored (event); 422: refused (error), as a single POST would be")
    rewritten: bool | None = Field(
        default=None, description="201 only: true when an existing key's row was rewritten and reset")
    event: ScheduledEventOut | None = Field(default=None, description="201 only: the stored row")
    error: ValidationErrorOut | ErrorOut | FactsContractErrorOut | None = Field(
        default=None, description="422 only: the body a single POST of this item would have been answered")


class InboxNotificationOut(_Out):
    """A notification as its participant sees it."""

    id: str
    user_id: str
    community_id: str | None
    rule_id: str
    kind: str
    scenario: str
    time_scope: str
    title: str
    body: str
    source: Literal["live", "scheduled"]
    scheduled_event_id: str | None
    created_at: Timestamp
    stream_seq: int | None = Field(description="its SSE event id once streamed (null: never streamed)")


class InboxPageOut(_Out):
    items: list[InboxNotificationOut]
    next: str | None = Field(description="pass as ?before= for the next (older) page; null at the end")


class HTTPRefusal(Exception):
    """The request is refused with a documented ``detail`` of its own shape: REQ-0063's
    facts-contract 422s. (Other 422s are ``Unprocessable``.)"""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


# -- web push (PUSH-*): what PUT/DELETE /me/push-subscriptions answer ------------------------


class PushSubscriptionOut(_Out):
    """A stored push subscription (never its keys)."""

    id: int
    endpoint: str
    expiration_time: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp
    evicted: int = Field(description="how many of the caller's oldest subscriptions were removed to keep the limit")


class PushUnsubscribedOut(_Out):
    removed: int = Field(description="how many of the caller's subscriptions were removed")
