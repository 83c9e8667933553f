"""A harness that never fails proves nothing: each deliberately broken scheduler is caught.

Every test below is the step sequence that catches one broken variant (``harness.broken``),
and asserts the invariant that names the failure. The last test lets the seeded random
driver find every variant by itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from harness import VARIANTS, Simulation, Violation
from harness.driver import run_random


def caught(sim: Simulation, program: Callable[[Simulation], None]) -> Violation:
    """Run ``program`` and return the violation it must raise."""
    with pytest.raises(Violation) as info:
        program(sim)
    return info.value


@pytest.mark.clause("SIM-1")
def test_a_claim_without_skip_locked_is_caught_waiting_on_a_row_another_replica_holds(database_url: str) -> None:
    """SIM-1: without SKIP LOCKED the second replica's claim waits on the first one's row lock."""
    with Simulation(database_url, replicas=2, batch_size=1, scheduler="no-skip-locked") as sim:
        def program(sim: Simulation) -> None:
            sim.post(user=0, trigger=-5)
            sim.post(user=1, trigger=-4)
            sim.claim(0)  # locks the oldest row
            sim.claim(1)  # must skip it and take the other; instead it waits
        violation = caught(sim, program)
    assert violation.clause == "SIM-1"
    assert "transactionid lock" in violation.message


@pytest.mark.clause("SIM-1")
def test_a_claim_ordered_by_id_is_caught_taking_younger_rows_first(database_url: str) -> None:
    """SIM-1: ordering by id instead of (trigger_at, id) does not take the oldest due rows."""
    with Simulation(database_url, replicas=1, batch_size=2, scheduler="order-by-id") as sim:
        def program(sim: Simulation) -> None:
            for minutes in (-1, -2, -3, -4, -5):  # each post is older than the one before
                sim.post(user=0, trigger=minutes, day=minutes)
            sim.claim(0)
        violation = caught(sim, program)
    assert violation.clause == "SIM-1"
    assert "oldest first" in violation.message


@pytest.mark.clause("SIM-1")
def test_a_batch_of_21_is_caught_exceeding_the_batch_size_of_20(database_url: str) -> None:
    """SIM-1: a claim never takes more than the batch size (production's 20)."""
    with Simulation(database_url, replicas=1, batch_size=20, participants=25, scheduler="batch-of-21") as sim:
        def program(sim: Simulation) -> None:
            for user in range(25):
                sim.post(user=user, trigger=-10)
            sim.claim(0)
        violation = caught(sim, program)
    assert violation.clause == "SIM-1"
    assert "claimed 21 rows, more than the batch size 20" in violation.message


@pytest.mark.clause("SIM-4")
def test_one_transaction_for_the_batch_is_caught_when_a_database_error_rolls_it_back(database_url: str) -> None:
    """SIM-4: without savepoints a database error in one event takes the whole batch down."""
    with Simulation(database_url, replicas=1, batch_size=3, scheduler="one-transaction") as sim:
        def program(sim: Simulation) -> None:
            sim.post(user=0, trigger=-5)
            sim.post(user=1, trigger=-4, fault="database")
            sim.post(user=2, trigger=-3)
            sim.claim(0)
            sim.dispatch(0)  # fine
            sim.dispatch(0)  # the database error aborts the one transaction
        violation = caught(sim, program)
    assert violation.clause == "SIM-4"
    assert "took its batch down" in violation.message


@pytest.mark.clause("SIM-4")
def test_one_transaction_for_the_batch_is_caught_keeping_a_failed_events_effects(database_url: str) -> None:
    """SIM-4: without savepoints the notification of an event that raised is committed anyway, on the
    per-event path (a dispatcher that cannot decide a batch, and the fallback): there a raising
    event's rows are written before it fails, and only its savepoint takes them back. (A batch
    decided whole writes nothing for an event that fails: no savepoint is involved.)"""
    with Simulation(database_url, replicas=1, batch_size=3, scheduler="one-transaction") as sim:
        sim.replicas[0].dispatcher.decides_batches = False

        def program(sim: Simulation) -> None:
            sim.post(user=0, trigger=-5, fault="python")
            sim.claim(0)
            sim.dispatch(0)
            sim.finish(0)
        violation = caught(sim, program)
    assert violation.clause == "SIM-4"
    assert "effects were not rolled back" in violation.message


@pytest.mark.clause("SIM-2")
def test_a_read_then_write_upsert_is_caught_when_two_posts_of_one_key_race(database_url: str) -> None:
    """SIM-2: two posts of a new key both read nothing; the second insert fails."""
    with Simulation(database_url, replicas=1, clients=2, scheduler="read-then-write-upsert") as sim:
        def program(sim: Simulation) -> None:
            sim.begin_post(0, user=0, trigger=5, key="reminder-42")
            sim.begin_post(1, user=0, trigger=9, key="reminder-42")
            sim.end_post(0)
            sim.end_post(1)  # the sender's retry must rewrite the row, not fail
        violation = caught(sim, program)
    assert violation.clause == "SIM-2"
    assert "failed" in violation.message and "UniqueViolation" in violation.message


@pytest.mark.clause("SIM-6")
def test_a_cap_counted_without_a_lock_is_caught_when_two_replicas_send_to_one_participant(database_url: str) -> None:
    """SIM-6: without the participant lock two batches would both see room under a cap of one;
    the simulation catches the second batch taking the participant before it can deliver."""
    program_steps: list[Callable[[Simulation], object]] = [
        lambda sim: sim.post(user=0, trigger=-5, day=0),  # participant p0 has a cap of 1
        lambda sim: sim.post(user=0, trigger=-4, day=1),  # another period: another dedup key
        lambda sim: sim.claim(0),
        lambda sim: sim.claim(1),  # production waits here for p0's lock; the broken one does not
        lambda sim: sim.dispatch(0),
        lambda sim: sim.dispatch(1),
        lambda sim: sim.finish(0),
        lambda sim: sim.finish(1),
    ]

    def program(sim: Simulation) -> None:
        for step in program_steps:
            step(sim)

    with Simulation(database_url, replicas=2, batch_size=1, scheduler="cap-without-lock") as sim:
        violation = caught(sim, program)
    assert violation.clause == "SIM-6"
    assert "of p0, whose participant lock another batch holds" in violation.message


@pytest.mark.clause("SIM-6")
def test_the_same_interleaving_keeps_the_cap_in_production_because_the_claim_skips_a_busy_participant(
    database_url: str,
) -> None:
    """SIM-6: the production scheduler runs the program above clean: its second claim neither
    waits nor takes p0's row, which stays pending until a later poll (DEC-2)."""
    with Simulation(database_url, replicas=2, batch_size=1) as sim:
        sim.post(user=0, trigger=-5, day=0)
        sim.post(user=0, trigger=-4, day=1)
        sim.claim(0)
        sim.claim(1)
        assert sim.stats.blocked == {}
        batch = sim.replicas[1].batch
        assert batch is not None and (len(batch.events), len(batch.skipped)) == (0, 1)
        sim.dispatch(0)
        sim.finish(0)
        sim.finish(1)  # nothing dispatched; p0's second row is still pending
        sim.claim(1)
        sim.dispatch(1)
        sim.finish(1)
        sim.drain()


@pytest.mark.clause("SIM-5")
def test_a_status_committed_before_the_engine_runs_is_caught_before_the_batch_ends(database_url: str) -> None:
    """SIM-5: a row marked dispatched and committed apart from its effects would be lost by a crash."""
    with Simulation(database_url, replicas=1, scheduler="status-first") as sim:
        def program(sim: Simulation) -> None:
            sim.post(user=0, trigger=-5)
            sim.claim(0)  # commits 'dispatched' before anything ran
            sim.crash(0)
        violation = caught(sim, program)
    assert violation.clause == "SIM-5"
    assert "whose batch has not committed" in violation.message


# Seeds and step counts with which the random driver finds each variant (fixed, so CI is stable).
FOUND_BY_RANDOM_DRIVER = {
    "no-skip-locked": (1, 300),
    "order-by-id": (1, 300),
    "batch-of-21": (1, 400),
    "one-transaction": (1, 400),
    "read-then-write-upsert": (2, 300),
    "cap-without-lock": (3, 300),
    "status-first": (1, 300),
    "prompt-catch-up": (3, 300),
    "host-clock": (1, 300),
    "ignores-expiry": (1, 300),
}


@pytest.mark.clause("SIM-EXPIRY")
def test_a_claim_that_ignores_expiry_is_caught_taking_an_expired_row_to_dispatch(database_url: str) -> None:
    """SIM-EXPIRY: a row whose expires_at passed (by the reference clock) is claimed for dispatch."""
    with Simulation(database_url, replicas=1, batch_size=2, scheduler="ignores-expiry") as sim:
        def program(sim: Simulation) -> None:
            sim.post(user=0, trigger=-10, window=5)  # expired five minutes ago
            sim.claim(0)
        violation = caught(sim, program)
    assert violation.clause == "SIM-EXPIRY"
    assert "after its expires_at" in violation.message


@pytest.mark.clause("SIM-EXPIRY")
def test_the_correct_claim_ends_expired_rows_and_dispatches_the_rest_by_the_reference_clock(database_url: str) -> None:
    """SIM-EXPIRY: with the production scheduler a claim ends the expired row, dispatches the one
    still in its window and the one without expiry, and the oracle agrees after every step."""
    with Simulation(database_url, replicas=2, batch_size=2) as sim:
        sim.post(user=0, trigger=-10, window=5)
        sim.post(user=1, trigger=-10, window=30)
        sim.post(user=0, trigger=-8)
        sim.claim(0)
        assert (len(sim.model.batches[0].ids), len(sim.model.batches[0].expired)) == (2, 1)
        sim.dispatch(0)
        sim.dispatch(0)
        sim.finish(0)
        assert [status for *_, status in sim.model.processed] == ["dispatched", "dispatched"]
        assert len(sim.model.expired) == 1
        sim.drain()


@pytest.mark.clause("SIM-1")
@pytest.mark.clause("SIM-2")
@pytest.mark.clause("SIM-4")
@pytest.mark.clause("SIM-5")
@pytest.mark.clause("SIM-EXPIRY")
@pytest.mark.clause("SIM-6")
@pytest.mark.clause("SIM-10")
@pytest.mark.parametrize("name", sorted(FOUND_BY_RANDOM_DRIVER))
def test_the_random_driver_finds_every_broken_scheduler_by_itself(database_url: str, name: str) -> None:
    """SIM-1, SIM-2, SIM-4, SIM-5, SIM-6, SIM-10, SIM-EXPIRY: each broken variant is caught by its named
    invariant (the prompt-mode variant runs its replicas in prompt mode; the host-clock
    variant with skewed host clocks among the faults)."""
    seed, steps = FOUND_BY_RANDOM_DRIVER[name]
    assert set(FOUND_BY_RANDOM_DRIVER) == set(VARIANTS) - {"correct"}
    with Simulation(database_url, seed=seed, replicas=3, batch_size=3, participants=2, scheduler=name) as sim:
        with pytest.raises(Violation) as info:
            # a bug that needs a fault to show (a skewed host clock) gets that fault too
            run_random(sim, steps, random.Random(seed), frozenset({"event-errors"}) | VARIANTS[name].faults)
        program = "\n".join(sim.program)
    assert info.value.clause == VARIANTS[name].expected, f"{info.value}\n{program}"


@pytest.mark.clause("SIM-1")
def test_a_prompt_mode_poll_past_the_batch_bound_is_caught_by_the_run_step(database_url: str) -> None:
    """SIM-1: a prompt-mode loop that "catches up" after a full batch by claiming two batches'
    worth polls again at once, as it should, but its second poll exceeds the batch size."""
    with Simulation(database_url, replicas=1, batch_size=2, scheduler="prompt-catch-up") as sim:
        for trigger in range(-9, -4):
            sim.post(user=trigger % 3, trigger=trigger)
        def program(sim: Simulation) -> None:
            sim.run(0)

        violation = caught(sim, program)
    assert violation.clause == "SIM-1"
    assert "prompt-mode poll 2 claimed 3 rows, more than the batch size 2" in violation.message


@pytest.mark.clause("SIM-1")
def test_a_prompt_mode_replica_polls_again_after_each_full_batch_and_agrees_with_the_model(
    database_url: str,
) -> None:
    """SIM-1: the production prompt-mode loop, run as one step, takes 2 + 2 + 1 rows in three
    polls, each checked against the model, and stops at the short batch."""
    with Simulation(database_url, replicas=2, batch_size=2, modes="mixed") as sim:
        for trigger in range(-9, -4):
            sim.post(user=trigger % 3, trigger=trigger)
        before = sim.replicas[1].scheduler.health.polls
        assert sim.run(1)
        assert sim.replicas[1].scheduler.health.polls - before == 3
        assert sim.summary()["events_dispatched"] == 5
        sim.drain()


@pytest.mark.clause("SIM-1")
def test_a_broken_variant_whose_target_sql_is_gone_fails_loudly() -> None:
    """SIM-1: a rewrite aimed at SQL that production no longer contains refuses to build, so a
    variant can never pass silently as a correct scheduler."""
    from harness.broken import Replace, VariantNoLongerApplies

    with pytest.raises(VariantNoLongerApplies, match=r"matches no statement of queries\.sql"):
        Replace(r"FOR SHARE NOWAIT", "FOR UPDATE", claim_only=False).build()


@pytest.mark.clause("SIM-EXPIRY")
def test_random_programs_with_expiring_posts_agree_with_the_model(database_url: str) -> None:
    """SIM-EXPIRY: the production scheduler under the driver's opt-in expiry draw (with event
    errors): every invariant holds after every step and the drain, and some rows did expire."""
    with Simulation(database_url, seed=2, replicas=3, batch_size=3, participants=2) as sim:
        run_random(sim, 300, random.Random(2), frozenset({"event-errors", "expiry"}))
        assert sim.model.expired
