"""The built-in channels a deployment's settings turn on (DELIV-15): ``webhook`` when
``SCHEDULER_WEBHOOK_URL`` is set (signed when ``SCHEDULER_WEBHOOK_SECRET`` is), ``web_push``
when ``SCHEDULER_VAPID_PRIVATE_KEY`` is; and the retry policy of
``SCHEDULER_DELIVERY_BACKOFF_SECONDS``, ``..._BACKOFF_CAP_SECONDS`` and ``..._MAX_ATTEMPTS``.

``DeliverySettings`` is what is read of ``scheduler.config.Settings`` (which has each of
these), as a protocol: this package sits below ``config`` in the layers.
"""

from __future__ import annotations

from typing import Protocol

from scheduler.delivery.backoff import RetryPolicy
from scheduler.delivery.hosts import AllowedHosts
from scheduler.delivery.http import HttpClient
from scheduler.delivery.signing import parse_secret
from scheduler.delivery.vapid import VapidKey
from scheduler.delivery.webhook import WebhookSender
from scheduler.delivery.webpush import WebPushSender
from scheduler.types import Clock, Sender


class DeliverySettings(Protocol):
    """The settings of the delivery channels (``Settings`` has them all)."""

    @property
    def webhook_url(self) -> str | None: ...
    @property
    def webhook_secret(self) -> str | None: ...
    @property
    def push_allowed_hosts(self) -> str: ...
    @property
    def vapid_private_key(self) -> str | None: ...
    @property
    def vapid_subject(self) -> str | None: ...
    @property
    def delivery_timeout_seconds(self) -> float: ...
    @property
    def delivery_backoff_seconds(self) -> float: ...
    @property
    def delivery_backoff_cap_seconds(self) -> float: ...
    @property
    def delivery_max_attempts(self) -> int: ...
    @property
    def delivery_concurrency(self) -> int: ...


def retry_policy(settings: DeliverySettings) -> RetryPolicy:
    """The backoff and attempts every built-in channel retries with."""
    return RetryPolicy(base_seconds=settings.delivery_backoff_seconds,
                       cap_seconds=settings.delivery_backoff_cap_seconds,
                       max_attempts=settings.delivery_max_attempts)


def allowed_push_hosts(settings: DeliverySettings) -> AllowedHosts:
    """The hosts a subscription's endpoint may name (what ``PUT /me/push-subscriptions`` checks)."""
    return AllowedHosts.parse(settings.push_allowed_hosts)


def vapid_key(settings: DeliverySettings) -> VapidKey | None:
    """The application server's key, when web push is on (its public half is the page's
    ``applicationServerKey``)."""
    return VapidKey.parse(settings.vapid_private_key) if settings.vapid_private_key else None


def built_in_channels(settings: DeliverySettings) -> tuple[str, ...]:
    """The outbox channels the settings turn on (``built_in_senders``' names, without building
    them): ``webhook`` with a URL, ``web_push`` with a VAPID key (one row per subscription of
    the participant, PUSH-6)."""
    return ((WebhookSender.channel,) if settings.webhook_url else ()) + (
        (WebPushSender.channel,) if settings.vapid_private_key else ())


PER_SUBSCRIPTION = frozenset({WebPushSender.channel})  # the channels queued once per push subscription


def built_in_senders(settings: DeliverySettings, *, client: HttpClient, clock: Clock) -> dict[str, Sender]:
    """The senders the settings turn on, by channel name (``webhook``, ``web_push``), each on
    ``client`` with the per-send timeout; a host's own senders join these by name."""
    timeout, cap = settings.delivery_timeout_seconds, settings.delivery_backoff_cap_seconds
    senders: dict[str, Sender] = {}
    if settings.webhook_url:
        secret = parse_secret(settings.webhook_secret) if settings.webhook_secret else None
        senders[WebhookSender.channel] = WebhookSender(settings.webhook_url, client=client, clock=clock,
                                                       timeout=timeout, retry_after_cap=cap, secret=secret)
    key = vapid_key(settings)
    if key is not None:
        if not settings.vapid_subject:
            raise ValueError("web push needs SCHEDULER_VAPID_SUBJECT (mailto: or https:) with the VAPID key")
        senders[WebPushSender.channel] = WebPushSender(key, subject=settings.vapid_subject, client=client,
                                                       clock=clock, timeout=timeout, retry_after_cap=cap)
    return senders
