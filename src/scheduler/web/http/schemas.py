"""Request and response bodies (pydantic v2). The OpenAPI document is derived from these."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    field_validator,
)

from scheduler.core.trigger_range import (
    OFFSET_TEXT,
    RANGE_TEXT,
    TriggerOutOfRange,
    check_trigger_at,
)
from scheduler.types import (
    DeliveryRowStatus,
    DispatchOutcome,
    EventStatus,
    NotificationStatus,
    SchedulerMode,
)

# An ISO 8601 (RFC 3339) date and time with its offset, in ASCII digits.
_INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?([Zz]|[+-][0-9]{2}:?[0-9]{2})")

MAX_DEPTH = 32
MAX_STRING = 200
Name = Field(min_length=1, max_length=MAX_STRING)


def _check_json(value: Any, depth: int = 0, at: str = "facts") -> None:
    """What PostgreSQL's jsonb refuses, refused here naming where (``at``): a NUL character or
    an unpaired surrogate in a string or a key, a number that is not finite (``1e400`` reads as
    infinity; jsonb has no infinity, and NaN and Infinity are not JSON). Deep nesting is an
    attack, not data."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        _located(check_text, value, at)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{at} is a number too large to store (a JSON number beyond \u00b11.8e308, such as "
                             "1e400, which reads as infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _located(check_text, key, f"a key of {at}")
            _check_json(item, depth + 1, f"{at}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, depth + 1, f"{at}[{index}]")


def _located(check: Callable[[str], None], value: str, at: str) -> None:
    """``check(value)``, its refusal saying where the value is."""
    try:
        check(value)
    except ValueError as exc:
        raise ValueError(f"{at} {exc}") from None


def check_text(value: str) -> None:
    """Text PostgreSQL can store: no NUL, and valid Unicode (no unpaired surrogate)."""
    if "\x00" in value:
        raise ValueError("contains a NUL character (\\u0000), which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains an unpaired surrogate (\\ud800-\\udfff), which is not valid Unicode") from None


def _no_nul(value: str | None) -> str | None:
    if value is not None:
        check_text(value)
    return value


def _facts_required(schema: dict[str, Any]) -> None:
    """The published schema says what the server does: ``facts`` is required, an object
    with ``facts_version`` and ``scenario`` as non-blank strings (REQ-0063). The model
    itself lets a missing ``facts`` through, so that the route can answer REQ-0063's own
    422 ("Missing facts in ...") instead of a generic validation error."""
    schema["required"] = sorted({*schema.get("required", []), "facts"})
    contract = {"type": "string", "pattern": "\\S"}
    schema["properties"]["facts"] = {
        "type": "object",
        "minProperties": 1,
        "required": ["facts_version", "scenario"],
        "properties": {"facts_version": contract, "scenario": contract},
        "description": "Must carry facts_version and scenario as non-blank strings; what jsonb cannot hold "
                       "is refused naming facts (a number that is not finite such as 1e400, NUL or an unpaired "
                       "surrogate in a string or key, nesting deeper than 32 levels).",
    }


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    @field_validator("facts", mode="after", check_fields=False)
    @classmethod
    def _facts_storable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            _check_json(value)
        return value

    @field_validator("event_type", "user_id", "community_id", "external_key", mode="after", check_fields=False)
    @classmethod
    def _strings_storable(cls, value: str | None) -> str | None:
        return _no_nul(value)


class ScheduledEventIn(_Body):
    """``POST /admin/scheduled-events``: an event to dispatch at ``trigger_at``."""

    model_config = ConfigDict(json_schema_extra=_facts_required)

    event_type: str = Name
    user_id: str = Name
    community_id: str | None = Field(default=None, max_length=MAX_STRING)
    external_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_STRING,
        description="Opt-in idempotence: posting the same key again rewrites and resets that row.",
    )
    trigger_at: AwareDatetime = Field(
        description=f"An ISO 8601 instant with its offset (a string), from {RANGE_TEXT}, the offset "
                    f"{OFFSET_TEXT}; a naive time, a number (Unix time) or a time outside that range is refused.")
    expires_at: AwareDatetime | None = Field(
        default=None,
        description="Optional: an ISO 8601 instant with its offset, after trigger_at and in the same range. "
                    "Claimed after it (by the service's clock), the event is not dispatched: it ends expired. "
                    "Absent: the service's default window from trigger_at, if one is set, else never.")
    facts: dict[str, Any] | None = Field(
        default=None, description="Must carry facts_version and scenario as non-empty strings."
    )

    @field_validator("trigger_at", "expires_at", mode="before")
    @classmethod
    def _trigger_is_an_instant(cls, value: object, info: ValidationInfo) -> object:
        if value is None and info.field_name == "expires_at":
            return None  # null: as if absent
        # pydantic's lax mode would read a number, or a numeric string, as Unix time
        if not isinstance(value, str) or not _INSTANT.fullmatch(value):
            raise ValueError("must be an ISO 8601 instant with its offset, as a string "
                             "(e.g. 2026-11-30T09:00:00Z)")
        return value

    @field_validator("trigger_at", mode="after")
    @classmethod
    def _trigger_in_range(cls, value: datetime) -> datetime:
        # a wide margin from both ends of what Python can read back (DEC-TRIGGER)
        try:
            return check_trigger_at(value)
        except TriggerOutOfRange as exc:
            raise ValueError(str(exc)) from None

    @field_validator("expires_at", mode="after")
    @classmethod
    def _expiry_in_range(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        # a 422 naming expires_at (EXP-1): out of range, or at or before the trigger (born expired)
        if value is None:
            return None
        try:
            check_trigger_at(value)
        except TriggerOutOfRange as exc:
            raise ValueError(str(exc)) from None
        trigger_at = info.data.get("trigger_at")  # absent when trigger_at itself was refused
        if isinstance(trigger_at, datetime) and value <= trigger_at:
            raise ValueError(f"must be after trigger_at ({trigger_at.isoformat()})")
        return value


class LiveEventIn(_Body):
    """``POST /admin/ingest-event``: a live event, dispatched now."""

    model_config = ConfigDict(json_schema_extra=_facts_required)

    event_type: str = Name
    user_id: str = Name
    community_id: str | None = Field(default=None, max_length=MAX_STRING)
    facts: dict[str, Any] | None = None


class PreferencesIn(BaseModel):
    """``PUT /admin/participants/{user_id}/preferences``."""

    model_config = ConfigDict(extra="forbid")

    enabled_kinds: list[str] | None = Field(default=None, max_length=100, description="null: every kind")
    max_per_day: int = Field(default=3, ge=0, le=1000)
    # parsed strictly by the route (local_time.parse_time_zone, parse_quiet_hours: LOCAL-1, LOCAL-2)
    time_zone: Any = Field(default="UTC", json_schema_extra={"type": "string", "maxLength": 64},
                           description="an IANA time zone name (Europe/Berlin); the daily cap counts its calendar day")
    quiet_hours: Any = Field(
        default=None,
        json_schema_extra={"anyOf": [{"type": "object", "additionalProperties": False, "required": ["start", "end"],
                                      "properties": {"start": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
                                                     "end": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}}},
                                     {"type": "null"}]},
        description='local {"start": "HH:MM", "end": "HH:MM"}, may wrap midnight (22:00 to 07:00); '
                    "a reminder due inside is held until they end; null: none")

    @field_validator("enabled_kinds", mode="after")
    @classmethod
    def _kinds_storable(cls, value: list[str] | None) -> list[str] | None:
        for kind in value or []:
            if not 1 <= len(kind) <= MAX_STRING:
                raise ValueError(f"each kind must be 1 to {MAX_STRING} characters")
            check_text(kind)
        return value


class InboxSignInIn(BaseModel):
    """``POST /inbox/session``: the participant's token, checked once (the page then forgets it)."""

    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=8192, description="a valid token; its sub is the participant")


# -- responses ----------------------------------------------------------------------------
# Every answer is built from one of these (``scheduler.web.http.plumbing.respond``), so /openapi.json
# describes exactly what is sent. Times keep Python's ISO 8601 form (``+00:00``).

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
    error: str = Field(description="The rule engine's reason, e.g. no_rule_for_scenario, missing_or_invalid_time_scope.")
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


class BatchItemOut(_Out):
    """One item of ``POST /admin/scheduled-events/batch``'s answer, in the order sent (BATCH-2)."""

    index: int = Field(ge=0, description="the item's position in the array sent (from 0)")
    status: Literal[201, 422] = Field(description="201: stored (event); 422: refused (error), as a single POST would be")
    rewritten: bool | None = Field(default=None, description="201 only: true when an existing key's row was rewritten and reset")
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

