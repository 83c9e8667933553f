"""The service's database is an object of its own (DEC-DB): two services with two schemas in one
process each keep to their own tables (EMB-11); a host's other engines carry no listener of the
scheduler's (EMB-12); the schema's name is refused when it is PostgreSQL's own, and a reserved
word works everywhere, quoted (EMB-13)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.database import pipeline
from scheduler.database.database import Database
from scheduler.database.engine import make_engine, migrate
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.rules import load_catalogue
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, T0, TEST_SECRET
from tests.helpers import post_event

# SQLAlchemy's events a listener of the scheduler's could hear on a host's engine.
ENGINE_EVENTS = ("before_cursor_execute", "after_cursor_execute", "begin", "commit", "rollback", "savepoint",
                 "engine_connect")
# (not "connect": SQLAlchemy's own dialect listeners are there on every engine)
POOL_EVENTS = ("checkin", "checkout", "reset", "invalidate", "close")


def _service(database_url: str, schema: str, clock: ManualClock) -> SchedulerService:
    """A service that builds its own engines from the URL, as ``scheduler serve`` does."""
    settings = Settings(database_url=database_url, database_schema=schema, jwt_secret=TEST_SECRET)
    return SchedulerService(settings, clock=clock, run_scheduler=False)


def _dispose(*services: SchedulerService) -> None:
    for service in services:
        service.engine.dispose()
        service.loop_engine.dispose()


def _count(engine: Engine, schema: str, table: str, **where: Any) -> int:
    condition = " AND ".join(f"{column} = :{column}" for column in where) or "true"
    with engine.connect() as conn:
        return int(conn.execute(text(f'SELECT count(*) FROM "{schema}".{table} WHERE {condition}'), where).scalar_one())


def _listed_users(client: TestClient) -> list[str]:
    answer = client.get("/admin/scheduled-events", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return sorted(row["user_id"] for row in answer.json())


@pytest.mark.clause("DEC-DB")
@pytest.mark.clause("EMB-16")
def test_two_services_with_two_schemas_in_one_process_each_create_store_poll_and_list_only_their_own_rows(
    database_url: str, engine: Engine, clock: ManualClock
) -> None:
    """EMB-11: services with schemas ``a`` and ``b`` built one after the other in one process,
    on one database: each migrates its own tables, stores its own events, and its loop and its
    list see only its own rows; the notifications land in its own schema."""
    for schema in ("a", "b"):
        assert migrate(engine, schema=schema).sentence().startswith(f"created schema {schema} ")
    a = _service(database_url, "a", clock)
    b = _service(database_url, "b", clock)  # built after a: nothing of a's changes
    try:
        with TestClient(a.app) as to_a, TestClient(b.app) as to_b:
            post_event(to_a, user_id="alice", trigger_at=T0)
            post_event(to_b, user_id="bob", trigger_at=T0)
            post_event(to_b, user_id="bea", trigger_at=T0)
            assert _listed_users(to_a) == ["alice"]
            assert _listed_users(to_b) == ["bea", "bob"]
            assert a.scheduler.poll_once().claimed == 1
            assert b.scheduler.poll_once().claimed == 2
        assert (_count(engine, "a", "scheduled_events", status="dispatched"),
                _count(engine, "b", "scheduled_events", status="dispatched")) == (1, 2)
        assert (_count(engine, "a", "notifications", user_id="alice"),
                _count(engine, "b", "notifications", user_id="alice")) == (1, 0)
        assert _count(engine, "b", "notifications") == 2
        assert _count(engine, "scheduler", "scheduled_events") == 0  # the default schema was never touched
        assert (a.database.schema, b.database.schema) == ("a", "b")
    finally:
        _dispose(a, b)


@pytest.mark.clause("EMB-16")
def test_a_dispatcher_built_for_another_schema_is_refused_in_a_sentence(engine: Engine, clock: ManualClock) -> None:
    """EMB-11: a ``NudgingPlatform`` the host built on the default schema's decisions, handed to a
    service of schema ``a``, would write its notifications into ``scheduler``: a ``ConfigError``
    naming both schemas; built with the service's schema it is taken."""
    catalogue = load_catalogue(None)
    settings = Settings(jwt_secret=TEST_SECRET, database_schema="a")
    with pytest.raises(ConfigError, match="decides in schema 'scheduler', the service's is 'a'"):
        SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False,
                         dispatcher=NudgingPlatform(catalogue))
    mine = NudgingPlatform(catalogue, decisions=Database(engine, "a").decisions)
    assert SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False,
                            dispatcher=mine).dispatcher is mine


