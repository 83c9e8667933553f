"""DELIV-1, DELIV-4, DELIV-5, DELIV-7: the ``Sender`` seam, the backoff, what an attempt
records, and one attempt of any sender under the per-send timeout."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import types
from scheduler.delivery.attempt import attempt
from scheduler.delivery.backoff import Jitter, RetryPolicy, backoff_seconds
from scheduler.delivery.record import LAST_ERROR_CHARS, DeliveryStatus, record_attempt
from scheduler.types import (
    Delivered,
    Gone,
    OutboundDelivery,
    Retry,
    Sender,
    SendResult,
    Undeliverable,
)

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICY = RetryPolicy(base_seconds=5.0, cap_seconds=3600.0, max_attempts=4)


def delivery(channel: str = "host-sms", attempt_number: int = 1) -> OutboundDelivery:
    return OutboundDelivery(delivery_id="d-1", idempotency_key="dlv_1", channel=channel, notification_id="n-1",
                            user_id="anna", community_id="sunny-street", kind="reminder", title="Reminder",
                            body="Run the dishwasher at noon", created_at=NOW, attempt=attempt_number)


# -- DELIV-1: the Sender protocol ----------------------------------------------------------


class SmsGateway:
    """A host's own channel, as a host would write it: a fake at the edge, recording."""

    def __init__(self, answer: SendResult) -> None:
        self.sent: list[OutboundDelivery] = []
        self.answer = answer

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        self.sent.append(delivery)
        return self.answer


@pytest.mark.clause("DELIV-1")
def test_a_hosts_own_channel_is_a_sender_by_its_async_send_and_answers_a_send_result() -> None:
    """DELIV-1: ``Sender`` is a protocol of ``scheduler.types`` (async ``send(delivery) ->
    SendResult``); a host's class with that method is one, and ``attempt`` runs it."""
    gateway = SmsGateway(Delivered(status=None, answer="queued as 42"))
    assert isinstance(gateway, Sender) and getattr(types.Sender, "_is_protocol", False)
    assert asyncio.run(attempt(gateway, delivery(), timeout=5.0)) == Delivered(status=None, answer="queued as 42")
    assert gateway.sent == [delivery()]
    assert set(types.SendResult.__args__) == {Delivered, Retry, Undeliverable, Gone}


@pytest.mark.clause("DELIV-1")
def test_a_delivery_carries_its_idempotency_key_channel_notification_and_attempt_and_hides_push_keys() -> None:
    """DELIV-1: the dataclasses are frozen; a push target's keys stay out of its repr (a log line)."""
    sent = delivery()
    with pytest.raises(AttributeError):
        sent.attempt = 2  # type: ignore[misc]
    target = types.PushTarget(endpoint="https://fcm.googleapis.com/fcm/send/x", p256dh=b"\x04" + b"k" * 64,
                              auth=b"secret-auth-1234")
    assert "secret-auth" not in repr(target) and "kkkk" not in repr(target)


# -- DELIV-4: the backoff --------------------------------------------------------------------


@pytest.mark.clause("DELIV-4")
def test_the_backoff_grows_exponentially_from_the_base_up_to_the_cap() -> None:
    """DELIV-4: full jitter draws below ``base * 2**(attempt - 1)``: with a generator that
    always draws the top, 5, 10, 20, ... then the cap."""

    class Top(random.Random):
        def random(self) -> float:
            return 1.0 - 2**-53

    tops = [backoff_seconds(n, base=5.0, cap=60.0, rng=Top()) for n in range(1, 7)]
    assert [round(t, 6) for t in tops] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]


@pytest.mark.clause("DELIV-4")
@given(attempt_number=st.integers(min_value=1, max_value=100_000),
       base=st.floats(min_value=0.1, max_value=3600.0), extra=st.floats(min_value=0.0, max_value=86400.0),
       seed=st.integers(), jitter=st.sampled_from(Jitter),
       retry_after=st.one_of(st.none(), st.floats(min_value=0.0, max_value=90_000.0)),
       previous=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e6)))
@PROPERTIES
def test_every_wait_is_capped_never_below_retry_after_and_replayable_from_its_seed(
        attempt_number: int, base: float, extra: float, seed: int, jitter: Jitter,
        retry_after: float | None, previous: float | None) -> None:
    """DELIV-4: for any attempt, base, cap, seed and ``Retry-After``: the wait is at least 0 and
    the ``Retry-After``, at most the cap (or the ``Retry-After``, itself capped by its parser),
    full jitter stays under its exponential ceiling, the same seed gives the same wait, and the
    module-level ``random`` is never drawn from."""
    cap = base + extra
    state = random.getstate()
    waits = [backoff_seconds(attempt_number, base=base, cap=cap, rng=random.Random(seed), jitter=jitter,
                             previous=previous, retry_after=retry_after) for _ in range(2)]
    assert random.getstate() == state
    wait = waits[0]
    assert waits[1] == wait
    assert 0.0 <= wait <= max(cap, retry_after or 0.0)
    assert wait >= (retry_after or 0.0)
    if jitter is Jitter.FULL and retry_after is None:
        assert wait <= base * 2.0 ** min(attempt_number - 1, 62)
    if jitter is Jitter.DECORRELATED and retry_after is None:
        assert wait >= min(base, cap)


