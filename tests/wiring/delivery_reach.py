"""WIRE-1's checks for the delivery settings (specs/delivery.md): each read from the environment
reaches the channel or policy it configures, through ``scheduler.delivery.channels``, the
calls the delivery worker makes (``built_in_senders``, ``retry_policy``, ``allowed_push_hosts``)
and its batch (``attempt_all``). The worker itself is not wired into the service yet: when it
is, these checks follow the settings into the running service."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.delivery.attempt import attempt_all
from scheduler.delivery.channels import allowed_push_hosts, built_in_senders, retry_policy
from scheduler.delivery.record import DeliveryStatus, record_attempt
from scheduler.delivery.signing import format_secret
from scheduler.delivery.vapid import VapidKey
from scheduler.testing.push_service import LocalPushService
from scheduler.testing.webhook_receiver import HANG, LocalWebhookReceiver
from scheduler.types import Delivered, OutboundDelivery, Retry, SendResult

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
SECRET = format_secret(b"wiring-check-secret-0123456789ab")


class Environment(Protocol):
    def base(self, **extra: str) -> dict[str, str]: ...


def _delivery(channel: str = "webhook") -> OutboundDelivery:
    return OutboundDelivery(delivery_id="d-1", idempotency_key="dlv_wire", channel=channel, notification_id="n-1",
                            user_id="anna", community_id=None, kind="reminder", title="Reminder", body="Noon",
                            created_at=NOW)


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


def check_webhook_url(env: Environment) -> None:
    async def scenario() -> None:
        async with LocalWebhookReceiver() as receiver, httpx.AsyncClient() as client:
            settings = Settings.from_env(env.base(SCHEDULER_WEBHOOK_URL=receiver.url))
            sender = built_in_senders(settings, client=client, clock=ManualClock(NOW))["webhook"]
            assert isinstance(await sender.send(_delivery()), Delivered)
            assert len(receiver.received) == 1 and "webhook-signature" not in receiver.received[0].headers
    _run(scenario)
    assert built_in_senders(Settings.from_env(env.base()), client=httpx.AsyncClient(), clock=ManualClock(NOW)) == {}


def check_webhook_secret(env: Environment) -> None:
    async def scenario() -> None:
        async with LocalWebhookReceiver(SECRET, clock=ManualClock(NOW)) as receiver, httpx.AsyncClient() as client:
            settings = Settings.from_env(env.base(SCHEDULER_WEBHOOK_URL=receiver.url, SCHEDULER_WEBHOOK_SECRET=SECRET))
            sender = built_in_senders(settings, client=client, clock=ManualClock(NOW))["webhook"]
            assert isinstance(await sender.send(_delivery()), Delivered)
            assert [got.accepted for got in receiver.received] == [True]
    _run(scenario)


def check_push_allowed_hosts(env: Environment) -> None:
    settings = Settings.from_env(env.base(SCHEDULER_PUSH_ALLOWED_HOSTS="push.example.org *.push.example.net"))
    hosts = allowed_push_hosts(settings)
    assert hosts.allows("push.example.org") and hosts.allows("eu.push.example.net")
    assert not hosts.allows("fcm.googleapis.com")
    assert allowed_push_hosts(Settings.from_env(env.base())).allows("fcm.googleapis.com")


def _push_check(env: Environment, subject: str) -> None:
    key = VapidKey.generate()

    async def scenario() -> None:
        async with LocalPushService(clock=ManualClock(NOW)) as push, httpx.AsyncClient() as client:
            browser = push.subscribe(application_server_key=key.public_key_b64url)
            settings = Settings.from_env(env.base(SCHEDULER_VAPID_PRIVATE_KEY=key.private_key_b64url,
                                                  SCHEDULER_VAPID_SUBJECT=subject))
            sender = built_in_senders(settings, client=client, clock=ManualClock(NOW))["web_push"]
            result = await sender.send(replace(_delivery("web_push"), push=browser.target))
            assert result == Delivered(status=201, answer="")
            [got] = push.received
            assert got.accepted and got.claims is not None and got.claims["sub"] == subject
    _run(scenario)


def check_vapid_private_key(env: Environment) -> None:
    _push_check(env, "mailto:ops@example.org")


def check_vapid_subject(env: Environment) -> None:
    _push_check(env, "https://sunny-street.example/contact")


def check_delivery_timeout_seconds(env: Environment) -> None:
    async def scenario() -> None:
        async with LocalWebhookReceiver() as receiver, httpx.AsyncClient() as client:
            receiver.answer(HANG)
            settings = Settings.from_env(env.base(SCHEDULER_WEBHOOK_URL=receiver.url,
                                                  SCHEDULER_DELIVERY_TIMEOUT_SECONDS="0.3"))
            sender = built_in_senders(settings, client=client, clock=ManualClock(NOW))["webhook"]
            assert await sender.send(_delivery()) == Retry(reason="timeout: no answer within 0.3 s")
    _run(scenario)


def check_delivery_backoff_seconds(env: Environment) -> None:
    policy = retry_policy(Settings.from_env(env.base(SCHEDULER_DELIVERY_BACKOFF_SECONDS="0.5")))
    assert policy.base_seconds == 0.5
    record = record_attempt(Retry("HTTP 503"), attempt=1, now=NOW, policy=policy, rng=random.Random(3))
    assert record.delay_seconds is not None and 0 <= record.delay_seconds <= 0.5


def check_delivery_backoff_cap_seconds(env: Environment) -> None:
    settings = Settings.from_env(env.base(SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS="7"))
    record = record_attempt(Retry("HTTP 429", retry_after=7.0), attempt=11, now=NOW, policy=retry_policy(settings),
                            rng=random.Random(3))
    assert record.delay_seconds == 7.0
    sender = built_in_senders(settings.with_(webhook_url="https://hooks.example/in"), client=httpx.AsyncClient(),
                              clock=ManualClock(NOW))["webhook"]
    assert getattr(sender, "retry_after_cap", None) == 7.0


def check_delivery_max_attempts(env: Environment) -> None:
    policy = retry_policy(Settings.from_env(env.base(SCHEDULER_DELIVERY_MAX_ATTEMPTS="2")))
    statuses = [record_attempt(Retry("HTTP 500"), attempt=n, now=NOW, policy=policy, rng=random.Random(1)).status
                for n in (1, 2)]
    assert statuses == [DeliveryStatus.RETRYING, DeliveryStatus.UNDELIVERABLE]


class _Counting:
    def __init__(self) -> None:
        self.running = self.most = 0

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        self.running += 1
        self.most = max(self.most, self.running)
        for _ in range(3):
            await asyncio.sleep(0)
        self.running -= 1
        return Delivered(status=None)


def check_delivery_concurrency(env: Environment) -> None:
    settings = Settings.from_env(env.base(SCHEDULER_DELIVERY_CONCURRENCY="3"))
    channel = _Counting()
    batch = [replace(_delivery("host"), delivery_id=str(n)) for n in range(8)]
    asyncio.run(asyncio.wait_for(attempt_all(batch, {"host": channel}, concurrency=settings.delivery_concurrency,
                                             timeout=settings.delivery_timeout_seconds), 30))
    assert channel.most == 3


DELIVERY_CHECKS: dict[str, Callable[[Environment], None]] = {
    "webhook_url": check_webhook_url,
    "webhook_secret": check_webhook_secret,
    "push_allowed_hosts": check_push_allowed_hosts,
    "vapid_private_key": check_vapid_private_key,
    "vapid_subject": check_vapid_subject,
    "delivery_timeout_seconds": check_delivery_timeout_seconds,
    "delivery_backoff_seconds": check_delivery_backoff_seconds,
    "delivery_backoff_cap_seconds": check_delivery_backoff_cap_seconds,
    "delivery_max_attempts": check_delivery_max_attempts,
    "delivery_concurrency": check_delivery_concurrency,
}
