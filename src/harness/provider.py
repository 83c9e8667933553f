"""The provider model of a delivery run (SIM-DELIV-*): a fake webhook provider, seeded.

``ProviderModel`` is a ``Sender`` (the true edge the delivery workers send to). Every send
reaches it and is recorded (the idempotency key, the attempt, the answer); what it answers is
drawn from the run's seed, the key and how often that key has arrived, so the same program
gets the same answers whatever else the interleaving did:

- a latency (``latency_ms``): past the per-send timeout it is a timeout (the request arrived,
  its answer never came back), else the answer below;
- 503 with probability ``p_5xx``, 410 with ``p_gone``, else 200;

each answer classified by production's ``delivery.outcome.classify``, so a 503 or a timeout
is retried and a 410 on the webhook channel is undeliverable. Nothing sleeps: a latency is a
number, and a timeout is the ``TimeoutError`` ``delivery.attempt`` turns into a ``Retry``.

``SendingChannel`` is the broken variant ``send-before-commit``: the outbox channel that also
sends while the decision is still being made, before its transaction commits.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler.delivery.outcome import HttpAnswer, classify
from scheduler.nudging.orchestrator import Delivery, OutboxChannel, idempotency_key
from scheduler.types import Clock, OutboundDelivery, SendResult

CHANNEL = "webhook"
TIMEOUT_SECONDS = 1.0  # the per-send timeout the run's workers use


@dataclass(frozen=True)
class Reception:
    """One request that reached the provider: its key, the attempt it says it is (0: sent
    from inside a decision, by the broken channel), and what the provider answered."""

    key: str
    attempt: int
    answer: str  # "200", "503", "410" or "timeout"


@dataclass
class ProviderModel:
    """The fake provider (see the module). ``received`` is every request in arrival order."""

    seed: int
    clock: Clock
    p_5xx: float = 0.2
    p_gone: float = 0.05
    latency_ms: tuple[int, int] = (20, 1300)  # past TIMEOUT_SECONDS about a quarter of the time
    received: list[Reception] = field(default_factory=list)
    _ranks: dict[str, int] = field(default_factory=dict)

    def _arrivals(self, key: str) -> int:
        return sum(1 for r in self.received if r.key == key)

    def rank(self, key: str) -> int:
        """The order in which ``key`` first arrived (a key new to the provider gets the next one).
        Keys are UUIDs of the notifications' ids, which no seed fixes; their order of arrival is
        the program's."""
        return self._ranks.setdefault(key, len(self._ranks))

    def draw(self, key: str) -> str:
        """The answer to the next arrival of ``key``: a function of the seed, the key's rank and
        how often it arrived before."""
        rng = random.Random(f"{self.seed}/{self.rank(key)}/{self._arrivals(key)}")
        latency = rng.randint(*self.latency_ms)
        roll = rng.random()
        if latency > TIMEOUT_SECONDS * 1000:
            return "timeout"
        if roll < self.p_gone:
            return "410"
        return "503" if roll < self.p_gone + self.p_5xx else "200"

    def receive(self, key: str, attempt: int) -> str:
        """Record one arrival of ``key`` and return the answer it gets."""
        answer = self.draw(key)
        self.received.append(Reception(key, attempt, answer))
        return answer

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        answer = self.receive(delivery.idempotency_key, delivery.attempt)
        if answer == "timeout":
            raise TimeoutError(f"no answer within {TIMEOUT_SECONDS:g} s")
        return classify(HttpAnswer(int(answer), {}, b"ok" if answer == "200" else b""), now=self.clock.now(),
                        retry_after_cap=60.0)

    # -- what the oracle reads -----------------------------------------------------------

    def seen(self) -> list[str]:
        """Every key that arrived, once per arrival (at least once: repeats are allowed)."""
        return [r.key for r in self.received]

    def counts(self) -> Counter[str]:
        return Counter(self.seen())

    def acknowledged(self) -> set[str]:
        """The keys the provider answered 2xx at least once."""
        return {r.key for r in self.received if r.answer == "200"}

    def answered(self) -> set[str]:
        """The keys that got a final answer the worker can end a row on (200 or 410)."""
        return {r.key for r in self.received if r.answer in ("200", "410")}

    def log(self) -> list[tuple[int, int, str]]:
        """Every request as (the key's rank, the attempt, the answer): the same for one seed."""
        return [(self.rank(r.key), r.attempt, r.answer) for r in self.received]


class SendingChannel(OutboxChannel):
    """The broken variant ``send-before-commit``: queues the outbox row as production does,
    and also sends it at once, from inside the decision, before the batch commits."""

    def __init__(self, provider: ProviderModel, name: str = CHANNEL) -> None:
        super().__init__(name)
        self.provider = provider

    def deliver(self, notification: Mapping[str, Any], now: datetime) -> Delivery:
        self.provider.receive(idempotency_key(notification["id"], self.name), 0)  # the bug: before the commit
        return super().deliver(notification, now)
