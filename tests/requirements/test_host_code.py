"""A host's own code schedules and cancels in its own transaction (EMB-13, EMB-14, EMB-15):
``scheduler.schedule`` on the host's ``Session`` is committed with the host's row and gone with
its rollback, refuses exactly what the POST refuses, and wakes prompt replicas on commit only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

import scheduler
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import DUE_CHANNEL
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0, TEST_SECRET
from tests.helpers import reminder_facts

LATER = T0 + timedelta(hours=1)


@pytest.fixture
def host_engine(database_url: str) -> Iterator[Engine]:
    """The host's own engine, with a table of the host's own beside the scheduler's schema."""
    engine = create_engine(database_url, pool_size=3)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.commitments (id int PRIMARY KEY, what text NOT NULL)"))
    yield engine
    engine.dispose()


@pytest.fixture
def host_service(host_engine: Engine) -> Iterator[SchedulerService]:
    service = SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=host_engine, clock=ManualClock(T0),
                               run_scheduler=False)
    yield service
    service.loop_engine.dispose()


def _commitments(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT id FROM public.commitments ORDER BY id")).scalars())


def _events(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT id, external_key, status, trigger_at, facts FROM scheduler.scheduled_events ORDER BY created_at"
        )).mappings()]


def _save_with_reminder(session: Session, service: SchedulerService, commitment: int, **kwargs: Any) -> None:
    session.execute(text("INSERT INTO public.commitments VALUES (:id, 'walk')"), {"id": commitment})
    scheduler.schedule(session, service=service, event_type="commitment_reminder", user_id="participant-1",
                       trigger_at=LATER, facts=reminder_facts(), **kwargs)


@pytest.mark.clause("EMB-13")
def test_a_reminder_scheduled_in_the_hosts_transaction_is_committed_with_the_hosts_row(
    host_engine: Engine, host_service: SchedulerService,
) -> None:
    """EMB-13: inside the host's transaction neither row is seen by anyone else; after its
    commit both are, the reminder pending at its time with its facts."""
    with Session(host_engine) as session:
        _save_with_reminder(session, host_service, 1, external_key="commitment-1")
        assert _commitments(host_engine) == [] and _events(host_engine) == []
        session.commit()
    assert _commitments(host_engine) == [1]
    [event] = _events(host_engine)
    assert (event["external_key"], event["status"], event["trigger_at"]) == ("commitment-1", "pending", LATER)
    assert event["facts"] == reminder_facts()


@pytest.mark.clause("EMB-13")
def test_the_hosts_rollback_takes_its_row_and_the_reminder_together(
    host_engine: Engine, host_service: SchedulerService,
) -> None:
    """EMB-13: a rollback after ``schedule`` leaves neither the host's row nor the reminder."""
    with Session(host_engine) as session:
        _save_with_reminder(session, host_service, 1)
        session.rollback()
    assert _commitments(host_engine) == [] and _events(host_engine) == []


@pytest.mark.clause("EMB-13")
def test_scheduling_a_known_key_again_rewrites_its_row_as_the_post_does(
    host_engine: Engine, host_service: SchedulerService,
) -> None:
    """EMB-13: the same upsert by key as the POST (REQ-0064): one row, at the newest time."""
    for commitment, hours in ((1, 1), (2, 3)):
        with Session(host_engine) as session:
            session.execute(text("INSERT INTO public.commitments VALUES (:id, 'walk')"), {"id": commitment})
            record = scheduler.schedule(session, service=host_service, event_type="commitment_reminder",
                                        user_id="participant-1", trigger_at=T0 + timedelta(hours=hours),
                                        facts=reminder_facts(), external_key="commitment-1")
            session.commit()
        assert record.trigger_at == T0 + timedelta(hours=hours)
    [event] = _events(host_engine)
    assert event["trigger_at"] == T0 + timedelta(hours=3) and event["id"] == record.id


BAD_EVENTS: list[dict[str, Any]] = [
    {"facts": None},  # REQ-0063's missing facts
    {"facts": {"facts_version": "1"}},  # the built-in contract: no scenario
    {"trigger_at": LATER.replace(tzinfo=None)},  # naive
    {"trigger_at": T0.replace(year=1999)},  # outside the storable range
    {"expires_at": T0},  # at or before trigger_at
    {"user_id": "a\x00b"},  # NUL
    {"event_type": ""},
    {"external_key": "k" * 201},
    {"facts": {**reminder_facts(), "far": float("inf")}},  # what jsonb cannot hold (1e400 in JSON)
]


