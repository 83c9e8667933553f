"""A delivery run (SIM-DELIV-*): the replica simulation with the outbox and its delivery workers.

``DeliveryRun`` wraps a ``Simulation`` whose built-in platform queues a ``webhook`` outbox row
for every sent notification, and gives each replica the production ``DeliveryWorker`` (on a
connection of its own) sending to a seeded ``ProviderModel``. A worker's cycle is three steps,
so they interleave with everything else: ``claim_deliveries(r)`` (lease due rows),
``send(r)`` (each to the provider) and ``record(r)``; ``kill(r)`` is the replica's process
killed after its batch committed, between its worker's claim and its send (or between the
send and the record): what it held is lost, its worker comes back as a new one, and the
lease decides who sends again. The steps run on the driving thread and never wait (the claim
skips locked rows), so a seed replays.

After every step, beside the simulation's own invariants:

- SIM-DELIV-3: every key the provider saw belongs to a committed outbox row (nothing is sent
  for a decision that rolled back), and every committed sent notification has exactly one;
- SIM-DELIV-4: a row is ``delivered`` only once the provider answered 2xx for its key, and
  never counts fewer attempts than the provider saw arrivals of it.

After ``drain`` (the simulation's, then the workers until the outbox is empty):

- SIM-DELIV-1: every sent notification's delivery is ``delivered`` or ``undeliverable``;
- SIM-DELIV-2: ``sorted(set(seen keys)) == sorted(expected keys)``: every key reached the
  provider, and a key seen more than once is an attempt the row counted (at least once).

The broken variants: ``send-before-commit`` (``provider.SendingChannel``) and
``delivered-before-send`` (``DeliveredFirstWorker``). ``python -m harness.delivery`` runs one
seeded program and prints the command that replays it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Engine, text

from harness.assembly import NO_TIMEOUTS
from harness.driver import FAULTS, Step, _choices
from harness.provider import CHANNEL, TIMEOUT_SECONDS, ProviderModel, SendingChannel
from harness.simulation import T0, Simulation
from harness.types import Violation
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.database import Database
from scheduler.database.engine import (
    create_migrated_database,
    drop_database,
    make_engine,
    resolve_database_url,
)
from scheduler.delivery.backoff import RetryPolicy
from scheduler.nudging.orchestrator import Channel, OutboxChannel
from scheduler.operations.delivery_worker import Claimed, DeliveryWorker
from scheduler.types import Delivered, SendResult

POLICY = RetryPolicy(base_seconds=5.0, cap_seconds=120.0, max_attempts=4)
LEASE_SECONDS = 30.0
CLAIM_LIMIT = 3
OUTBOX = text(
    "SELECT d.idempotency_key, d.status, d.attempts, d.lease_until, n.id AS notification_id"
    " FROM scheduler.deliveries AS d JOIN scheduler.notifications AS n ON n.id = d.notification_id"
    " WHERE d.channel = :channel"
)
SENT = text("SELECT id FROM scheduler.notifications WHERE status = 'sent'")
# when the next outbox row may be claimed: its next attempt's time, or its lease's end
NEXT_DUE = text(
    "SELECT count(*) FILTER (WHERE next_attempt_at <= :now AND (lease_until IS NULL OR lease_until <= :now)) AS due,"
    " min(greatest(next_attempt_at, coalesce(lease_until, next_attempt_at))) AS next_at"
    " FROM scheduler.deliveries WHERE status IN ('queued', 'retrying')"
)


class DeliveredFirstWorker(DeliveryWorker):
    """The broken variant ``delivered-before-send``: records each claimed row ``delivered``
    right after the claim, before it is sent (a crash in between loses it, a 5xx is hidden)."""

    def claim(self, limit: int) -> list[Claimed]:
        claimed = super().claim(limit)
        self.record([(c, Delivered(status=200, answer="assumed")) for c in claimed])
        return claimed


DELIVERY_VARIANTS = {
    "correct": ("the production outbox and worker", None),
    "send-before-commit": ("the channel sends while the decision is made, before the commit", "SIM-DELIV-3"),
    "delivered-before-send": ("the worker records delivered before it sends", "SIM-DELIV-4"),
}


@dataclass
class WorkerSlot:
    """One replica's worker and what it holds between its steps."""

    worker: DeliveryWorker
    incarnation: int = 0
    claimed: list[Claimed] = field(default_factory=list)
    results: list[SendResult] | None = None  # set once sent


