"""SIM-CANCEL: the simulation's model and invariants include cancel.

A cancel is a client step like a re-post or a reset: it may arrive while a replica holds
the row in a batch, and then it must wait for that batch and answer what the batch
committed. The model predicts every answer from the committed status, so a cancel that
turned a dispatched row into a cancelled one is caught.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from harness import Simulation, Violation
from scheduler.application import commands
from scheduler.application.events import EventRecord


@pytest.mark.clause("SIM-CANCEL")
def test_a_cancel_racing_a_dispatch_waits_for_the_batch_and_a_cancelled_row_is_never_claimed(
    database_url: str,
) -> None:
    """SIM-CANCEL: the cancel of a row the batch holds waits, then answers `dispatched`
    (checked by the model); a row cancelled while pending is never claimed, even when due."""
    with Simulation(database_url, replicas=1, clients=2, batch_size=2) as sim:
        sim.post(user=0, trigger=-5)
        sim.post(user=1, trigger=5)  # not due yet
        sim.claim(0)
        sim.dispatch(0)
        sim.cancel(0)  # row 0 is in the batch: the cancel waits on its lock
        assert sim.stats.blocked.get("cancel") == 1
        sim.cancel(1)  # row 1 is pending and free: cancelled at once
        sim.finish(0)  # the waiting cancel now finds row 0 dispatched
        sim.advance(10)
        sim.run(0)
        sim.drain()
        assert sorted(r.status for r in sim.observer.rows().values()) == ["cancelled", "dispatched"]


def careless_cancel(sessions: sessionmaker[Session], *, now: datetime, actor: commands.Actor,
                    event_id: str | None = None, external_key: str | None = None) -> commands.CancelResult:
    """A broken cancel: it waits for the row lock but never looks at the status."""
    with sessions.begin() as session:
        row: Any = session.execute(
            text("UPDATE scheduled_events SET status = 'cancelled', dispatched_at = NULL, updated_at = :now "
                 "WHERE id = :id RETURNING *"), {"id": event_id, "now": now}).mappings().one()
        return commands.CancelResult("cancelled", EventRecord.from_row(row), None)


@pytest.mark.clause("SIM-CANCEL")
def test_a_cancel_that_ignores_the_status_is_caught_cancelling_a_dispatched_row(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIM-CANCEL: the model knows the row was dispatched, so a cancel answering `cancelled`
    for it is a violation (the invariant can fail)."""
    monkeypatch.setattr(commands, "cancel", careless_cancel)
    with Simulation(database_url, replicas=1, clients=1, batch_size=1) as sim:
        sim.post(user=0, trigger=-5)
        sim.run(0)
        with pytest.raises(Violation) as caught:
            sim.cancel(0)
        assert caught.value.clause == "SIM-CANCEL"
