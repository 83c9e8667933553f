"""What one attempt's result makes of the delivery's row (DELIV-5): the one place that turns a
``SendResult`` into ``delivered``, ``retrying`` (with ``next_attempt_at``) or
``undeliverable``, so every worker records the same way.

- ``Delivered``: ``delivered``, with when and the provider's answer;
- ``Retry`` before the last attempt: ``retrying``, the next attempt after the policy's
  backoff (never sooner than the provider's ``Retry-After``), the reason in ``last_error``;
- ``Retry`` on the policy's last attempt: ``undeliverable``, saying it gave up;
- ``Undeliverable``: ``undeliverable`` with its reason;
- ``Gone``: ``undeliverable``, and the push subscription is to be removed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from scheduler.delivery.backoff import RetryPolicy
from scheduler.types import Delivered, Gone, Retry, SendResult, Undeliverable

LAST_ERROR_CHARS = 500  # what a row keeps of a reason


class DeliveryStatus(StrEnum):
    """A delivery's record: sent, to be tried again at ``next_attempt_at``, or given up on."""

    DELIVERED = "delivered"
    RETRYING = "retrying"
    UNDELIVERABLE = "undeliverable"


@dataclass(frozen=True)
class AttemptRecord:
    """The row after an attempt: its status and attempts, when to try again (``retrying``
    only), the last error (None once delivered), when it was delivered and what the provider
    answered (``delivered`` only), the delay chosen (for decorrelated jitter's next draw), and
    whether the push subscription is to be removed (``Gone``)."""

    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None
    provider_status: int | None = None
    provider_answer: str | None = None
    delay_seconds: float | None = None
    remove_subscription: bool = False


def record_attempt(result: SendResult, *, attempt: int, now: datetime, policy: RetryPolicy,
                   rng: random.Random, previous_delay: float | None = None) -> AttemptRecord:
    """The record of attempt number ``attempt`` (from 1) that ended in ``result`` at ``now``."""
    if attempt < 1:
        raise ValueError(f"attempts count from 1, got {attempt}")
    match result:
        case Delivered(status=status, answer=answer):
            return AttemptRecord(DeliveryStatus.DELIVERED, attempt, delivered_at=now,
                                 provider_status=status, provider_answer=answer)
        case Gone(status=status, reason=reason):
            return AttemptRecord(DeliveryStatus.UNDELIVERABLE, attempt, provider_status=status,
                                 last_error=_short(f"the push subscription is gone: {reason}"),
                                 remove_subscription=True)
        case Undeliverable(reason=reason):
            return AttemptRecord(DeliveryStatus.UNDELIVERABLE, attempt, last_error=_short(reason))
        case Retry(reason=reason, retry_after=retry_after):
            if attempt >= policy.max_attempts:
                return AttemptRecord(DeliveryStatus.UNDELIVERABLE, attempt,
                                     last_error=_short(f"gave up after {attempt} attempts: {reason}"))
            delay = policy.delay(attempt, rng, previous=previous_delay, retry_after=retry_after)
            return AttemptRecord(DeliveryStatus.RETRYING, attempt, next_attempt_at=now + timedelta(seconds=delay),
                                 last_error=_short(reason), delay_seconds=delay)
    raise TypeError(f"not a SendResult: {result!r}")


def _short(text: str) -> str:
    return text if len(text) <= LAST_ERROR_CHARS else text[: LAST_ERROR_CHARS - 1] + "\u2026"
