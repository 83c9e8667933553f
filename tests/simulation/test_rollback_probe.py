"""SIM-HOST-8: the harness's own probe of a host's dispatcher, which needs nothing from the host.

A dispatch the harness rolls back on purpose (an injected ``python`` or ``database`` failure)
must leave no committed change in any table outside the scheduler's schema, no outbox row and
no pushed message. The hosts here have no ``check_effects``: the probe alone finds the one that
writes on a connection of its own, names the table and the event, and lets the correct one be.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from sqlalchemy import create_engine, text

from harness import Simulation, Violation
from harness.driver import FAULTS, run_random
from harness.probe import RollbackProbe
from harness.sim_runner import SimulationRunner
from scheduler.nudging.publishers import RecordingPublisher
from scheduler.types import OutboundMessage
from tests.simulation.broken_hosts import UNCHECKED, UNCHECKED_BROKEN, UNCHECKED_UPDATING


def _host_deliveries(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM host_deliveries")).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.clause("SIM-HOST-8")
@pytest.mark.parametrize("fault", ["python", "database"])
def test_a_row_written_on_the_dispatchers_own_connection_is_found_with_no_check_from_the_host(
    database_url: str, fault: str
) -> None:
    """SIM-HOST-8: the example's broken dispatcher, without its host's effects check: the event
    rolled back on purpose leaves its ``host_deliveries`` row committed, and the probe says so
    at that step, naming the table, the change and the event."""
    assert UNCHECKED_BROKEN.check_effects is None
    with Simulation(database_url, host=UNCHECKED_BROKEN) as sim:
        sim.post(user=0, trigger=-1, fault=fault)
        event_id = next(iter(sim.model.rows))
        sim.claim(0)
        with pytest.raises(Violation) as info:
            sim.dispatch(0)
    assert info.value.clause == "SIM-HOST-8", info.value
    assert f"event {event_id}" in info.value.message
    assert "public.host_deliveries (1 row more)" in info.value.message
    assert f"an injected {fault} failure" in info.value.message
    assert _host_deliveries(database_url) == 1  # what the probe saw: committed, outside the batch


@pytest.mark.clause("SIM-HOST-8")
def test_a_change_committed_elsewhere_to_an_existing_row_is_found_too(database_url: str) -> None:
    """SIM-HOST-8: an update on the dispatcher's own connection (a counter of the host's, in a
    schema of its own) changes no row count; the probe still finds it ("rows changed")."""
    with Simulation(database_url, host=UNCHECKED_UPDATING) as sim:
        sim.post(user=1, trigger=-1, fault="python")
        sim.claim(0)
        with pytest.raises(Violation) as info:
            sim.dispatch(0)
    assert info.value.clause == "SIM-HOST-8"
    assert "host_counters.sent (rows changed)" in info.value.message, info.value


@pytest.mark.clause("SIM-HOST-8")
def test_a_host_that_writes_only_through_the_schedulers_session_passes_the_probe_under_every_fault(
    database_url: str,
) -> None:
    """SIM-HOST-8: the example's correct dispatcher, without its effects check, every fault on:
    clean, with the probe run at every event rolled back on purpose (and its rows there were
    written in the session: gone with the rollback)."""
    with Simulation(database_url, seed=5, replicas=3, batch_size=3, participants=4, host=UNCHECKED) as sim:
        run_random(sim, 150, random.Random(5), frozenset(FAULTS))
        sim.drain()
        summary = sim.summary()
    assert summary["checks"]["SIM-HOST-8"] > 150
    assert summary["rollback_probes"] > 0, summary
    assert "SIM-12" not in summary["checks"]  # no check of the host's own: the probe alone


@pytest.mark.clause("SIM-HOST-8")
def test_the_random_driver_finds_the_broken_host_by_the_probe_alone_and_shrinks_it(
    scheduler_simulation: SimulationRunner,
) -> None:
    """SIM-HOST-8: seeded random runs (as a host's CI runs them through the plugin) find the
    broken dispatcher with no ``check_effects``, shrink the program and write its regression test."""
    failure = scheduler_simulation.find(UNCHECKED_BROKEN, seed=1, seeds=3, steps=400)
    assert failure is not None, "the probe missed a row committed outside the scheduler's transaction"
    assert failure.violation.clause == "SIM-HOST-8", failure.report()
    assert "host_deliveries" in failure.violation.message
    assert len(failure.program) < failure.original_steps
    assert "load_host('tests.simulation.broken_hosts:UNCHECKED_BROKEN')" in failure.regression_file.read_text()


@pytest.mark.clause("SIM-HOST-8")
def test_a_message_of_a_rolled_back_dispatch_that_reaches_a_publisher_is_a_finding(database_url: str) -> None:
    """SIM-HOST-8: the outbound side: a message the rolled-back dispatch returned, found among
    what a replica's publisher was handed, is named with its event; another message (equal in
    every field, from another dispatch) is not."""
    message = OutboundMessage("n-1", "p0", None, "push", "reminder", "title", "body", "rule")
    probe = RollbackProbe(database_url)
    try:
        probe.rolled_back("event-1", "python", [message])
        publisher = RecordingPublisher()
        publisher.publish(dataclasses.replace(message))  # an equal message of a committed dispatch
        probe.pushed([("replica-0", publisher)])
        assert probe.first_finding() is None
        publisher.publish(message)
        probe.pushed([("replica-0", publisher)])
        finding = probe.first_finding()
    finally:
        probe.close()
    assert finding is not None
    assert finding.sentence().startswith("the dispatch of event event-1, rolled back on purpose (an injected "
                                         "python failure), left a message pushed by replica-0 (notification n-1)")


@pytest.mark.clause("SIM-HOST-8")
def test_a_window_in_which_a_replica_committed_is_inconclusive_never_a_finding(database_url: str) -> None:
    """SIM-HOST-8: the probe reads the outbox and every table outside the scheduler's schema; a
    row committed by a watched (replica's) engine during the window is another batch's, counted
    as inconclusive; the same row committed by an engine of the dispatcher's own is a finding."""
    replica = create_engine(database_url)
    own = create_engine(database_url)
    probe = RollbackProbe(database_url)
    try:
        with own.begin() as conn:
            conn.execute(text("CREATE TABLE host_log (id bigserial PRIMARY KEY)"))
        probe.watch([replica])
        before = probe.snapshot()
        assert {"public.host_log", "scheduler.deliveries"} <= set(before[1])
        assert not any(name.startswith("scheduler.") and name != "scheduler.deliveries" for name in before[1])
        with replica.begin() as conn:
            conn.execute(text("INSERT INTO host_log DEFAULT VALUES"))
        probe.compare(before, "event-1", "python")
        assert (probe.first_finding(), probe.inconclusive, probe.windows) == (None, 1, 1)
        before = probe.snapshot()
        with own.begin() as conn:
            conn.execute(text("INSERT INTO host_log DEFAULT VALUES"))
        probe.compare(before, "event-2", "database")
        finding = probe.first_finding()
    finally:
        probe.close()
        replica.dispose()
        own.dispose()
    assert finding is not None and finding.event_id == "event-2"
    assert finding.what == "a committed change in public.host_log (1 row more)"
