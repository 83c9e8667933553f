"""HOST-3, HOST-4: a commitment and its reminder in one transaction of the host's, on its async
engine (psycopg's async driver, then asyncpg), judged by the host's own facts contract."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from host_service.app import create_app
from host_service.auth import HostTokens, mint
from host_service.commitments import save_commitment
from host_service.database import async_engine
from host_service.dispatcher import HostDispatcher
from host_service.facts import ReminderFacts
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker

from scheduler import SchedulerService, Settings

LATER = datetime(2030, 1, 6, 9, 0, tzinfo=UTC)
ADMIN = {"Authorization": f"Bearer {mint('ops', ['admin'])}"}


def _counts(url: str) -> tuple[int, int]:
    """The host's commitments, and the scheduler's reminders (committed state)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            commitments = conn.execute(text("SELECT count(*) FROM commitments")).scalar_one()
            reminders = conn.execute(text("SELECT count(*) FROM scheduler.scheduled_events")).scalar_one()
            return int(commitments), int(reminders)
    finally:
        engine.dispose()


@pytest.mark.clause("HOST-3")
def test_a_commitment_and_its_reminder_commit_together_and_a_rollback_takes_both(host_database: str) -> None:
    """HOST-3: ``save_commitment`` writes the commitment and schedules its reminder
    (``scheduler.schedule_async``) on one ``AsyncSession``: inside the transaction both exist,
    after its rollback neither does, after its commit both do, the reminder keyed by the
    commitment and linked from it."""

    async def scenario() -> tuple[tuple[int, int], tuple[int, int], dict[str, Any]]:
        engine = async_engine()
        service = SchedulerService(Settings.from_env(), engine=engine, dispatcher=HostDispatcher(),
                                   authentication=HostTokens(), facts_contract=ReminderFacts, run_scheduler=False)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        try:
            async with sessions() as session:
                await session.begin()
                await save_commitment(session, service, user_id="anna", commitment="run the dishwasher at noon",
                                      minutes=5, remind_at=LATER)
                inside = _counts(host_database)  # another connection: nothing committed yet
                await session.rollback()
            after_rollback = _counts(host_database)
            async with sessions.begin() as session:
                saved = await save_commitment(session, service, user_id="anna", commitment="charge the car",
                                              minutes=None, remind_at=LATER)
            async with engine.connect() as conn:
                row = (await conn.execute(text(
                    "SELECT c.reminder_id, e.external_key, e.facts, e.status FROM commitments c"
                    " JOIN scheduler.scheduled_events e ON e.id = c.reminder_id"))).mappings().one()
            assert row["reminder_id"] == saved.reminder_id
            return inside, after_rollback, dict(row)
        finally:
            await service.stop()
            await engine.dispose()

    inside, after_rollback, row = asyncio.run(scenario())
    assert inside == (0, 0) and after_rollback == (0, 0)
    assert _counts(host_database) == (1, 1)
    assert row["external_key"].startswith("commitment-") and row["status"] == "pending"
    assert row["facts"] == {"commitment": "charge the car"}


@pytest.mark.clause("HOST-3")
@pytest.mark.clause("HOST-4")
def test_through_the_hosts_route_a_refused_reminder_takes_its_commitment_with_it(host_database: str) -> None:
    """HOST-3, HOST-4: ``POST /host/commitments`` in production (the host's auth, no scheduler
    key) saves both; a commitment whose reminder the facts contract refuses (a blank commitment)
    is the scheduler's 422, naming ``facts.commitment``, and its commitment row is rolled back
    with it; an unknown participant is a 422 too, never a 500."""
    with TestClient(create_app()) as client:
        ok = client.post("/host/commitments", json={"user_id": "anna", "commitment": "hang the washing out",
                                                    "minutes": 10, "remind_at": LATER.isoformat()})
        assert ok.status_code == 201, ok.text
        reminder = client.get(f"/nudging/admin/scheduled-events/{ok.json()['reminder_id']}", headers=ADMIN).json()
        assert reminder["facts"] == {"commitment": "hang the washing out", "minutes": 10}
        refused = client.post("/host/commitments", json={"user_id": "anna", "commitment": "",
                                                         "remind_at": LATER.isoformat()})
        assert refused.status_code == 422, refused.text
        assert [e["field"] for e in refused.json()["errors"]] == ["facts.commitment"]
        unknown = client.post("/host/commitments", json={"user_id": "zoe", "commitment": "walk the dog",
                                                         "remind_at": LATER.isoformat()})
        assert unknown.status_code == 422, unknown.text
        assert [c["commitment"] for c in client.get("/host/commitments").json()] == ["hang the washing out"]
    assert _counts(host_database) == (1, 1)


@pytest.mark.clause("HOST-4")
def test_the_hosts_facts_contract_judges_what_the_mounted_post_stores(host_database: str) -> None:
    """HOST-4: through the mounted POST, the host's facts (no ``facts_version``, no ``scenario``)
    are stored, and facts without a commitment are a 422 shaped like the others (``detail``,
    ``errors`` naming ``facts.commitment``)."""
    sender = {"Authorization": f"Bearer {mint('sender-1', ['sender'])}"}
    due = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    with TestClient(create_app()) as client:
        def post(facts: dict[str, Any]) -> Any:
            return client.post("/nudging/admin/scheduled-events", headers=sender, json={
                "event_type": "commitment_reminder", "user_id": "anna", "trigger_at": due, "facts": facts})

        refused = post({"minutes": 3})
        assert refused.status_code == 422 and isinstance(refused.json()["detail"], str), refused.text
        assert [e["field"] for e in refused.json()["errors"]] == ["facts.commitment"]
        stored = post({"commitment": "water the plants"})
        assert stored.status_code == 201, stored.text
        assert stored.json()["facts"] == {"commitment": "water the plants"}
