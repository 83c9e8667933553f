"""What a stranger may send in a body: read bounded, parsed strictly, validated by its model
(pydantic v2; the OpenAPI document's request schemas are derived from these).

``read_body`` is the one place a request body is read: every body, a form's too, is refused
past its limit (413) before anything parses it, whether its size is declared or it arrives
chunked. A body then holds only what PostgreSQL can store (``check_text``, the facts' depth
and numbers), or the 422 names where it does not.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

from scheduler.core.store import (
    OFFSET_TEXT,
    RANGE_TEXT,
    TriggerOutOfRange,
    check_trigger_at,
)
from scheduler.web.http.params import MAX_STRING, Unprocessable, check_text
from scheduler.whole_numbers import digits_value

ModelT = TypeVar("ModelT", bound=BaseModel)

FORM = "application/x-www-form-urlencoded"
MAX_FORM_FIELDS = 100  # the console's largest form has a dozen


# -- reading a body -------------------------------------------------------------------------


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, refusing more than ``limit`` (413) before reading them all: at once
    when Content-Length says so, else as soon as the chunks read pass it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        size_declared = digits_value(declared.strip(), 19)
        if size_declared is None:
            raise HTTPException(400, "malformed Content-Length header: expected ASCII digits")
        if size_declared > limit:
            raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, bounded by ``read_body``."""
    return json_of(await read_body(request, limit))


def json_of(raw: bytes) -> Any:
    """A body already read (``read_body``) as JSON; a 422 naming ``body`` when it is not."""
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError as exc:
        raise Unprocessable.field("body", "is nested too deeply", "body is nested too deeply") from exc
    except ValueError as exc:
        # JSONDecodeError and UnicodeDecodeError, but also NaN/Infinity (which jsonb
        # refuses) and integers longer than Python's int-parsing limit: all the sender's.
        raise Unprocessable.field("body", f"is not valid JSON: {exc}", f"body is not valid JSON: {exc}") from exc


async def read_form(request: Request, limit: int) -> FormData:
    """An HTML form's fields (``application/x-www-form-urlencoded``, what every form of the
    console sends), bounded by ``read_body`` and by ``MAX_FORM_FIELDS``; a body of another
    type has no fields; 422 for bytes that are not UTF-8 once percent-decoded."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    raw = await read_body(request, limit)
    if not raw or media_type != FORM:
        return FormData()  # a body of another type holds no field (the form's checks then refuse it)
    try:
        fields = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                           encoding="utf-8", errors="strict", max_num_fields=MAX_FORM_FIELDS)
    except UnicodeDecodeError:
        raise Unprocessable.field("body", "is not valid UTF-8 once percent-decoded",
                                  "form is not valid UTF-8 once percent-decoded") from None
    except ValueError:  # more than MAX_FORM_FIELDS fields
        raise Unprocessable.field("body", f"has more than {MAX_FORM_FIELDS} fields",
                                  f"form has more than {MAX_FORM_FIELDS} fields") from None
    return FormData([(name, value) for name, value in fields])


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def validation_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic's errors as ``{field, message}``, the field named as a dotted path."""
    errors = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"]) or "body"
        errors.append({"field": field, "message": error["msg"]})
    return errors


def parse_body(model: type[ModelT], payload: Any) -> ModelT:
    """Validate ``payload``; a malformed body is a 422 naming each offending field."""
    if not isinstance(payload, dict):
        raise Unprocessable.field("body", "must be a JSON object", "body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = validation_errors(exc)
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise Unprocessable(errors, f"invalid body: {summary}") from exc


# -- the request models --------------------------------------------------------------------

# An ISO 8601 (RFC 3339) date and time with its offset, in ASCII digits.
_INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?"
                      r"([Zz]|[+-][0-9]{2}:?[0-9]{2})")
# A local clock time, HH:MM on the 24-hour clock (the JSON schema's pattern of quiet hours' ends).
_CLOCK_TIME = "^([01][0-9]|2[0-3]):[0-5][0-9]$"

MAX_DEPTH = 32
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
                                      "properties": {"start": {"type": "string", "pattern": _CLOCK_TIME},
                                                     "end": {"type": "string", "pattern": _CLOCK_TIME}}},
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


# -- web push (PUSH-*): PUT/DELETE /me/push-subscriptions --------------------------------
# The PUT body is parsed by ``scheduler.delivery.subscription.read_subscription`` alone (the
# one strict parse, with the endpoint's allow-list); ``PushSubscriptionIn`` describes it.


class PushSubscriptionKeysIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    p256dh: str = Field(max_length=128, description="the base64url of the browser's 65-byte uncompressed P-256 key")
    auth: str = Field(max_length=64, description="the base64url of its 16-byte auth secret")


class PushSubscriptionIn(BaseModel):
    """``PUT /me/push-subscriptions``: the W3C ``PushSubscription.toJSON()``, nothing else."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(max_length=2048, description="an https URL on a host of SCHEDULER_PUSH_ALLOWED_HOSTS")
    expirationTime: int | None = Field(default=None, ge=0, description="milliseconds since the epoch, or null")
    keys: PushSubscriptionKeysIn


class PushUnsubscribeIn(BaseModel):
    """``DELETE /me/push-subscriptions``: the endpoint to remove (no body: every one of the caller's)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    endpoint: str = Field(min_length=1, max_length=2048)
