"""The web-push channel (DELIV-14): each delivery is encrypted for its subscription
(``encryption``, RFC 8291) and POSTed to the subscription's endpoint with the VAPID header
(``vapid``, RFC 8292) and the Web Push protocol's ``TTL`` and ``Urgency`` (RFC 8030 §5).

The payload is compact JSON the inbox page's service worker shows: the notification's id
(its ``tag``, so a repeated delivery replaces the shown notification instead of adding a
second), the idempotency key, kind, title, body and creation time; a body too long for one
push (``encryption.MAX_PLAINTEXT_BYTES``) is shortened with an ellipsis. A push service's 404
or 410 is ``Gone``: the subscription is dead.
"""

from __future__ import annotations

import json
from datetime import timedelta
from enum import StrEnum
from typing import Any

from scheduler.delivery import http
from scheduler.delivery.encryption import MAX_PLAINTEXT_BYTES, encrypt
from scheduler.delivery.vapid import VapidKey, check_subject
from scheduler.delivery.webhook import iso
from scheduler.types import Clock, OutboundDelivery, SendResult, Undeliverable

CHANNEL = "web_push"
DEFAULT_TTL = timedelta(days=1)  # a reminder a day late is no longer worth showing
MAX_TTL = timedelta(days=28)  # what the push services keep at most (FCM: 4 weeks)


class Urgency(StrEnum):
    """RFC 8030 §5.3: how soon the push service should wake the device."""

    VERY_LOW = "very-low"
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


def push_json(delivery: OutboundDelivery, body: str | None = None) -> dict[str, Any]:
    return {
        "id": delivery.notification_id,
        "idempotency_key": delivery.idempotency_key,
        "kind": delivery.kind,
        "title": delivery.title,
        "body": delivery.body if body is None else body,
        "created_at": iso(delivery.created_at),
    }


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def push_payload(delivery: OutboundDelivery) -> bytes:
    """The plaintext of the push: ``push_json`` as UTF-8, its body shortened to fit one record."""
    payload = _encode(push_json(delivery))
    if len(payload) <= MAX_PLAINTEXT_BYTES:
        return payload

    def fits(chars: int) -> bool:
        return len(_encode(push_json(delivery, delivery.body[:chars] + "\u2026"))) <= MAX_PLAINTEXT_BYTES

    if not fits(0):
        raise ValueError("the notification's title alone is longer than one push can hold")
    low, high = 0, len(delivery.body)  # the longest prefix of the body that fits, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return _encode(push_json(delivery, delivery.body[:low] + "\u2026"))


class WebPushSender:
    """Sends each delivery to its ``push`` subscription, identified by ``vapid`` with the
    contact ``subject``. ``timeout`` bounds one send; ``retry_after_cap`` a ``Retry-After``."""

    channel = CHANNEL

    def __init__(self, vapid: VapidKey, *, subject: str, client: http.HttpClient, clock: Clock,
                 timeout: float, retry_after_cap: float, ttl: timedelta = DEFAULT_TTL,
                 urgency: Urgency = Urgency.NORMAL) -> None:
        if not timedelta(0) <= ttl <= MAX_TTL:
            raise ValueError(f"a push's TTL is 0 to {MAX_TTL.days} days")
        self.vapid = vapid
        self.subject = check_subject(subject)
        self.timeout = timeout
        self.retry_after_cap = retry_after_cap
        self.ttl = ttl
        self.urgency = urgency
        self._client = client
        self._clock = clock

    def __repr__(self) -> str:
        return f"WebPushSender({self.vapid!r}, subject={self.subject!r}, timeout={self.timeout})"

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        target = delivery.push
        if target is None:
            return Undeliverable(reason="a web-push delivery without a push subscription")
        try:
            body = encrypt(push_payload(delivery), target.p256dh, target.auth)
            authorization = self.vapid.authorization(target.endpoint, subject=self.subject, now=self._clock.now())
        except ValueError as exc:  # a subscription whose keys (or endpoint) cannot be used
            return Undeliverable(reason=f"cannot encrypt for this subscription: {exc}")
        headers = {
            "authorization": authorization,
            "content-encoding": "aes128gcm",
            "content-type": "application/octet-stream",
            "ttl": str(int(self.ttl.total_seconds())),
            "urgency": str(self.urgency),
        }
        return await http.post(self._client, target.endpoint, content=body, headers=headers, timeout=self.timeout,
                               clock=self._clock, retry_after_cap=self.retry_after_cap, push=True)
