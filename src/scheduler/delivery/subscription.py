"""A participant's push subscription, parsed strictly (DELIV-13): the W3C
``PushSubscription`` JSON (``subscription.toJSON()`` in the page) that ``PUT
/me/push-subscriptions`` takes: ``endpoint`` a URL the allow-list admits (``hosts``),
``expirationTime`` null or milliseconds, ``keys.p256dh`` the base64url of a 65-byte
uncompressed P-256 point, ``keys.auth`` of 16 bytes, and nothing else. A refusal names each
field it refuses (``endpoint``, ``keys.p256dh``, ...) for the route's 422.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from scheduler.delivery.encryption import AUTH_BYTES, load_public_key
from scheduler.delivery.hosts import MAX_ENDPOINT_CHARS, AllowedHosts, endpoint_problem
from scheduler.delivery.vapid import b64url_decode
from scheduler.types import PushTarget


class SubscriptionRefused(ValueError):
    """A subscription (or an endpoint) refused: ``errors`` lists ``{"field", "message"}``, each
    field a dotted path (``endpoint``, ``keys.auth``), the shape of the API's 422."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))

    @property
    def field(self) -> str:
        return self.errors[0]["field"]


def check_endpoint(endpoint: str, allowed: AllowedHosts) -> str:
    """``endpoint`` when a push endpoint may be there; ``SubscriptionRefused`` naming ``endpoint``."""
    problem = endpoint_problem(endpoint, allowed)
    if problem is not None:
        raise SubscriptionRefused([{"field": "endpoint", "message": problem}])
    return endpoint


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_EXPIRATION_MS = int((datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC) - EPOCH).total_seconds()) * 1000


class PushSubscriptionKeys(BaseModel):
    """``keys`` of a ``PushSubscription``: the browser's public key and auth secret, base64url."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    p256dh: str = Field(max_length=128)
    auth: str = Field(max_length=64)

    @field_validator("p256dh")
    @classmethod
    def _point(cls, value: str) -> str:
        try:
            load_public_key(b64url_decode(value))
        except ValueError:
            raise ValueError("must be the base64url of a 65-byte uncompressed P-256 point") from None
        return value

    @field_validator("auth")
    @classmethod
    def _secret(cls, value: str) -> str:
        try:
            decoded = b64url_decode(value)
        except ValueError:
            decoded = b""
        if len(decoded) != AUTH_BYTES:
            raise ValueError(f"must be the base64url of {AUTH_BYTES} bytes")
        return value


class PushSubscriptionJSON(BaseModel):
    """The W3C ``PushSubscriptionJSON``: ``endpoint``, ``expirationTime`` (milliseconds since the
    epoch, or null) and ``keys``; nothing else. Validate with ``context={"allowed": hosts}``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    endpoint: str = Field(max_length=MAX_ENDPOINT_CHARS)
    # milliseconds since the epoch, up to the last of year 9999 (a time Python can hold)
    expirationTime: int | None = Field(default=None, ge=0, le=MAX_EXPIRATION_MS)
    keys: PushSubscriptionKeys

    @field_validator("endpoint")
    @classmethod
    def _allowed(cls, value: str, info: ValidationInfo) -> str:
        allowed = (info.context or {}).get("allowed")
        if not isinstance(allowed, AllowedHosts):
            raise TypeError("validate a PushSubscriptionJSON with context={'allowed': AllowedHosts}")
        problem = endpoint_problem(value, allowed)
        if problem is not None:
            raise ValueError(problem)
        return value


@dataclass(frozen=True)
class Subscription:
    """A ``PushSubscription`` as it is stored: the ``PushTarget`` and when the browser said it
    expires (``expirationTime``; None: it did not say)."""

    target: PushTarget
    expires_at: datetime | None


def parse_subscription(payload: Any, allowed: AllowedHosts) -> PushTarget:
    """A ``PushSubscription``'s JSON (already decoded) as the ``PushTarget`` a delivery carries;
    ``SubscriptionRefused`` naming every field that is wrong."""
    return read_subscription(payload, allowed).target


def read_subscription(payload: Any, allowed: AllowedHosts) -> Subscription:
    """``parse_subscription`` with the subscription's expiry (``PUT /me/push-subscriptions``)."""
    if not isinstance(payload, dict):
        raise SubscriptionRefused([{"field": "body", "message": "must be a JSON object (a PushSubscription)"}])
    try:
        parsed = PushSubscriptionJSON.model_validate(payload, context={"allowed": allowed})
    except ValidationError as exc:
        raise SubscriptionRefused([
            {"field": ".".join(str(p) for p in error["loc"]) or "body",
             "message": str(error["msg"]).removeprefix("Value error, ")}
            for error in exc.errors(include_url=False)]) from None
    target = PushTarget(endpoint=parsed.endpoint, p256dh=b64url_decode(parsed.keys.p256dh),
                        auth=b64url_decode(parsed.keys.auth))
    expires = None if parsed.expirationTime is None else EPOCH + timedelta(milliseconds=parsed.expirationTime)
    return Subscription(target, expires)