@pytest.mark.clause("DELIV-4")
def test_the_jitter_spreads_the_waits_of_many_deliveries() -> None:
    """DELIV-4: a hundred deliveries failing together at attempt 5 do not all come back at once."""
    rng = random.Random(7)
    waits = {round(backoff_seconds(5, base=5.0, cap=3600.0, rng=rng), 3) for _ in range(100)}
    assert len(waits) > 90 and max(waits) <= 80.0


@pytest.mark.clause("DELIV-4")
@pytest.mark.parametrize(("base", "cap", "attempts"), [(0.0, 10.0, 3), (10.0, 5.0, 3), (1.0, 10.0, 0)])
def test_a_policy_refuses_a_base_that_is_not_positive_a_cap_below_it_and_no_attempt(
        base: float, cap: float, attempts: int) -> None:
    """DELIV-4: ``RetryPolicy`` is validated when built."""
    with pytest.raises(ValueError):
        RetryPolicy(base_seconds=base, cap_seconds=cap, max_attempts=attempts)


# -- DELIV-5: what an attempt records -------------------------------------------------------


@pytest.mark.clause("DELIV-5")
def test_a_delivered_attempt_records_when_and_the_providers_answer() -> None:
    """DELIV-5: ``delivered``, with ``delivered_at``, the provider's status and answer, no error."""
    record = record_attempt(Delivered(201, "created"), attempt=2, now=NOW, policy=POLICY, rng=random.Random(1))
    assert (record.status, record.attempts, record.delivered_at) == (DeliveryStatus.DELIVERED, 2, NOW)
    assert (record.provider_status, record.provider_answer, record.last_error) == (201, "created", None)
    assert record.next_attempt_at is None


@pytest.mark.clause("DELIV-5")
def test_a_retry_records_retrying_with_the_next_attempt_after_the_backoff_and_the_reason() -> None:
    """DELIV-5: ``retrying`` at ``now`` plus the policy's backoff, never before ``Retry-After``."""
    record = record_attempt(Retry("HTTP 429", retry_after=600.0), attempt=1, now=NOW, policy=POLICY,
                            rng=random.Random(1))
    assert record.status is DeliveryStatus.RETRYING and record.last_error == "HTTP 429"
    assert record.next_attempt_at is not None and record.delay_seconds is not None
    assert record.next_attempt_at == NOW + timedelta(seconds=record.delay_seconds)
    assert record.delay_seconds >= 600.0


@pytest.mark.clause("DELIV-5")
def test_the_last_attempts_retry_is_undeliverable_saying_it_gave_up() -> None:
    """DELIV-5: at ``max_attempts`` a ``Retry`` is ``undeliverable``; no next attempt."""
    record = record_attempt(Retry("HTTP 503"), attempt=POLICY.max_attempts, now=NOW, policy=POLICY,
                            rng=random.Random(1))
    assert record.status is DeliveryStatus.UNDELIVERABLE and record.next_attempt_at is None
    assert record.last_error == "gave up after 4 attempts: HTTP 503"


@pytest.mark.clause("DELIV-5")
def test_undeliverable_keeps_its_reason_and_gone_also_removes_the_subscription() -> None:
    """DELIV-5: ``Undeliverable`` and ``Gone`` end ``undeliverable``; only ``Gone`` removes the
    subscription; a long reason is cut to ``LAST_ERROR_CHARS``."""
    refused = record_attempt(Undeliverable("HTTP 400: " + "x" * 2000), attempt=1, now=NOW, policy=POLICY,
                             rng=random.Random(1))
    assert refused.status is DeliveryStatus.UNDELIVERABLE and not refused.remove_subscription
    assert refused.last_error is not None and len(refused.last_error) == LAST_ERROR_CHARS
    gone = record_attempt(Gone(410, "HTTP 410"), attempt=1, now=NOW, policy=POLICY, rng=random.Random(1))
    assert gone.status is DeliveryStatus.UNDELIVERABLE and gone.remove_subscription
    assert gone.last_error == "the push subscription is gone: HTTP 410" and gone.provider_status == 410