class DeliveryRun:
    """A simulation run with the outbox, its workers and the provider (see the module)."""

    def __init__(self, database_url: str, *, seed: int = 0, replicas: int = 2, batch_size: int = 3,
                 participants: int = 3, variant: str = "correct", **simulation: Any) -> None:
        if variant not in DELIVERY_VARIANTS:
            raise ValueError(f"unknown delivery variant {variant!r}; choose one of {', '.join(DELIVERY_VARIANTS)}")
        self.variant = variant
        self.seed = seed
        self.slots: list[WorkerSlot] = []
        self.engines: list[Engine] = []
        # the provider answers by the run's clock, which the simulation makes: set just below
        self.provider = ProviderModel(seed, ManualClock(simulation.get("start", T0)))
        self.sim = Simulation(database_url, seed=seed, replicas=replicas, batch_size=batch_size,
                              participants=participants, outbox=self._channels, **simulation)
        self.provider.clock = self.sim.clock
        try:
            self.engines = [make_engine(database_url, NO_TIMEOUTS, pool_size=1, max_overflow=0)
                            for _ in range(replicas)]
            self.slots = [WorkerSlot(self._worker(i, 0)) for i in range(replicas)]
        except BaseException:
            self.close()
            raise

    def _channels(self, replica: int) -> list[Channel]:
        if self.variant == "send-before-commit":
            return [SendingChannel(self.provider)]
        return [OutboxChannel(CHANNEL)]

    def _worker(self, replica: int, incarnation: int) -> DeliveryWorker:
        kind = DeliveredFirstWorker if self.variant == "delivered-before-send" else DeliveryWorker
        return kind(Database(self.engines[replica]), {CHANNEL: self.provider}, self.sim.clock, policy=POLICY,
                    concurrency=CLAIM_LIMIT, timeout=TIMEOUT_SECONDS, lease_seconds=LEASE_SECONDS,
                    rng=random.Random(f"{self.seed}/worker/{replica}/{incarnation}"),
                    worker_id=f"replica-{replica}.{incarnation}")

    def __enter__(self) -> DeliveryRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sim.close()
        for engine in self.engines:
            engine.dispose()

    # -- the workers' steps -------------------------------------------------------------

    def _step(self, kind: str, code: str) -> None:
        self.sim._step(kind, code)

    def _after(self) -> None:
        self.sim._after_step()
        self.check()  # a violation is the run's through ``sim.fail``

    def idle_workers(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if not s.claimed]

    def claim_deliveries(self, replica: int) -> bool:
        """Replica ``replica``'s worker leases up to ``CLAIM_LIMIT`` due rows."""
        slot = self.slots[replica]
        if slot.claimed:
            return False
        self._step("claim_deliveries", f"delivery.claim_deliveries({replica})")
        slot.claimed = slot.worker.claim(CLAIM_LIMIT)
        slot.results = None
        self._after()
        return True

    def send_claimed(self, replica: int) -> bool:
        """The worker sends what it claimed to the provider, each under the per-send timeout."""
        slot = self.slots[replica]
        if not slot.claimed or slot.results is not None:
            return False
        self._step("send", f"delivery.send_claimed({replica})")

        async def all_of() -> list[SendResult]:
            return [await slot.worker.attempt_one(c) for c in slot.claimed]

        slot.results = asyncio.run(all_of())
        self._after()
        return True

    def record(self, replica: int) -> bool:
        """The worker records what each send made of its row (only while its lease holds)."""
        slot = self.slots[replica]
        if slot.results is None:
            return False
        self._step("record", f"delivery.record({replica})")
        slot.worker.record(list(zip(slot.claimed, slot.results, strict=True)))
        slot.claimed, slot.results = [], None
        self._after()
        return True

    def kill(self, replica: int) -> bool:
        """Replica ``replica``'s process is killed after its batch committed, while its worker
        holds claimed rows (before their send, or after it and before the record)."""
        slot = self.slots[replica]
        if not slot.claimed:
            return False
        self._step("kill_worker", f"delivery.kill({replica})")
        self.sim._fault("kill-before-send" if slot.results is None else "kill-before-record")
        slot.incarnation += 1
        slot.worker = self._worker(replica, slot.incarnation)
        slot.claimed, slot.results = [], None
        self._after()
        return True

    # -- the invariants -----------------------------------------------------------------

    def _outbox(self) -> list[Any]:
        return self.sim.observer._all(OUTBOX, {"channel": CHANNEL})

    def check(self) -> None:
        """SIM-DELIV-3 and SIM-DELIV-4 against the committed outbox and the provider's log."""
        sim = self.sim
        rows = self._outbox()
        keys = {r.idempotency_key for r in rows}
        sim._check("SIM-DELIV-3")
        stray = sorted(set(self.provider.seen()) - keys)
        if stray:
            raise sim.fail("SIM-DELIV-3", f"the provider got {stray[0]}, the key of no committed outbox row: "
                                          "something was sent for a decision that rolled back")
        sent = {r.id for r in sim.observer._all(SENT)}
        by_notification = sorted(r.notification_id for r in rows)
        if by_notification != sorted(sent):
            raise sim.fail("SIM-DELIV-3", f"the outbox's {CHANNEL} rows are for {len(by_notification)} notifications "
                                          f"({len(set(by_notification))} distinct), but {len(sent)} are sent")
        sim._check("SIM-DELIV-4")
        acknowledged, counts = self.provider.acknowledged(), self.provider.counts()
        for r in rows:
            if r.status == "delivered" and r.idempotency_key not in acknowledged:
                raise sim.fail("SIM-DELIV-4", f"delivery {r.idempotency_key} is delivered, but the provider never "
                                              f"answered 2xx for it (it arrived {counts[r.idempotency_key]} times)")
            if counts[r.idempotency_key] > r.attempts:
                raise sim.fail("SIM-DELIV-4", f"delivery {r.idempotency_key} arrived {counts[r.idempotency_key]} "
                                              f"times but counts {r.attempts} attempts")

    def drain(self, max_rounds: int = 400) -> None:
        """The simulation's drain, then every worker until the outbox is empty (advancing the
        clock a minute when nothing is due: backoffs and leases run out); then the run's
        final equalities (SIM-DELIV-1, SIM-DELIV-2)."""
        self.sim.drain()
        for replica in range(len(self.slots)):  # what a worker holds is sent and recorded
            self.send_claimed(replica)
            self.record(replica)
        for _ in range(max_rounds):
            due, next_at = self.due()
            if next_at is None:
                break
            if not due:  # nothing to claim before a backoff or a lease runs out: go there
                self.sim.advance(max(1, math.ceil((next_at - self.sim.now()).total_seconds() / 60)))
                continue
            for replica in range(len(self.slots)):
                if self.claim_deliveries(replica) and self.slots[replica].claimed:
                    self.send_claimed(replica)
                    self.record(replica)
        self.check_final()

    def due(self) -> tuple[int, datetime | None]:
        """How many outbox rows a claim may take now, and when the next one may be claimed
        (None: every row is delivered or undeliverable)."""
        row = self.sim.observer._all(NEXT_DUE, {"now": self.sim.now()})[0]
        return int(row.due), row.next_at

    def check_final(self) -> None:
        sim = self.sim
        rows = self._outbox()
        sim._check("SIM-DELIV-1")
        stuck = sorted((r.idempotency_key, r.status) for r in rows if r.status not in ("delivered", "undeliverable"))
        if stuck:
            raise sim.fail("SIM-DELIV-1", f"after the drain {len(stuck)} deliveries are stuck, e.g. {stuck[0]}")
        sim._check("SIM-DELIV-2")
        seen = sorted(set(self.provider.seen()))
        expected = sorted(r.idempotency_key for r in rows)
        if seen != expected:
            raise sim.fail("SIM-DELIV-2", f"keys that reached the provider differ from the outbox's: missing "
                                          f"{sorted(set(expected) - set(seen))[:3]}, extra "
                                          f"{sorted(set(seen) - set(expected))[:3]}")
        self.check()

    # -- reports ------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        rows = self._outbox()
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        answers: dict[str, int] = {}
        for reception in self.provider.received:
            answers[reception.answer] = answers.get(reception.answer, 0) + 1
        return {**self.sim.summary(), "deliveries": dict(sorted(statuses.items())),
                "provider_answers": dict(sorted(answers.items())), "provider_requests": len(self.provider.received),
                "variant": self.variant}


