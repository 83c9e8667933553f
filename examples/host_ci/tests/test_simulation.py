"""The scheduler's replica simulation against this host's own dispatcher.

``scheduler_simulation`` comes from the nudging-scheduler wheel's pytest plugin; the seed,
the steps and the number of seeds come from SCHEDULER_SIM_SEED, SCHEDULER_SIM_STEPS and
SCHEDULER_SIM_SEEDS (or --scheduler-sim-seed/-steps/-seeds). A failure prints the seed, the
shrunk program, the regression test it wrote and the command that replays it.
"""

from __future__ import annotations

from host_app.simulation import BROKEN

from harness.sim_runner import SimulationRunner


def test_the_scheduler_and_our_dispatcher_agree_under_every_fault(scheduler_simulation: SimulationRunner) -> None:
    """Every invariant that holds for any dispatcher, and one delivery row per dispatch."""
    scheduler_simulation.run()


def test_the_simulation_finds_a_delivery_written_outside_the_scheduler_transaction(
    scheduler_simulation: SimulationRunner,
) -> None:
    """The broken variant commits its row on a connection of its own: the simulation must
    find it by itself, shrink it, and write a regression test that replays it."""
    failure = scheduler_simulation.find(BROKEN, seed=1, seeds=3)
    assert failure is not None, "the broken dispatcher went unnoticed"
    assert failure.violation.clause == "SIM-12", failure.report()
    assert len(failure.program) < failure.original_steps
    assert failure.regression_file.exists()
    print(failure.report())