@pytest.mark.clause("EMB-14")
@pytest.mark.parametrize("change", BAD_EVENTS, ids=lambda change: ",".join(change))
def test_what_the_post_refuses_with_a_422_schedule_refuses_with_invalid_event_and_the_same_body(
    host_engine: Engine, host_service: SchedulerService, change: dict[str, Any],
) -> None:
    """EMB-14: for each malformed event the POST's 422 body is ``InvalidEvent.body``, its
    ``errors`` name the fields, and nothing of the host's transaction is stored by it."""
    fields: dict[str, Any] = {"event_type": "commitment_reminder", "user_id": "participant-1",
                              "trigger_at": LATER, "facts": reminder_facts(), **change}
    posted = {name: value.isoformat() if hasattr(value, "isoformat") else value
              for name, value in fields.items() if value is not None}
    with TestClient(host_service.app) as client:
        answer = client.post("/admin/scheduled-events", content=json.dumps(posted).replace("Infinity", "1e400"),
                             headers={**INGEST, "content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    with Session(host_engine) as session, pytest.raises(scheduler.InvalidEvent) as refused:
        scheduler.schedule(session, service=host_service, **fields)
    assert refused.value.body == answer.json()
    assert refused.value.errors and all(set(e) == {"field", "message"} for e in refused.value.errors)
    assert _events(host_engine) == []


@pytest.mark.clause("EMB-14")
def test_facts_that_are_not_json_are_an_invalid_event_naming_facts(host_service: SchedulerService,
                                                                    host_engine: Engine) -> None:
    """EMB-14: Python values JSON cannot carry (a set) are refused naming ``facts``, not a TypeError."""
    with Session(host_engine) as session, pytest.raises(scheduler.InvalidEvent) as refused:
        scheduler.schedule(session, service=host_service, event_type="commitment_reminder", user_id="p",
                           trigger_at=LATER, facts={**reminder_facts(), "tags": {"a"}})
    assert [e["field"] for e in refused.value.errors] == ["facts"]


@pytest.mark.clause("EMB-15")
def test_a_reminder_scheduled_in_the_hosts_transaction_wakes_prompt_replicas_on_commit_only(
    host_engine: Engine, host_service: SchedulerService, database_url: str,
) -> None:
    """EMB-15: a LISTEN connection on the due channel hears nothing while the host's transaction
    is open, nothing of a rolled-back reminder, and the committed one's time after the commit."""
    dsn = host_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {DUE_CHANNEL}")
        with Session(host_engine) as session:
            _save_with_reminder(session, host_service, 1)
            assert list(listener.notifies(timeout=0.05)) == []  # nothing before the commit
            session.rollback()
        with Session(host_engine) as session:
            session.execute(text("INSERT INTO public.commitments VALUES (2, 'run')"))
            scheduler.schedule(session, service=host_service, event_type="commitment_reminder",
                               user_id="participant-1", trigger_at=LATER + timedelta(hours=1), facts=reminder_facts())
            session.commit()
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    # the first announcement is the committed reminder's: the rolled-back one never came
    assert heard == [(LATER + timedelta(hours=1)).isoformat(timespec="microseconds")]


@pytest.mark.clause("EMB-13")
def test_a_cancel_in_the_hosts_transaction_is_audited_and_undone_by_its_rollback(
    host_engine: Engine, host_service: SchedulerService,
) -> None:
    """EMB-13: ``scheduler.cancel`` by key: rolled back, the row stays pending and no audit
    entry is left; committed, it is cancelled and the audit names the host as its source."""
    with Session(host_engine) as session:
        _save_with_reminder(session, host_service, 1, external_key="commitment-1")
        session.commit()
    with Session(host_engine) as session:
        session.execute(text("DELETE FROM public.commitments WHERE id = 1"))
        assert scheduler.cancel(session, service=host_service, external_key="commitment-1").outcome == "cancelled"
        session.rollback()
    assert [e["status"] for e in _events(host_engine)] == ["pending"] and _commitments(host_engine) == [1]
    with Session(host_engine) as session:
        session.execute(text("DELETE FROM public.commitments WHERE id = 1"))
        result = scheduler.cancel(session, service=host_service, external_key="commitment-1", reason="deleted")
        session.commit()
    assert result.outcome == "cancelled"
    assert [e["status"] for e in _events(host_engine)] == ["cancelled"] and _commitments(host_engine) == []
    with host_engine.connect() as conn:
        audit = conn.execute(text("SELECT actor, source, action, count FROM scheduler.operator_actions")).all()
    assert [tuple(row) for row in audit] == [("host", "host", "cancel", 1)]


@pytest.mark.clause("EMB-13")
def test_schedule_async_on_an_async_session_commits_and_rolls_back_with_it(
    host_engine: Engine, host_service: SchedulerService,
) -> None:
    """EMB-13: on an ``AsyncSession`` (psycopg's async driver) the same: its rollback takes the
    host's row and the reminder, its commit keeps both; ``cancel_async`` likewise."""
    url = host_engine.url.set(drivername="postgresql+psycopg_async")

    async def run() -> None:
        async_engine = create_async_engine(url)
        try:
            for commit in (False, True):
                async with AsyncSession(async_engine) as session:
                    await session.execute(text("INSERT INTO public.commitments VALUES (1, 'walk')"))
                    await scheduler.schedule_async(session, service=host_service, event_type="commitment_reminder",
                                                   user_id="participant-1", trigger_at=LATER, facts=reminder_facts(),
                                                   external_key="commitment-1")
                    await (session.commit() if commit else session.rollback())
                assert len(_commitments(host_engine)) == len(_events(host_engine)) == int(commit)
            async with AsyncSession(async_engine) as session:
                result = await scheduler.cancel_async(session, service=host_service, external_key="commitment-1")
                await session.commit()
            assert result.outcome == "cancelled"
        finally:
            await async_engine.dispose()

    asyncio.run(run())
    assert [e["status"] for e in _events(host_engine)] == ["cancelled"]
