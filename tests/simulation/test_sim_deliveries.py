"""SIM-DELIV-*: the simulation with the outbox, the delivery workers and a provider model.

Each replica's production ``DeliveryWorker`` sends the committed outbox rows to a seeded fake
provider (``harness.provider``: latency past the timeout, 503, 410), with its process killed
between the commit and the send; the invariants of ``harness.delivery`` are checked after every
step and after the drain. The broken variants (send before commit, delivered before the send)
are caught, each by a fixed program and by the random driver.
"""

from __future__ import annotations

import random

import pytest

from harness import Violation
from harness.delivery import DELIVERY_VARIANTS, DeliveryRun, replay_command, run_delivery_random
from harness.delivery import main as delivery_main
from harness.driver import FAULTS

ALL = frozenset(FAULTS)
SEEDS = (1, 2, 3)


def statuses(run: DeliveryRun) -> list[str]:
    return sorted(r.status for r in run._outbox())


@pytest.mark.clause("SIM-DELIV-1")
@pytest.mark.clause("SIM-DELIV-2")
@pytest.mark.clause("SIM-DELIV-3")
@pytest.mark.parametrize("seed", SEEDS)
def test_random_programs_with_a_flaky_provider_end_every_delivery_delivered_or_undeliverable(
    database_url: str, seed: int
) -> None:
    """SIM-DELIV-1, SIM-DELIV-2, SIM-DELIV-3: seeded programs of posts, claims, crashes, killed
    backends and killed workers against a provider that times out, answers 503 and 410: after
    the drain no delivery is stuck and every key reached the provider."""
    with DeliveryRun(database_url, seed=seed, replicas=3, batch_size=3, participants=6) as run:
        run_delivery_random(run, 250, random.Random(seed), ALL)
        summary = run.summary()
    assert sum(summary["deliveries"].values()) >= 5, "the program sent almost nothing: it proves little"
    assert {"200", "503", "timeout"} <= set(summary["provider_answers"])  # the provider failed too
    assert summary["faults"].get("kill-before-send", 0) + summary["faults"].get("kill-before-record", 0) >= 1
    assert set(summary["deliveries"]) <= {"delivered", "undeliverable"}
    assert summary["provider_requests"] >= sum(summary["deliveries"].values())


@pytest.mark.clause("SIM-DELIV-2")
@pytest.mark.clause("SIM-DELIV-7")
def test_a_replica_killed_after_its_commit_before_its_worker_sends_loses_nothing(database_url: str) -> None:
    """SIM-DELIV-7: replica 0 commits a notification, its worker claims the row and the process
    dies before the send; no other worker takes it while the lease holds; after the lease the
    other replica's worker sends it, with the same key, and the row counts both attempts."""
    with DeliveryRun(database_url, seed=4, replicas=2, batch_size=3) as run:
        sim = run.sim
        sim.post(user=0, trigger=-5)
        sim.claim(0)
        sim.dispatch(0)
        sim.finish(0)
        run.claim_deliveries(0)
        [claimed] = run.slots[0].claimed
        run.kill(0)
        run.claim_deliveries(1)
        assert run.slots[1].claimed == []  # the dead worker's lease still holds
        sim.advance(1)
        run.drain()
        assert run.provider.seen()[0] == claimed.delivery.idempotency_key
        [row] = run._outbox()
        assert row.status in ("delivered", "undeliverable") and row.attempts >= 2


@pytest.mark.clause("SIM-DELIV-3")
@pytest.mark.clause("SIM-DELIV-5")
def test_sending_before_the_commit_is_caught_when_the_batch_rolls_back(database_url: str) -> None:
    """SIM-DELIV-5 (by SIM-DELIV-3): the channel that sends while deciding has sent a key whose
    batch then crashed: the provider holds a key of no committed row."""
    with DeliveryRun(database_url, seed=5, replicas=2, batch_size=3, variant="send-before-commit") as run:
        sim = run.sim
        sim.post(user=0, trigger=-5)
        sim.claim(0)
        with pytest.raises(Violation) as info:
            sim.dispatch(0)
            run.claim_deliveries(1)  # any step after the decision: the key is already out
            sim.crash(0)
            run.claim_deliveries(1)
    assert info.value.clause == "SIM-DELIV-3"
    assert "rolled back" in info.value.message


@pytest.mark.clause("SIM-DELIV-4")
@pytest.mark.clause("SIM-DELIV-5")
def test_recording_delivered_before_the_send_is_caught_before_the_provider_answers(database_url: str) -> None:
    """SIM-DELIV-5 (by SIM-DELIV-4): the worker that records ``delivered`` at its claim has a
    delivered row the provider never acknowledged; a kill before the send would lose it."""
    with DeliveryRun(database_url, seed=6, replicas=2, batch_size=3, variant="delivered-before-send") as run:
        sim = run.sim
        sim.post(user=0, trigger=-5)
        sim.run(0)
        with pytest.raises(Violation) as info:
            run.claim_deliveries(0)
    assert info.value.clause == "SIM-DELIV-4"
    assert "never answered 2xx" in info.value.message


@pytest.mark.clause("SIM-DELIV-4")
@pytest.mark.clause("SIM-DELIV-5")
@pytest.mark.parametrize("variant", [v for v in DELIVERY_VARIANTS if v != "correct"])
def test_the_random_driver_finds_each_broken_delivery_variant_and_prints_its_replay(
    database_url: str, variant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-DELIV-5: from seed 1 the random driver catches each broken variant by its clause
    within 300 steps; the failure names the command that replays it."""
    expected = DELIVERY_VARIANTS[variant][1]
    with (DeliveryRun(database_url, seed=1, replicas=3, batch_size=3, participants=6, variant=variant) as run,
          pytest.raises(Violation) as info):
        run_delivery_random(run, 300, random.Random(1), ALL)
    replay = replay_command(1, 300, 3, variant)
    assert info.value.clause == expected
    assert replay == f"python -m harness.delivery --seed 1 --steps 300 --replicas 3 --scheduler {variant}"


@pytest.mark.clause("SIM-DELIV-6")
def test_the_same_seed_replays_the_same_program_and_the_same_provider_log(database_url: str) -> None:
    """SIM-DELIV-6: two runs of one seed take the same steps, and the provider gets the same
    requests in the same order with the same answers."""
    seen = []
    for _ in range(2):
        with DeliveryRun(database_url, seed=7, replicas=3, batch_size=3, participants=6) as run:
            run_delivery_random(run, 150, random.Random(7), ALL)
            seen.append((list(run.sim.program), run.provider.log(), run.summary()["deliveries"]))
    assert seen[0] == seen[1]
    assert seen[0][1], "nothing reached the provider"


@pytest.mark.clause("SIM-DELIV-6")
def test_the_delivery_command_prints_the_seed_first_and_the_replay_of_a_caught_variant(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIM-DELIV-6: ``python -m harness.delivery`` prints its seed first; a caught variant
    prints the invariant, the last steps and the command that replays it, and exits 1."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    code = delivery_main(["--seed", "1", "--steps", "300", "--scheduler", "delivered-before-send"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0] == "delivery simulation seed: 1"
    assert any(line.startswith("INVARIANT VIOLATED: SIM-DELIV-4 violated") for line in out)
    assert out[-1] == ("replay: python -m harness.delivery --seed 1 --steps 300 --replicas 3 "
                       "--scheduler delivered-before-send")
