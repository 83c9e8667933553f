"""WIRE-3: nothing leaves the process before the transaction that recorded it commits.

The publisher here is a witness: at the moment it is handed a message it looks, on a
connection of its own, for what that message claims. Only committed rows are visible
there, so a push made before the commit finds nothing and is recorded as a violation.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.service import SchedulerService
from scheduler.types import OutboundMessage
from tests.conftest import INGEST
from tests.helpers import dispatch_all, eventually, post_event, reminder_facts


class CommitWitness:
    """A fake publisher that checks, from outside the transaction, that a message's
    notification (and the scheduled row behind it) is committed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: list[str] = []
        self.violations: list[str] = []

    def publish(self, message: OutboundMessage) -> None:
        self.seen.append(message.notification_id)
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT n.status, n.scheduled_event_id, e.status AS event_status FROM notifications n "
                     "LEFT JOIN scheduled_events e ON e.id = n.scheduled_event_id WHERE n.id = :id"),
                {"id": message.notification_id},
            ).first()
        if row is None:
            self.violations.append(f"{message.notification_id}: pushed before its notification committed")
        elif row.scheduled_event_id is not None and row.event_status != "dispatched":
            self.violations.append(f"{message.notification_id}: pushed while its row is still {row.event_status}")


@pytest.fixture
def witness(service: SchedulerService, engine: Engine) -> CommitWitness:
    witness = CommitWitness(engine)
    service.publisher = witness
    service.scheduler.publisher = witness
    return witness


@pytest.mark.clause("WIRE-3")
def test_a_poll_pushes_only_after_its_batch_commits(
    client: TestClient, service: SchedulerService, witness: CommitWitness
) -> None:
    """WIRE-3: every push of a poll finds its notification and its dispatched row committed."""
    for user in ("a", "b", "c"):
        post_event(client, user_id=user)
    assert service.scheduler.poll_once().dispatched == 3
    assert len(witness.seen) == 3
    assert witness.violations == []


@pytest.mark.clause("WIRE-3")
def test_the_running_loop_pushes_only_after_its_batch_commits(
    client: TestClient, service: SchedulerService, witness: CommitWitness
) -> None:
    """WIRE-3: the same through Scheduler.run, the loop the API process runs."""
    for user in ("a", "b"):
        post_event(client, user_id=user)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(service.scheduler.run(stop))
        await eventually(lambda: len(witness.seen) >= 2 or task.done(), "two pushes")
        stop.set()
        await eventually(task.done, "the loop to return")

    asyncio.run(scenario())
    assert len(witness.seen) == 2
    assert witness.violations == []


@pytest.mark.clause("WIRE-3")
def test_a_live_event_pushes_only_after_its_transaction_commits(
    client: TestClient, witness: CommitWitness
) -> None:
    """WIRE-3: the live path commits before it pushes, too."""
    live = {"event_type": "reminder", "user_id": "a", "facts": reminder_facts()}
    assert client.post("/admin/ingest-event", headers=INGEST, json=live).status_code == 200
    assert len(witness.seen) == 1
    assert witness.violations == []


@pytest.mark.clause("WIRE-3")
def test_a_batch_rolled_back_pushes_nothing(
    client: TestClient, service: SchedulerService, witness: CommitWitness
) -> None:
    """WIRE-3: events dispatched in a batch that is then rolled back never leave the process."""
    for user in ("a", "b"):
        post_event(client, user_id=user)
    batch = service.scheduler.claim()
    dispatch_all(service.scheduler, batch)
    service.scheduler.abort(batch)
    assert witness.seen == []
    assert service.scheduler.poll_once().dispatched == 2
    assert len(witness.seen) == 2 and witness.violations == []
