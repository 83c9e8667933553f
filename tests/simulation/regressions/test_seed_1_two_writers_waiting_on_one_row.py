"""Found by `scheduler simulate --replicas 4 --steps 5000 --seed 1` (before DEC-SIM-6), cut down by hand.

SIM-2 violated at step 598: row 6abcacbb... holds post v78 for p2, but the last post was v80
for p1. Two re-posts of key k0 waited on the row a replica was dispatching; when the batch
ended, PostgreSQL let them through in the opposite order to the one they arrived in (each
retries its ON CONFLICT check), and the same seed did not fail on the next run. The harness
now never starts a second writer on a row that already has one waiting (DEC-SIM-6): the
program below must replay identically and clean.
"""

import pytest

from harness import Simulation, Violation


@pytest.mark.clause("DEC-SIM-6")
def test_seed_1_two_reposts_of_a_row_being_dispatched_replay_in_one_order(database_url: str) -> None:
    """DEC-SIM-6: the second re-post waits in the driver; the last one answered is the row's content."""
    programs = []
    for _ in range(2):
        with Simulation(database_url, seed=1, replicas=4, clients=2, batch_size=20) as sim:
            try:
                sim.post(user=2, trigger=-2, key="k0", day=1, fault=None)
                sim.claim(2)
                sim.dispatch(2)
                sim.begin_post(1, user=1, trigger=11, key="k0", day=2)
                sim.post(user=3, trigger=5, key="k0", day=0, fault=None)  # waits on replica 2's row
                sim.end_post(1)  # not started: a writer already waits on that row
                sim.stop(2)  # the batch ends; the waiting re-post goes through
                sim.end_post(1)  # now it runs, and is the last word
                sim.claim(1)
                sim.finish(1)
                sim.drain()
            except Violation as violation:
                pytest.fail(str(violation))
            programs.append((sim.program, [(r.user_id, r.version) for r in sim.observer.rows().values()]))
    assert programs[0] == programs[1]
    assert programs[0][1] == [("p1", 2)]  # v2 arrived before v3 but was answered last