def delivery_choices(run: DeliveryRun, rng: random.Random, faults: frozenset[str]) -> list[Step]:
    """The simulation's steps (``driver``'s choices) and the workers' own."""
    steps = _choices(run.sim, rng, faults)
    due = run.due()[0]
    for replica, slot in enumerate(run.slots):
        if not slot.claimed:  # a claim with nothing due is taken now and then, and changes nothing
            steps.append((6 if due else 1, "claim_deliveries", partial(run.claim_deliveries, replica)))
        elif slot.results is None:
            steps.append((8, "send", partial(run.send_claimed, replica)))
        else:
            steps.append((8, "record", partial(run.record, replica)))
        if slot.claimed and "kill" in faults:
            steps.append((2, "kill_worker", partial(run.kill, replica)))
    return steps


def run_delivery_random(run: DeliveryRun, steps: int, rng: random.Random, faults: frozenset[str],
                        drain: bool = True) -> None:
    """``steps`` random steps of the simulation and the workers, then the drain."""
    taken = attempts = 0
    while taken < steps:
        attempts += 1
        choices = delivery_choices(run, rng, faults)
        pick = rng.uniform(0, sum(w for w, _, _ in choices))
        chosen = choices[-1][2]
        for weight, _name, fn in choices:
            pick -= weight
            if pick <= 0:
                chosen = fn
                break
        if chosen():
            taken += 1
        if attempts > steps * 20:
            raise RuntimeError("the random driver found no applicable step")
    if drain:
        run.drain()


