"""Request and response bodies (pydantic v2). The OpenAPI document is derived from these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from scheduler.types import EVENT_STATUSES

MAX_DEPTH = 32
MAX_STRING = 200
Name = Field(min_length=1, max_length=MAX_STRING)


def _check_json(value: Any, depth: int = 0) -> None:
    """PostgreSQL's jsonb refuses NUL characters, and deep nesting is an attack, not data."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, depth + 1)
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)


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

    event_type: str = Name
    user_id: str = Name
    community_id: str | None = Field(default=None, max_length=MAX_STRING)
    external_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_STRING,
        description="Opt-in idempotence: posting the same key again rewrites and resets that row.",
    )
    trigger_at: AwareDatetime = Field(description="ISO 8601 with an offset; a naive time is refused.")
    facts: dict[str, Any] | None = Field(
        default=None, description="Must carry facts_version and scenario as non-empty strings."
    )

    @field_validator("trigger_at", mode="after")
    @classmethod
    def _trigger_in_range(cls, value: datetime) -> datetime:
        # 9999-12-31T23:59-12:00 is year 10000 in UTC: PostgreSQL cannot store it.
        try:
            value.astimezone(UTC)
        except OverflowError:
            raise ValueError("is out of range once converted to UTC") from None
        return value


class LiveEventIn(_Body):
    """``POST /admin/ingest-event``: a live event, dispatched now."""

    event_type: str = Name
    user_id: str = Name
    community_id: str | None = Field(default=None, max_length=MAX_STRING)
    facts: dict[str, Any] | None = None


class PreferencesIn(BaseModel):
    """``PUT /admin/participants/{user_id}/preferences``."""

    model_config = ConfigDict(extra="forbid")

    enabled_kinds: list[str] | None = Field(default=None, max_length=100, description="null: every kind")
    max_per_day: int = Field(default=3, ge=0, le=1000)

    @field_validator("enabled_kinds", mode="after")
    @classmethod
    def _kinds_storable(cls, value: list[str] | None) -> list[str] | None:
        for kind in value or []:
            if not 1 <= len(kind) <= MAX_STRING:
                raise ValueError(f"each kind must be 1 to {MAX_STRING} characters")
            check_text(kind)
        return value


class ScheduledEventOut(BaseModel):
    id: str
    event_type: str
    user_id: str
    community_id: str | None
    external_key: str | None
    trigger_at: datetime
    facts: dict[str, Any]
    status: Literal["pending", "dispatched", "failed", "cancelled"]
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None


class NotificationOut(BaseModel):
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
    status: Literal["sent", "suppressed", "failed"]
    reason: str | None
    source: Literal["live", "scheduled"]
    scheduled_event_id: str | None
    created_at: datetime


class IngestOut(BaseModel):
    outcome: str
    notifications: list[NotificationOut]


class PreferencesOut(BaseModel):
    user_id: str
    enabled_kinds: list[str] | None
    max_per_day: int
    updated_at: datetime


class SchedulerHealthOut(BaseModel):
    running: bool
    started_at: datetime | None
    last_poll_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    polls: int
    dispatched: int
    failed: int
    consecutive_failures: int
    stale: bool
    poll_seconds: float


class ErrorOut(BaseModel):
    detail: Any


class HistoryEntryOut(BaseModel):
    """One change of a scheduled event (``GET /admin/scheduled-events/{id}/history``)."""

    id: int
    event_id: str
    at: datetime = Field(description="the row's updated_at after the change (the service's clock)")
    change: Literal["stored", "rewritten", "dispatched", "failed", "reset", "cancelled", "pending", "updated"]
    actor: str | None = Field(description="the token's subject; null for the polling loop")
    status: Literal["pending", "dispatched", "failed", "cancelled"]
    changes: dict[str, list[Any]] = Field(description="column -> [before, after], for each column that changed")


class CancelConflictOut(BaseModel):
    detail: str
    event: ScheduledEventOut


class InboxNotificationOut(BaseModel):
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
    created_at: datetime
    stream_seq: int | None = Field(description="its SSE event id once streamed (null: never streamed)")


class InboxPageOut(BaseModel):
    items: list[InboxNotificationOut]
    next: str | None = Field(description="pass as ?before= for the next (older) page; null at the end")


assert set(EVENT_STATUSES) == {"pending", "dispatched", "failed", "cancelled"}
