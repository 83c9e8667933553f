"""A host's engine (DEC-HOST-ENGINE): the service's timeouts inside every scheduler transaction
on it, the host's own transactions untouched, the loop on a small pool of its own made like
it, and every statement naming the scheduler's schema (DEC-SCHEMA) so that a host's tables
of the same names in ``public`` are never read or written."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.database.host_engine import HostEngineWarning
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.conftest import ADMIN, T0, TEST_SECRET
from tests.helpers import post_event

SHOW = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def _shown(session: Session | Any) -> tuple[str, ...]:
    return tuple(str(session.execute(text(f"SHOW {name}")).scalar_one()) for name in SHOW)


class ShowingDispatcher:
    """A fake host dispatcher: reads the timeouts from inside the scheduler's transaction."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.seen.append(_shown(session))
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


@pytest.fixture
def host_engine(database_url: str) -> Iterator[Engine]:
    """The host's own engine: plain ``create_engine``, no timeouts (PostgreSQL's 0)."""
    engine = create_engine(database_url, pool_size=3)
    yield engine
    engine.dispose()


def _service(host_engine: Engine, **kwargs: Any) -> SchedulerService:
    settings = Settings(jwt_secret=TEST_SECRET, poll_seconds=30.0, batch_size=20)
    return SchedulerService(settings, engine=host_engine, clock=ManualClock(T0), run_scheduler=False, **kwargs)


@pytest.mark.clause("DEC-HOST-ENGINE")
@pytest.mark.clause("EMB-4")
def test_scheduler_transactions_on_a_hosts_engine_carry_the_timeouts_and_the_hosts_own_do_not(
    host_engine: Engine,
) -> None:
    """EMB-4: ``SHOW`` inside the loop's transaction (a host dispatcher's) and a request's
    reads 30 s / 10 s / 10 s on the host's engine; the host's own transactions on it still 0."""
    dispatcher = ShowingDispatcher()
    service = _service(host_engine, dispatcher=dispatcher)
    try:
        with TestClient(service.app) as client:
            post_event(client)
            assert service.scheduler.poll_once().claimed == 1
        assert dispatcher.seen == [("30s", "10s", "10s")]
        with service.sessions() as session:
            assert _shown(session) == ("30s", "10s", "10s")
        with host_engine.connect() as conn:
            assert _shown(conn) == ("0", "0", "0")
    finally:
        service.loop_engine.dispose()


