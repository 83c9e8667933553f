"""SIM-10, SIM-11: the faults of a real deployment, in the simulation.

SIM-10: each replica has its own host clock, which a step can set minutes off the reference
(the simulation's one clock, standing for the database's). The production scheduler reads
the database's clock (``DatabaseClock``), so a skewed host changes nothing; the broken
variant that reads its host clock is caught taking a row before its trigger.

SIM-11: a replica frozen mid-batch past the idle-in-transaction timeout: the database ends
its session (its transaction rolls back, its locks go) while the replica still runs; other
replicas take its rows; when it goes on, its batch fails as a whole and pushes nothing, and
its loop carries on. The oracle's checks after every step are the proof that nothing is
lost or done twice.
"""

from __future__ import annotations

import random

import pytest

from harness import Simulation, Violation
from harness.driver import run_random


@pytest.mark.clause("SIM-10")
def test_replicas_whose_host_clocks_are_minutes_off_claim_and_record_by_the_reference_clock(
    database_url: str,
) -> None:
    """SIM-10: one replica's host runs 60 minutes ahead, another's 60 behind; each claim takes
    exactly the rows due by the reference clock, each outcome records the reference's time."""
    with Simulation(database_url, replicas=2, batch_size=5) as sim:
        sim.skew_clock(0, 60)
        sim.skew_clock(1, -60)
        sim.post(user=0, trigger=-5)
        sim.post(user=1, trigger=5)  # due in five minutes: the fast host must not take it
        sim.claim(0)
        sim.dispatch(0)
        sim.finish(0)
        sim.advance(10)
        sim.claim(1)  # the slow host takes the row due five minutes ago by the reference
        sim.dispatch(1)
        sim.finish(1)
        sim.drain()
        assert sim.summary()["events_dispatched"] == 2
        assert sim.stats.checks["SIM-10"] >= 4


@pytest.mark.clause("SIM-10")
def test_a_scheduler_that_trusts_its_host_clock_is_caught_taking_a_row_before_its_trigger(
    database_url: str,
) -> None:
    """SIM-10: the broken variant ``host-clock`` on a host five minutes ahead claims a row
    due in three minutes by the reference."""
    with Simulation(database_url, replicas=1, batch_size=5, scheduler="host-clock") as sim:
        def program(sim: Simulation) -> None:
            sim.skew_clock(0, 5)
            sim.post(user=0, trigger=3)
            sim.claim(0)

        with pytest.raises(Violation) as info:
            program(sim)
    assert info.value.clause == "SIM-10"
    assert "before its trigger" in info.value.message


@pytest.mark.clause("SIM-11")
def test_a_replica_frozen_mid_batch_past_the_timeout_loses_nothing_and_its_loop_goes_on(
    database_url: str,
) -> None:
    """SIM-11: replica 0 dispatches one of its three rows and freezes; the database ends its
    session; replica 1 claims and dispatches all three; replica 0 resumes, its next statement
    fails its whole poll (nothing committed, nothing pushed), and its next run works. Its batch
    was decided whole at its first dispatch, so that statement is its write, sent with the
    COMMIT when it finishes (its next dispatch only hands out an outcome already decided)."""
    with Simulation(database_url, replicas=2, batch_size=5) as sim:
        for user in range(3):
            sim.post(user=user, trigger=-5 + user)
        sim.claim(0)
        sim.dispatch(0)
        assert sim.freeze(0)
        sim.claim(1)  # the rows replica 0 held are free again
        for _ in range(3):
            sim.dispatch(1)
        sim.finish(1)
        sim.dispatch(0)  # replica 0 resumes; nothing is sent yet
        assert sim.stats.poll_errors == 0
        sim.finish(0)  # its write and COMMIT: the session is gone, the poll fails
        assert sim.replicas[0].batch is None and sim.stats.poll_errors == 1
        sim.post(user=0, trigger=-1)
        sim.run(0)  # its loop goes on
        sim.drain()
        assert sim.summary()["events_dispatched"] == 4
        assert sim.stats.checks["SIM-11"] >= 2


@pytest.mark.clause("SIM-10")
@pytest.mark.clause("SIM-11")
def test_random_programs_with_skewed_clocks_and_frozen_replicas_agree_with_the_model(database_url: str) -> None:
    """SIM-10, SIM-11: the seeded random driver with every fault, skews and freezes included,
    runs the production scheduler clean and drains with nothing lost."""
    with Simulation(database_url, seed=14, replicas=3, batch_size=3, participants=3, modes="mixed") as sim:
        run_random(sim, 300, random.Random(14), frozenset({"event-errors", "crash", "kill", "stop", "clock",
                                                          "skew", "freeze"}))
        faults = sim.summary()["faults"]
    assert faults.get("clock-skew", 0) > 0 and faults.get("frozen-past-timeout", 0) > 0
