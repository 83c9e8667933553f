"""Outcomes the requirements leave open under concurrency, decided in specs/simulation.md
(DEC-SIM-*) and pinned here as explicit step programs on the production scheduler."""

from __future__ import annotations

import pytest

from harness import Simulation


@pytest.mark.clause("DEC-SIM-1")
def test_replicas_whose_batches_share_participants_in_opposite_order_skip_instead_of_deadlocking(
    database_url: str,
) -> None:
    """DEC-SIM-1: the later claim neither waits nor deadlocks: it skips the busy participants'
    rows, which stay pending, and a later poll dispatches them; all four are dispatched once."""
    with Simulation(database_url, replicas=2, batch_size=2) as sim:
        sim.post(user=0, trigger=-9, day=0)  # replica 0's batch: p0 then p1
        sim.post(user=1, trigger=-8, day=0)
        sim.claim(0)
        sim.post(user=1, trigger=-7, day=1)  # replica 1 would take p1 then p0
        sim.post(user=0, trigger=-6, day=1)
        sim.claim(1)
        assert sim.stats.blocked == {}  # a claim never waits on a participant lock
        batch = sim.replicas[1].batch
        assert batch is not None and (len(batch.events), len(batch.skipped)) == (0, 2)
        sim.dispatch(0)
        sim.dispatch(0)
        sim.finish(0)
        sim.finish(1)
        sim.claim(1)
        sim.dispatch(1)
        sim.dispatch(1)
        sim.finish(1)
        assert sim.summary()["events_dispatched"] == 4
        sim.drain()


@pytest.mark.clause("DEC-SIM-2")
def test_a_crash_rolls_back_the_whole_open_batch_and_another_replica_dispatches_it_once(database_url: str) -> None:
    """DEC-SIM-2: events the crashed batch had already dispatched are pending again; effects exist once."""
    with Simulation(database_url, replicas=2, batch_size=3) as sim:
        for user in range(3):
            sim.post(user=user, trigger=-5)
        sim.claim(0)
        sim.dispatch(0)
        sim.dispatch(0)
        sim.crash(0)
        assert sorted(r.status for r in sim.observer.rows().values()) == ["pending"] * 3
        sim.run(1)
        assert sorted(r.status for r in sim.observer.rows().values()) == ["dispatched"] * 3
        sent = [n for n in sim.observer.notifications() if n[2] == "sent"]
        assert sorted(n[1] or "" for n in sent) == sorted(sim.model.order)
        sim.drain()


@pytest.mark.clause("DEC-SIM-3")
def test_a_killed_backend_releases_its_rows_at_once_and_the_replica_notices_at_its_next_statement(
    database_url: str,
) -> None:
    """DEC-SIM-3: another replica takes the rows while the killed one still believes it holds them;
    its next step fails that poll, the loop rolls back and carries on."""
    with Simulation(database_url, replicas=2, batch_size=2) as sim:
        sim.post(user=0, trigger=-5)
        sim.post(user=1, trigger=-4)
        sim.claim(0)
        sim.kill(0)
        sim.run(1)  # takes both rows although replica 0 still has its Batch object
        sim.dispatch(0)  # the dead connection fails this poll
        assert sim.stats.poll_errors == 1
        sim.post(user=2, trigger=-3)
        sim.run(0)  # the same replica polls again
        assert sim.summary()["events_dispatched"] == 3
        sim.drain()


@pytest.mark.clause("DEC-SIM-4")
def test_stopping_mid_batch_commits_what_was_dispatched_and_leaves_the_rest_pending(database_url: str) -> None:
    """DEC-SIM-4: the loop's stop path commits the events already dispatched; the rest stay pending."""
    with Simulation(database_url, replicas=2, batch_size=3) as sim:
        for user in range(3):
            sim.post(user=user, trigger=-5)
        sim.run(0, stop_after=1)
        statuses = sorted(r.status for r in sim.observer.rows().values())
        assert statuses == ["dispatched", "pending", "pending"]
        assert sim.replicas[0].scheduler.health.running is False
        sim.drain()


@pytest.mark.clause("DEC-SIM-5")
def test_after_the_clock_jumps_back_a_row_is_due_only_when_the_clock_passes_its_trigger_again(
    database_url: str,
) -> None:
    """DEC-SIM-5: due means trigger_at <= the clock at the claim; dispatched rows stay dispatched."""
    with Simulation(database_url, replicas=1, batch_size=3) as sim:
        sim.post(user=0, trigger=-1)
        sim.post(user=1, trigger=5)
        sim.advance(10)
        sim.advance(-20)  # now before both triggers
        sim.run(0)
        assert sim.summary()["events_dispatched"] == 0
        sim.advance(12)  # past the first trigger only
        sim.run(0)
        sim.advance(-60)
        assert sim.summary()["events_dispatched"] == 1
        assert sorted(r.status for r in sim.observer.rows().values()) == ["dispatched", "pending"]
        sim.advance(70)
        sim.drain()
        assert sim.summary()["events_dispatched"] == 2


@pytest.mark.clause("DEC-SIM-6")
def test_a_second_writer_is_not_started_on_a_row_that_already_has_one_waiting(database_url: str) -> None:
    """DEC-SIM-6: PostgreSQL wakes two waiting writers of one row in no fixed order, so a replayable
    run never has two; the second post of the key waits in the driver until the first is done."""
    with Simulation(database_url, replicas=1, clients=2) as sim:
        sim.post(user=0, trigger=-5, key="k")
        sim.claim(0)
        assert sim.post(user=1, trigger=-1, key="k") is True  # waits on the held row
        assert sim.stats.blocked == {"post": 1}
        assert sim.post(user=2, trigger=-2, key="k") is False  # not started: one writer waits already
        sim.finish(0)  # nothing dispatched: the re-post goes through
        assert sim.post(user=2, trigger=-2, key="k") is True
        rows = list(sim.observer.rows().values())
        assert [(r.user_id, r.status) for r in rows] == [("p2", "pending")]
        sim.drain()


@pytest.mark.clause("DEC-1")
def test_a_failure_mid_batch_replays_the_events_before_it_and_the_model_sees_each_effect_once(
    database_url: str,
) -> None:
    """DEC-1: the third event of a batch fails (a database error, then a Python error in the next
    batch); the events before it are rolled back to the checkpoint and replayed, stepped and run
    by the loop alike, while another replica claims beside it. Every invariant holds after every
    step, and the run's equality counts each event's committed dispatch once. Replica 0 runs
    per event (as a host's dispatcher does, and the fallback): a batch decided whole never
    replays, it fails the event alone after its decision."""
    with Simulation(database_url, replicas=2, batch_size=4) as sim:
        sim.replicas[0].dispatcher.decides_batches = False
        for user, fault in ((0, None), (1, None), (2, "database"), (3, None)):
            sim.post(user=user, trigger=-9 + user, fault=fault)
        sim.claim(0)
        sim.dispatch(0)
        sim.dispatch(0)
        sim.post(user=4, trigger=-3)
        sim.claim(1)  # only the new row: the four are locked, through the replay too
        sim.dispatch(0)  # fails: rolls back to the checkpoint, replays users 0 and 1
        sim.dispatch(1)
        sim.dispatch(0)
        sim.finish(1)
        sim.finish(0)
        for user, fault in ((5, None), (6, None), (7, "python"), (8, None)):
            sim.post(user=user, trigger=-2, fault=fault)
        sim.run(0)  # the production loop over the same shape of batch
        sim.drain()
        summary = sim.summary()
        assert (summary["events_dispatched"], summary["events_failed"]) == (7, 2)