@pytest.mark.clause("EMB-4")
def test_the_timeouts_travel_with_the_polls_first_statement_in_one_message(host_engine: Engine) -> None:
    """EMB-4: on a host's engine the poll's timeouts are not a round trip of their own: the
    ``set_config`` command goes in the claim's message (the pipeline's), ahead of the claim."""
    service = _service(host_engine)
    sent: list[tuple[str, str]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        words = " ".join(line.split("--", 1)[0] for line in statement.splitlines()).split()
        kind = "SETTINGS" if "set_config('statement_timeout'" in statement else words[0].upper()
        sent.append((kind, type(context).__name__))

    try:
        with TestClient(service.app) as client:
            post_event(client)
        event.listen(service.loop_engine, "before_cursor_execute", record)
        event.listen(service.loop_engine, "begin", lambda conn: sent.append(("BEGIN", "")))
        assert service.scheduler.poll_once().claimed == 1
        claim = next(i for i, (kind, _) in enumerate(sent) if kind == "WITH")
        assert sent[claim - 1][0] == "SETTINGS" and sent[claim - 1][1] == sent[claim][1] == "SimpleNamespace"
        kinds = [kind for kind, _ in sent]
        assert kinds.count("SETTINGS") == kinds.count("BEGIN") >= 1  # once per transaction
    finally:
        service.loop_engine.dispose()


@pytest.mark.clause("DEC-HOST-ENGINE")
@pytest.mark.clause("EMB-5")
def test_the_loop_gets_a_small_pool_of_its_own_made_like_the_hosts_engine(host_engine: Engine) -> None:
    """EMB-5: the loop's pool is not the host's: same URL, two connections, the service's
    timeouts; a loop_engine the host passes is used as it is given (with the timeouts)."""
    service = _service(host_engine)
    try:
        assert service.loop_engine.pool is not host_engine.pool
        assert service.engine.pool is host_engine.pool
        assert service.loop_engine.url == host_engine.url
        assert service.loop_engine.pool.size() == 2  # type: ignore[attr-defined]
        with service.loop_engine.connect() as conn:
            assert _shown(conn) == ("30s", "10s", "10s")
    finally:
        service.loop_engine.dispose()
    passed = create_engine(host_engine.url, pool_size=1)
    try:
        given = _service(host_engine, loop_engine=passed)
        assert given.loop_engine.pool is passed.pool
        with given.loop_engine.connect() as conn:
            assert _shown(conn) == ("30s", "10s", "10s")
    finally:
        passed.dispose()


@pytest.mark.clause("EMB-5")
def test_a_host_engine_on_another_driver_is_refused_with_a_sentence() -> None:
    """EMB-5: an engine not on psycopg 3 is a ConfigError naming the driver and what to use."""
    with pytest.raises(ConfigError, match=r"uses sqlite\+pysqlite; the scheduler runs on PostgreSQL through "
                                          r"psycopg 3 only: create it with a postgresql\+psycopg:// URL"):
        _service(create_engine("sqlite://"))


@pytest.mark.clause("EMB-5")
def test_a_host_engine_that_cannot_carry_the_timeouts_gets_a_warning_naming_them(database_url: str) -> None:
    """EMB-5: an AUTOCOMMIT engine has no transaction to give the timeouts: a warning names each."""
    autocommit = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with pytest.warns(HostEngineWarning, match="AUTOCOMMIT: its transactions cannot be given statement_timeout="
                                                   "30000, lock_timeout=10000, idle_in_transaction_session_timeout="
                                                   "10000") as caught:
            service = _service(autocommit)
        assert len(caught) == 1  # the requests' engine; the loop's own pool has transactions
        with service.loop_engine.connect() as conn:
            assert _shown(conn) == ("30s", "10s", "10s")
        service.loop_engine.dispose()
    finally:
        autocommit.dispose()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = create_engine(database_url)
        try:
            _service(plain).loop_engine.dispose()  # a plain engine: no warning
        finally:
            plain.dispose()


DECOYS = ["scheduled_events", "notifications", "dedup_keys", "deliveries", "participant_preferences",
          "scheduled_event_history", "scheduler_replicas", "operator_actions", "web_sessions"]


@pytest.mark.clause("DEC-SCHEMA")
@pytest.mark.clause("EMB-1")
def test_every_statement_names_the_schema_so_a_hosts_tables_of_the_same_names_are_never_touched(
    host_engine: Engine,
) -> None:
    """EMB-1: with the host's own tables of our names in ``public`` (of another shape, so a
    statement that named no schema would fail) and the host's search_path, the whole path works
    on the host's engine: store, re-post by key, dispatch through the real platform, list,
    show, history, the operator pages, reset, cancel; the host's tables keep their one row."""
    with host_engine.begin() as conn:
        for table in DECOYS:
            conn.execute(text(f"CREATE TABLE public.{table} (host_column text)"))
            conn.execute(text(f"INSERT INTO public.{table} VALUES ('the host''s')"))
    service = _service(host_engine)
    try:
        with TestClient(service.app) as client:
            first = post_event(client, external_key="k-1")
            assert post_event(client, external_key="k-1")["id"] == first["id"]
            later = post_event(client, trigger_at="2026-12-01T09:00:00+00:00")
            report = service.scheduler.poll_once()
            assert (report.claimed, report.dispatched) == (1, 1)
            assert client.get(f"/admin/scheduled-events/{first['id']}", headers=ADMIN).json()["status"] == "dispatched"
            assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 200
            assert client.get(f"/admin/scheduled-events/{first['id']}/history", headers=ADMIN).status_code == 200
            for page in ("/admin/notifications", "/admin/replicas", "/admin/audit", "/metrics"):
                assert client.get(page, headers=ADMIN).status_code == 200, page
            assert client.post(f"/admin/scheduled-events/{first['id']}/reset", headers=ADMIN).status_code == 200
            assert client.delete(f"/admin/scheduled-events/{later['id']}", headers=ADMIN).status_code == 200
        with host_engine.connect() as conn:
            for table in DECOYS:
                assert conn.execute(text(f"SELECT host_column FROM public.{table}")).scalars().all() == ["the host's"]
            assert conn.execute(text("SELECT count(*) FROM scheduler.notifications")).scalar_one() == 1
    finally:
        service.loop_engine.dispose()


@pytest.mark.clause("DEC-HOST-ENGINE")
@pytest.mark.clause("EMB-12")
@pytest.mark.parametrize("facade", [False, True], ids=["async_engine", "its_sync_engine"])
def test_an_async_engine_is_served_through_its_sync_psycopg_twin_with_its_connect_arguments_and_pool_size(
    database_url: str, facade: bool,
) -> None:
    """EMB-12: ``create_async_engine("postgresql+psycopg_async://...")`` (or its ``sync_engine``)
    is accepted: the service's requests and loop run on a sync psycopg twin that connects with
    the host's connect arguments (its ``application_name``), its pool sized as the host's, the
    timeouts per transaction, and a posted event is dispatched; the twins are the service's to
    dispose, the host's async engine is left open."""
    from sqlalchemy.ext.asyncio import create_async_engine

    url = make_url(database_url).set(drivername="postgresql+psycopg_async")
    async_engine = create_async_engine(url, connect_args={"application_name": "host-app"}, pool_size=4,
                                       max_overflow=1)
    dispatcher = ShowingDispatcher()
    service = _service(async_engine.sync_engine if facade else async_engine, dispatcher=dispatcher)  # type: ignore[arg-type]
    try:
        assert service.engine.dialect.driver == "psycopg" and not service.engine.dialect.is_async
        pool = service.engine.pool
        assert isinstance(pool, QueuePool) and (pool.size(), pool._max_overflow) == (4, 1)
        with TestClient(service.app) as client:
            post_event(client)
            assert service.scheduler.poll_once().dispatched == 1
        assert dispatcher.seen == [("30s", "10s", "10s")]
        for engine in (service.engine, service.loop_engine):
            with engine.connect() as conn:
                assert conn.execute(text("SHOW application_name")).scalar_one() == "host-app"
    finally:
        asyncio.run(service.stop())

    async def still_open() -> int:
        async with async_engine.connect() as conn:
            answer: int = (await conn.execute(text("SELECT 1"))).scalar_one()
        await async_engine.dispose()
        return answer

    assert asyncio.run(still_open()) == 1  # the host's own engine: not the service's to close


@pytest.mark.clause("EMB-12")
def test_an_async_engine_whose_connect_arguments_cannot_be_copied_is_refused_with_a_sentence(
    database_url: str,
) -> None:
    """EMB-12: an async engine connecting through a function of the host's (``async_creator``)
    is a ConfigError in one sentence saying what to pass instead, before anything is built."""
    from sqlalchemy.ext.asyncio import create_async_engine

    async def connect() -> Any:
        raise AssertionError("never called")

    async_engine = create_async_engine("postgresql+psycopg_async://", async_creator=connect)
    with pytest.raises(ConfigError, match=r"^the async engine passed to SchedulerService \(postgresql\+psycopg\) "
                                          r"has a pool without SQLAlchemy's connect function .*: pass a sync "
                                          r"postgresql\+psycopg:// engine too") as refused:
        _service(async_engine)  # type: ignore[arg-type]
    assert "\n" not in str(refused.value)