@pytest.fixture
def host_engine(database_url: str) -> Iterator[Engine]:
    """A host's engine, made with plain SQLAlchemy."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def _listeners(target: Any, names: tuple[str, ...]) -> dict[str, list[Any]]:
    return {name: list(getattr(target.dispatch, name)) for name in names if list(getattr(target.dispatch, name))}


@pytest.mark.clause("DEC-DB")
@pytest.mark.clause("EMB-17")
def test_a_hosts_other_engine_in_the_same_process_carries_no_listener_of_the_scheduler_and_none_fires(
    database_url: str, host_engine: Engine, clock: ManualClock
) -> None:
    """EMB-12: a service on a host's engine (and one building its own) puts no listener on the
    host's engine nor on SQLAlchemy's ``Engine`` or ``Pool`` classes: the host's other engine, made
    after them, has none (an engine's listeners include its classes'); a transaction on it sends
    exactly what the host sends, and the pipeline's listeners are on the service's own engines (its
    view of the host's)."""
    settings = Settings(jwt_secret=TEST_SECRET)
    hosted = SchedulerService(settings, engine=host_engine, clock=clock, run_scheduler=False)
    own = _service(database_url, "scheduler", clock)
    try:
        with TestClient(hosted.app) as client:
            post_event(client)
            assert hosted.scheduler.poll_once().claimed == 1
        assert _listeners(host_engine, ENGINE_EVENTS) == {}
        assert _listeners(host_engine.pool, POOL_EVENTS) == {}
        other = create_engine(database_url)  # the host's other engine, made after the services
        try:
            assert _listeners(other, ENGINE_EVENTS) == {} and _listeners(other.pool, POOL_EVENTS) == {}
            sent: list[str] = []
            event.listen(other, "before_cursor_execute", lambda conn, cursor, sql, *rest: sent.append(sql))
            with other.begin() as conn:
                conn.execute(text("SELECT 1"))
            assert sent == ["SELECT 1"]  # nothing of the scheduler's ran ahead of it
        finally:
            other.dispose()
        for engine in (hosted.engine, hosted.loop_engine, own.engine, own.loop_engine):
            assert pipeline.attached(engine)
        assert hosted.engine is not host_engine  # the service works through a view of its own
    finally:
        hosted.loop_engine.dispose()
        _dispose(own)


@pytest.mark.clause("EMB-17")
def test_closing_a_database_takes_the_pipelines_listeners_off_its_engine(engine: Engine) -> None:
    """EMB-12: ``Database.close`` leaves the engine as it found it: no listener of the pipeline."""
    plain = create_engine(engine.url)
    try:
        database = Database(plain)
        assert pipeline.attached(plain)
        database.close()
        assert _listeners(plain, ENGINE_EVENTS) == {}
    finally:
        plain.dispose()


@pytest.mark.clause("DEC-SCHEMA-NAME")
@pytest.mark.clause("EMB-18")
@pytest.mark.parametrize("name", ["information_schema", "pg_catalog", "pg_toast", "pg_temp_1", "public"])
def test_a_schema_of_postgresqls_own_is_refused_in_a_sentence_naming_the_variable(name: str, engine: Engine) -> None:
    """EMB-13: ``SCHEDULER_DATABASE_SCHEMA`` naming a system schema (or ``public``) is a
    ``ConfigError`` naming the variable, before anything is created; so is a ``Database``."""
    with pytest.raises(ConfigError, match=rf"SCHEDULER_DATABASE_SCHEMA .*{name}"):
        Settings.from_env({"SCHEDULER_DATABASE_SCHEMA": name})
    with pytest.raises(ConfigError, match=name):
        Database(engine, name)


@pytest.mark.clause("DEC-SCHEMA-NAME")
@pytest.mark.clause("EMB-18")
@pytest.mark.parametrize("name", ["select", "user", "order", "all"])
def test_a_schema_named_like_a_reserved_word_migrates_stores_polls_and_lists(
    name: str, database_url: str, engine: Engine, clock: ManualClock
) -> None:
    """EMB-13: a reserved word is a schema name like any other: every use of it is quoted (the
    statements, CREATE SCHEMA, Alembic's version table, the history trigger, the sessions'
    search_path), so it migrates, and the service stores, polls and lists in it."""
    Settings.from_env({"SCHEDULER_DATABASE_SCHEMA": name})  # accepted
    assert migrate(engine, schema=name).sentence().startswith(f"created schema {name} ")
    again = migrate(engine, schema=name)  # its version table is found again: nothing to do
    assert again.before == again.after
    service = _service(database_url, name, clock)
    try:
        with TestClient(service.app) as client:
            stored = post_event(client, user_id="quoted", external_key="k-1")
            post_event(client, user_id="quoted", external_key="k-1")  # the upsert by key, and its history
            assert service.scheduler.poll_once().claimed == 1
            assert _listed_users(client) == ["quoted"]
            history = client.get(f"/admin/scheduled-events/{stored['id']}/history", headers=ADMIN)
            assert history.status_code == 200 and len(history.json()) >= 2, history.text
        with service.engine.connect() as conn:  # the service's own sessions find its tables too
            assert conn.execute(text("SHOW search_path")).scalar_one().replace(" ", "") == f'public,"{name}"'
            assert conn.execute(text("SELECT status FROM scheduled_events")).scalar_one() == "dispatched"
        assert _count(engine, name, "notifications", user_id="quoted") == 1
    finally:
        _dispose(service)


@pytest.mark.clause("EMB-18")
def test_the_transaction_pooling_search_path_names_a_reserved_word_quoted(database_url: str, engine: Engine) -> None:
    """EMB-13: behind a transaction pooler the search_path travels per transaction: quoted too."""
    migrate(engine, schema="order")
    pooled = make_engine(database_url, Settings(database_schema="order", transaction_pooling=True))
    try:
        database = Database(pooled, "order")
        with database.begin() as session:
            assert session.execute(text("SHOW search_path")).scalar_one().replace(" ", "") == 'public,"order"'
            assert session.execute(text("SELECT count(*) FROM scheduled_events")).scalar_one() == 0
    finally:
        pooled.dispose()


@pytest.mark.clause("EMB-16")
def test_a_scheduler_is_handed_the_database_it_polls_and_refuses_anything_else(
    engine: Engine, clock: ManualClock
) -> None:
    """EMB-16: ``Scheduler`` takes a ``Database`` (its schema's statements); a sessionmaker or
    an engine, which name no schema, is a ``TypeError`` saying what it takes."""
    from sqlalchemy.orm import sessionmaker

    from scheduler.core.loop import Scheduler

    loop = Scheduler(Database(engine), NudgingPlatform(load_catalogue(None)), clock)
    assert loop.database.schema == "scheduler" and loop.poll_once().claimed == 0
    for given in (sessionmaker(engine), engine):
        with pytest.raises(TypeError, match="takes the Database it polls"):
            Scheduler(given, NudgingPlatform(load_catalogue(None)), clock)  # type: ignore[arg-type]
