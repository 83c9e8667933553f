"""REL-5, REL-6: a real `scheduler serve` process stopped while a batch is in flight.

The batch is held in flight by construction, not by timing: its rule's evaluator
(``reliability.gate:wait_at_gate``) waits at a gate the test opens. SIGTERM then lets the
event in hand finish and commits the batch; kill -9 leaves PostgreSQL to roll it back.
Either way no row is half-done, no lock or backend is left, and the next poll finishes the job.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from reliability.cluster import ROOT, Replica, backends_of, free_port
from reliability.gate import GATED_RULE
from sqlalchemy import Engine, text

from scheduler.config import Settings
from scheduler.core.clock import SystemClock
from scheduler.nudging.rules import load_catalogue
from scheduler.service import SchedulerService
from tests.conftest import TEST_SECRET
from tests.reliability.support import notifications_by_event, statuses, store_due, wait_until

APP_NAME = "reliability-shutdown-test"
GATED_FACTS = {"facts_version": "1", "scenario": "gated", "date": "2026-11-30"}


@dataclass
class Gated:
    replica: Replica
    gate: Path
    rules: Path
    ids: list[str]

    def in_flight(self) -> list[str]:
        return sorted(p.name.removeprefix("in-flight-") for p in self.gate.glob("in-flight-*"))

    def open(self) -> None:
        (self.gate / "open").touch()

    def log(self) -> str:
        return self.replica.log_path.read_text(errors="replace")


@pytest.fixture
def gated(database_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gated]:
    """Five due events behind the gate, and a replica (batch size 5) about to take them."""
    gate, rules = tmp_path / "gate", tmp_path / "rules"
    gate.mkdir()
    monkeypatch.setenv("RELIABILITY_GATE_DIR", str(gate))  # for the in-process replica of _next_poll_finishes
    rules.mkdir()
    (rules / "gated.json").write_text(json.dumps([GATED_RULE]))
    ids = store_due(engine, [f"participant-{i}" for i in range(5)], datetime.now(UTC), facts=GATED_FACTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env.update({
        "DATABASE_URL": f"{database_url}&application_name={APP_NAME}",
        "SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_DATA_DIR": str(tmp_path / "data"),
        "SCHEDULER_RULES_DIR": str(rules), "SCHEDULER_BATCH_SIZE": "5", "SCHEDULER_POLL_SECONDS": "0.05",
        "RELIABILITY_GATE_DIR": str(gate), "PYTHONPATH": str(ROOT),
    })
    replica = Replica("shutdown-test", free_port(), env, tmp_path / "replica.log", log_level="info")
    replica.start()
    setup = Gated(replica, gate, rules, ids)
    try:
        yield setup
    finally:
        setup.open()
        if replica.alive():
            replica.kill()


def _no_trace_left(engine: Engine) -> None:
    """No backend of the stopped process remains, and no advisory lock is held by anyone."""
    wait_until(lambda: not backends_of(engine, APP_NAME), "the stopped replica's backends to go")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")).scalar_one() == 0


def _next_poll_finishes(gated: Gated, engine: Engine) -> None:
    """Another replica (in-process) takes whatever the stopped one left pending."""
    settings = Settings(jwt_secret=TEST_SECRET, rules_dir=gated.rules)
    service = SchedulerService(settings, engine=engine, clock=SystemClock(), catalogue=load_catalogue(gated.rules),
                               run_scheduler=False)
    gated.open()
    service.scheduler.poll_once()
    assert statuses(engine) == dict.fromkeys(gated.ids, "dispatched")
    assert notifications_by_event(engine) == dict.fromkeys(gated.ids, 1)


@pytest.mark.clause("REL-5")
def test_sigterm_mid_batch_finishes_the_event_in_hand_commits_and_exits_cleanly(
    gated: Gated, engine: Engine
) -> None:
    """REL-5: SIGTERM while an event is in flight: the lifespan stops the loop, that event completes
    and commits with its notification, the four not reached stay pending untouched, the process
    exits after a complete lifespan shutdown, and nothing of it is left in PostgreSQL."""
    (first,) = wait_until(gated.in_flight, "an event in flight")
    assert gated.replica.process is not None
    gated.replica.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "Waiting for application shutdown" in gated.log(), "the lifespan shutdown to begin")
    assert gated.replica.alive()  # it waits for the event in hand, not for ever: open the gate
    gated.open()
    code = gated.replica.process.wait(timeout=60)
    assert code == 0  # a graceful stop, not death by the signal
    assert "Application shutdown complete" in gated.log()
    assert gated.in_flight() == [first]
    assert statuses(engine) == {i: ("dispatched" if i == first else "pending") for i in gated.ids}
    assert notifications_by_event(engine) == {first: 1}
    _no_trace_left(engine)
    _next_poll_finishes(gated, engine)


@pytest.mark.clause("REL-6")
def test_kill_9_mid_batch_rolls_the_whole_batch_back_and_frees_its_locks(gated: Gated, engine: Engine) -> None:
    """REL-6: kill -9 while an event is in flight: PostgreSQL rolls the batch back when the socket
    closes: every row is pending again with no notification, no lock is left, and the next poll
    dispatches each event exactly once."""
    wait_until(gated.in_flight, "an event in flight")
    gated.replica.kill()
    _no_trace_left(engine)
    assert statuses(engine) == dict.fromkeys(gated.ids, "pending")
    assert notifications_by_event(engine) == {}
    _next_poll_finishes(gated, engine)