@pytest.mark.clause("DELIV-5")
@given(attempt_number=st.integers(min_value=1, max_value=50), max_attempts=st.integers(min_value=1, max_value=50),
       seed=st.integers(),
       result=st.one_of(st.builds(Delivered, st.integers(200, 299), st.text(max_size=20)),
                        st.builds(Retry, st.text(max_size=20),
                                  st.one_of(st.none(), st.floats(min_value=0.0, max_value=3600.0))),
                        st.builds(Undeliverable, st.text(max_size=20)),
                        st.builds(Gone, st.sampled_from([404, 410]), st.text(max_size=20))))
@PROPERTIES
def test_a_record_is_retrying_only_before_the_last_attempt_and_then_always_in_the_future(
        attempt_number: int, max_attempts: int, seed: int, result: SendResult) -> None:
    """DELIV-5: whatever the result: ``retrying`` exactly for a ``Retry`` before the last
    attempt, with ``next_attempt_at`` after ``now`` by at most the cap (or the ``Retry-After``);
    ``delivered`` exactly for ``Delivered``; otherwise ``undeliverable``."""
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=3600.0, max_attempts=max_attempts)
    record = record_attempt(result, attempt=attempt_number, now=NOW, policy=policy, rng=random.Random(seed))
    retrying = isinstance(result, Retry) and attempt_number < max_attempts
    assert (record.status is DeliveryStatus.RETRYING) is retrying
    assert (record.status is DeliveryStatus.DELIVERED) is isinstance(result, Delivered)
    assert (record.next_attempt_at is not None) is retrying
    if record.next_attempt_at is not None:
        assert NOW <= record.next_attempt_at <= NOW + timedelta(seconds=3600.0)


# -- DELIV-7: one attempt of any sender -------------------------------------------------------


class Raising:
    async def send(self, delivery: OutboundDelivery) -> SendResult:
        raise KeyError("no such phone number")


class Stuck:
    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        await self.never.wait()  # bounded: attempt()'s timeout
        return Delivered(status=None)


class Confused:
    async def send(self, delivery: OutboundDelivery) -> SendResult:
        return "ok"  # type: ignore[return-value]  # the bug under test


@pytest.mark.clause("DELIV-7")
def test_a_sender_that_raises_is_a_retry_naming_the_error_never_an_exception() -> None:
    """DELIV-7: whatever a host's sender raises is a ``Retry`` whose reason names it."""
    result = asyncio.run(attempt(Raising(), delivery(), timeout=5.0))
    assert isinstance(result, Retry) and "KeyError" in result.reason and "no such phone number" in result.reason


@pytest.mark.clause("DELIV-7")
def test_a_sender_that_never_answers_is_a_retry_after_the_per_send_timeout() -> None:
    """DELIV-7: the per-send timeout bounds a host's sender too."""
    result = asyncio.run(asyncio.wait_for(attempt(Stuck(), delivery(), timeout=0.05), 10))
    assert result == Retry(reason="timeout: the 'host-sms' sender took more than 0.05 s")


@pytest.mark.clause("DELIV-7")
def test_a_sender_that_answers_something_else_is_a_retry_saying_so() -> None:
    """DELIV-7: an answer that is not a ``SendResult`` is a ``Retry``, not a crash of the worker."""
    result = asyncio.run(attempt(Confused(), delivery(), timeout=5.0))
    assert isinstance(result, Retry) and "answered str, not a SendResult" in result.reason


class Overlapping:
    """Counts how many sends run at once (a fake channel)."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.order: list[str] = []

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        self.running += 1
        self.most = max(self.most, self.running)
        for _ in range(3):
            await asyncio.sleep(0)  # let every other task that may run, run
        self.running -= 1
        self.order.append(delivery.delivery_id)
        return Delivered(status=None, answer=delivery.delivery_id)


@pytest.mark.clause("DELIV-7")
def test_a_batch_runs_at_most_the_concurrency_at_once_and_answers_in_the_deliveries_order() -> None:
    """DELIV-7: ``attempt_all`` (the worker's call for a claimed batch) keeps to its
    concurrency, answers one result per delivery in order, and a channel nobody sends on is
    ``Undeliverable`` without stopping the others."""
    from dataclasses import replace

    from scheduler.delivery.attempt import attempt_all

    channel = Overlapping()
    batch = [replace(delivery(), delivery_id=f"d-{n}") for n in range(6)]
    batch.insert(2, replace(delivery("pigeon"), delivery_id="d-pigeon"))
    results = asyncio.run(asyncio.wait_for(attempt_all(batch, {"host-sms": channel}, concurrency=2, timeout=5.0), 10))
    assert channel.most == 2
    assert [r.answer if isinstance(r, Delivered) else r for r in results] == [
        "d-0", "d-1", Undeliverable(reason="no sender for the channel 'pigeon'"), "d-2", "d-3", "d-4", "d-5"]
    with pytest.raises(ValueError):
        asyncio.run(attempt_all(batch, {}, concurrency=0, timeout=5.0))
