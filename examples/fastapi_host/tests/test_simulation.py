"""HOST-5: the scheduler's replica simulation against this host's dispatcher, with no check of
the host's own: the harness's rollback probe (SIM-HOST-8) is what finds a dispatcher that
writes outside the scheduler's transaction.

``scheduler_simulation`` comes from the nudging-scheduler wheel's pytest plugin (its host:
``scheduler_sim_dispatcher`` in pyproject.toml); SCHEDULER_SIM_SEED, SCHEDULER_SIM_STEPS and
SCHEDULER_SIM_SEEDS choose the seeds and the steps.
"""

from __future__ import annotations

import pytest
from host_service.simulation import BROKEN, HOST

from harness.sim_runner import SimulationRunner


@pytest.mark.clause("HOST-5")
def test_the_scheduler_and_our_dispatcher_agree_under_every_fault(scheduler_simulation: SimulationRunner) -> None:
    """HOST-5: every invariant for any dispatcher holds, the opted-out participant's reminders
    fail naming the opt-out, and nothing a rolled-back dispatch wrote is left committed."""
    assert HOST.check_effects is None  # nothing of the host's own: the harness checks by itself
    scheduler_simulation.run()


@pytest.mark.clause("HOST-5")
def test_the_simulation_finds_a_delivery_written_on_the_dispatchers_own_connection(
    scheduler_simulation: SimulationRunner,
) -> None:
    """HOST-5: the broken variant commits its delivery on a connection of its own: the run
    finds it by itself (SIM-HOST-8, naming host_deliveries), shrinks it and writes its regression test."""
    failure = scheduler_simulation.find(BROKEN, seed=1, seeds=3)
    assert failure is not None, "the broken dispatcher went unnoticed"
    assert failure.violation.clause == "SIM-HOST-8", failure.report()
    assert "host_deliveries" in failure.violation.message
    assert failure.regression_file.exists()
    print(failure.report())
