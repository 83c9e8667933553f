"""EMB-22: a host's ``AsyncEngine`` on asyncpg (``postgresql+asyncpg://``) is accepted, for real.

asyncpg installs (the test extra has it), so what EMB-12 promises for it is run, not assumed:
the service runs on the engine's sync psycopg twin, which connects with the asyncpg engine's
own arguments under psycopg's names (``server_settings`` as libpq ``options``), stores and
dispatches; and ``scheduler.schedule_async`` on an asyncpg ``AsyncSession`` is committed with
the host's commit and gone with its rollback. An asyncpg argument psycopg has no name for is
a ``ConfigError`` in one sentence.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

import scheduler
from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult
from scheduler.web.app import SchedulerService
from tests.conftest import T0, TEST_SECRET
from tests.helpers import post_event, reminder_facts

pytest.importorskip("asyncpg", reason="asyncpg is in the test extra (a FastAPI host's other async driver)")


class NamingDispatcher:
    """A fake host dispatcher: reads the connection's application_name inside the scheduler's transaction."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.seen.append(str(session.execute(text("SHOW application_name")).scalar_one()))
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


def _asyncpg(database_url: str, **kwargs: Any) -> AsyncEngine:
    return create_async_engine(make_url(database_url).set(drivername="postgresql+asyncpg"), **kwargs)


def _service(engine: AsyncEngine, **kwargs: Any) -> SchedulerService:
    return SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=engine, clock=ManualClock(T0),
                            run_scheduler=False, **kwargs)


@pytest.mark.clause("EMB-22")
def test_an_asyncpg_engine_is_served_through_its_psycopg_twin_with_its_server_settings(database_url: str) -> None:
    """EMB-22: the twin is psycopg's sync driver, connects with the asyncpg engine's
    ``server_settings`` (its ``application_name``, one with a space), and a posted event is
    stored and dispatched through it."""
    engine = _asyncpg(database_url, connect_args={"server_settings": {"application_name": "host app"}}, pool_size=3)
    dispatcher = NamingDispatcher()
    service = _service(engine, dispatcher=dispatcher)
    try:
        assert (service.engine.dialect.driver, service.engine.dialect.is_async) == ("psycopg", False)
        with TestClient(service.app) as client:
            post_event(client)
            assert service.scheduler.poll_once().dispatched == 1
        assert dispatcher.seen == ["host app"]
    finally:
        asyncio.run(service.stop())
        asyncio.run(engine.dispose())


@pytest.mark.clause("EMB-22")
def test_schedule_async_on_an_asyncpg_session_commits_and_rolls_back_with_the_host(database_url: str) -> None:
    """EMB-22: on an asyncpg ``AsyncSession``, a reminder scheduled beside a row of the host's is
    gone with the host's rollback and stored with its commit."""

    async def scenario() -> tuple[int, int]:
        engine = _asyncpg(database_url)
        service = _service(engine)
        sessions = async_sessionmaker(engine)
        try:
            async with engine.begin() as conn:
                await conn.execute(text("CREATE TABLE host_rows (id text PRIMARY KEY)"))
            counts = []
            for key, commit in (("rolled-back", False), ("committed", True)):
                async with sessions() as session:
                    await session.begin()
                    await session.execute(text("INSERT INTO host_rows VALUES (:key)"), {"key": key})
                    await scheduler.schedule_async(session, service=service, event_type="commitment_reminder",
                                                   user_id="participant-1", trigger_at=T0, facts=reminder_facts(),
                                                   external_key=key)
                    await (session.commit() if commit else session.rollback())
                async with engine.connect() as conn:
                    rows = (await conn.execute(text(
                        "SELECT (SELECT count(*) FROM host_rows) + (SELECT count(*) FROM scheduler.scheduled_events)"
                    ))).scalar_one()
                counts.append(int(rows))
            return counts[0], counts[1]
        finally:
            await service.stop()
            await engine.dispose()

    assert asyncio.run(scenario()) == (0, 2)  # neither after the rollback; the row and its reminder after the commit


@pytest.mark.clause("EMB-22")
def test_an_asyncpg_argument_psycopg_has_no_name_for_is_one_sentence(database_url: str) -> None:
    """EMB-22: ``statement_cache_size`` (asyncpg's own) cannot be carried over: a ``ConfigError``
    in one sentence that names it and says what to pass instead."""
    engine = _asyncpg(database_url, connect_args={"statement_cache_size": 0})
    try:
        with pytest.raises(ConfigError) as info:
            _service(engine)
    finally:
        asyncio.run(engine.dispose())
    message = str(info.value)
    assert "statement_cache_size" in message and "pass a sync postgresql+psycopg:// engine" in message
    assert message.count(". ") == 0 and "\n" not in message