def replay_command(seed: int, steps: int, replicas: int, variant: str) -> str:
    """The command that replays one seeded delivery run."""
    return (f"python -m harness.delivery --seed {seed} --steps {steps} --replicas {replicas}"
            + (f" --scheduler {variant}" if variant != "correct" else ""))


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.delivery``: one seeded delivery run on a fresh database of the
    configured server (``DATABASE_URL``, else the embedded PostgreSQL); exit 1 on a violation."""
    parser = argparse.ArgumentParser(prog="python -m harness.delivery", description=(
        "The replica simulation with the outbox: delivery workers send to a seeded provider model "
        "(timeouts, 503, 410) while replicas crash and are killed between the commit and the send."))
    parser.add_argument("--seed", type=int, default=None, help="the seed (default: a random one, printed first)")
    parser.add_argument("--steps", type=int, default=300, help="random steps before the drain (default 300)")
    parser.add_argument("--replicas", type=int, default=3, help="replicas, each with a worker (default 3)")
    parser.add_argument("--scheduler", choices=sorted(DELIVERY_VARIANTS), default="correct",
                        help="correct (default) or a broken delivery variant the invariants must catch")
    args = parser.parse_args(argv)
    if not 1 <= args.replicas <= 16 or not 1 <= args.steps <= 1_000_000:
        parser.error("--replicas is 1 to 16 and --steps 1 to 1,000,000")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"delivery simulation seed: {seed}", flush=True)
    replay = replay_command(seed, args.steps, args.replicas, args.scheduler)
    settings = Settings.from_env()
    base = resolve_database_url(settings)
    name = f"simdeliv_{seed}_{os.getpid()}"
    url = create_migrated_database(base, name, settings)
    try:
        with DeliveryRun(url, seed=seed, replicas=args.replicas, batch_size=3, participants=6,
                         variant=args.scheduler) as run:
            try:
                run_delivery_random(run, args.steps, random.Random(seed), frozenset(FAULTS))
            except Violation as violation:
                print(f"INVARIANT VIOLATED: {violation}")
                for line in run.sim.program[-20:]:
                    print(f"    {line}")
                print(f"replay: {replay}")
                return 1
            summary = run.summary()
        print(f"steps: {summary['steps_total']}; deliveries: {summary['deliveries']}; "
              f"provider answers: {summary['provider_answers']}; faults: {summary['faults']}")
        print(f"replay: {replay}")
        return 0
    finally:
        drop_database(base, name)


if __name__ == "__main__":
    raise SystemExit(main())
