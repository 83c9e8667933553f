"""The webhook channel (DELIV-9): one ``POST`` of JSON per sent notification to
``SCHEDULER_WEBHOOK_URL``, with the Standard Webhooks headers (``signing``): ``webhook-id``
is the delivery's idempotency key (the same on every attempt), ``webhook-timestamp`` the
attempt's time, and ``webhook-signature`` when a secret is set."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from scheduler.delivery import http
from scheduler.delivery.signing import sign_headers
from scheduler.types import Clock, OutboundDelivery, SendResult, Undeliverable

CHANNEL = "webhook"
EVENT_TYPE = "notification.sent"


def iso(when: datetime) -> str:
    """An aware datetime as ISO 8601 in UTC (``2026-05-04T09:30:00+00:00``)."""
    if when.tzinfo is None:
        raise ValueError("a delivery's times are aware datetimes")
    return when.astimezone(UTC).isoformat()


def notification_json(delivery: OutboundDelivery) -> dict[str, Any]:
    """The notification as the webhook sends it: its type (``notification.sent``) and id, the
    participant and community, the kind, title and body, and when it was created."""
    return {
        "type": EVENT_TYPE,
        "id": delivery.notification_id,
        "user_id": delivery.user_id,
        "community_id": delivery.community_id,
        "kind": delivery.kind,
        "title": delivery.title,
        "body": delivery.body,
        "created_at": iso(delivery.created_at),
    }


def webhook_body(delivery: OutboundDelivery) -> bytes:
    """The exact bytes that are signed and sent: compact UTF-8 JSON."""
    return json.dumps(notification_json(delivery), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class WebhookSender:
    """Sends each delivery to one URL, signed with ``secret`` (a ``whsec_`` key) when given.
    ``timeout`` bounds one send; ``retry_after_cap`` bounds the wait a ``Retry-After`` asks for."""

    channel = CHANNEL

    def __init__(self, url: str, *, client: http.HttpClient, clock: Clock, timeout: float,
                 retry_after_cap: float, secret: bytes | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.retry_after_cap = retry_after_cap
        self._client = client
        self._clock = clock
        self._secret = secret

    @property
    def signed(self) -> bool:
        return self._secret is not None

    def __repr__(self) -> str:  # never the secret
        return f"WebhookSender({self.url!r}, signed={self.signed}, timeout={self.timeout})"

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        body = webhook_body(delivery)
        timestamp = int(self._clock.now().timestamp())
        try:
            headers = sign_headers(self._secret, delivery.idempotency_key, timestamp, body)
        except ValueError as exc:
            return Undeliverable(reason=f"the idempotency key cannot be a webhook-id: {exc}")
        headers["content-type"] = "application/json"
        return await http.post(self._client, self.url, content=body, headers=headers, timeout=self.timeout,
                               clock=self._clock, retry_after_cap=self.retry_after_cap)
