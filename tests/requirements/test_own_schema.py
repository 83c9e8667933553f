"""The scheduler's schema of its own (DEC-SCHEMA): beside a host's tables and Alembic history,
a deployment from before it moved in place with nothing lost, and ``scheduler migrate``
saying what it did, or why it cannot, in a sentence."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, create_engine, make_url, text

from scheduler.cli import main
from scheduler.database.engine import drop_database, ensure_database, make_engine, migrate
from scheduler.database.queries import TABLES
from scheduler.database.schema import MigrationError, alembic_config, head_revision

LEGACY_HEAD = "0007_participant_index"  # main's head before the schema of its own


@pytest.fixture
def empty_database_url(database_url: str) -> Iterator[str]:
    """A database with nothing in it (not cloned from the migrated template), dropped after."""
    admin = make_url(database_url).set(database="postgres").render_as_string(hide_password=False)
    name = f"empty_{secrets.token_hex(4)}"
    ensure_database(admin, name)
    try:
        yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        drop_database(admin, name)


@pytest.fixture
def plain(empty_database_url: str) -> Iterator[Engine]:
    """A plain engine (the server's default search_path, ``"$user", public``), as a host's is."""
    engine = create_engine(empty_database_url)
    yield engine
    engine.dispose()


def _legacy_layout(engine: Engine) -> None:
    """The layout of a deployment at main's head before the schema of its own: 0001..0007
    applied into ``public`` with the version row in ``public.alembic_version``."""
    config = alembic_config("public")
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, LEGACY_HEAD)


LEGACY_ROWS = """
INSERT INTO public.scheduled_events (id, event_type, user_id, community_id, external_key, trigger_at, facts,
    status, last_error, created_at, updated_at, dispatched_at, traceparent)
VALUES ('ev-1', 'reminder', 'user-1', 'c-1', 'key-1', '2026-11-30T09:00:00Z', '{"a": 1}', 'pending', NULL,
        '2026-11-29T09:00:00Z', '2026-11-29T09:00:00Z', NULL, NULL),
       ('ev-2', 'reminder', 'user-2', NULL, NULL, '2026-11-28T09:00:00Z', '{"b": [2]}', 'dispatched', NULL,
        '2026-11-27T09:00:00Z', '2026-11-28T09:00:01Z', '2026-11-28T09:00:01Z',
        '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
UPDATE public.scheduled_events SET status = 'failed', last_error = 'boom', updated_at = '2026-11-30T10:00:00Z'
WHERE id = 'ev-1';
INSERT INTO public.notifications (id, user_id, community_id, rule_id, kind, scenario, time_scope, dedup_key,
    title, body, status, reason, source, scheduled_event_id, created_at, stream_seq)
VALUES ('n-1', 'user-2', NULL, 'rule', 'reminder', 'commitment', 'day', 'dk-1', 'Title', 'Body', 'sent', NULL,
        'scheduled', 'ev-2', '2026-11-28T09:00:01Z', nextval('public.notification_stream_seq'));
INSERT INTO public.dedup_keys (key, notification_id, created_at) VALUES ('dk-1', 'n-1', '2026-11-28T09:00:01Z');
INSERT INTO public.deliveries (notification_id, user_id, channel, status, detail, created_at)
VALUES ('n-1', 'user-2', 'web', 'sent', NULL, '2026-11-28T09:00:01Z');
INSERT INTO public.participant_preferences (user_id, enabled_kinds, max_per_day, updated_at)
VALUES ('user-2', ARRAY['reminder'], 5, '2026-11-01T00:00:00Z');
INSERT INTO public.scheduler_maintenance (task, last_run_at) VALUES ('retention', '2026-11-30T08:00:00Z');
INSERT INTO public.scheduler_replicas (replica_id, name, host, pid, mode, poll_seconds, started_at, last_poll_at,
    seen_at, last_error, consecutive_failures, polls, dispatched, failed)
VALUES ('r-1', 'replica', 'host', 42, 'literal', 30, '2026-11-30T08:00:00Z', NULL, '2026-11-30T08:00:00Z', NULL,
        0, 7, 1, 1);
INSERT INTO public.operator_actions (at, actor, source, action, event_id, filter, count, reason)
VALUES ('2026-11-30T10:00:00Z', 'ops', 'cli', 'reset', 'ev-1', NULL, 1, 'retry');
INSERT INTO public.operator_action_events (action_id, event_id)
SELECT id, 'ev-1' FROM public.operator_actions;
INSERT INTO public.web_sessions (id, secret_hash, subject, kind, created_at, expires_at, last_seen_at,
    idle_seconds, user_agent)
VALUES ('s-1', repeat('a', 64), 'ops', 'admin', '2026-11-30T08:00:00Z', '2026-11-30T16:00:00Z',
        '2026-11-30T08:00:00Z', 1800, 'test');
"""


# Columns later revisions than LEGACY_HEAD add (NULL on every moved row; migration 0009's expiry).
ADDED_SINCE_LEGACY = {"scheduled_events": ("expires_at",)}


def _contents(conn: Connection, schema: str) -> dict[str, list[Any]]:
    """Every row of every table of ours in ``schema``, as JSON, in a stable order; a column a
    revision after LEGACY_HEAD added is left out once checked to be NULL on every row."""
    contents: dict[str, list[Any]] = {}
    for table in TABLES:
        rows = list(conn.execute(text(f"SELECT to_jsonb(t) FROM {schema}.{table} AS t ORDER BY 1::text")).scalars())
        for column in ADDED_SINCE_LEGACY.get(table, ()):
            assert all(row.pop(column, None) is None for row in rows), f"{table}.{column} is set on a moved row"
        contents[table] = rows
    return contents


def _relations_in(conn: Connection, schema: str) -> set[str]:
    return set(conn.execute(text(
        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = :schema AND c.relkind IN ('r', 'S')"), {"schema": schema}).scalars())


@pytest.mark.clause("DEC-SCHEMA")
@pytest.mark.clause("EMB-1")
def test_a_fresh_database_gets_every_object_and_the_version_table_in_the_schema_of_its_own(plain: Engine) -> None:
    """EMB-1: every table, the sequence, the trigger functions and Alembic's version table are
    created in the schema ``scheduler``; nothing in ``public``."""
    result = migrate(plain)
    assert result.sentence() == f"created schema scheduler at revision {head_revision()}"
    with plain.connect() as conn:
        assert _relations_in(conn, "public") == set()
        assert {*TABLES, "alembic_version", "notification_stream_seq"} <= _relations_in(conn, "scheduler")
        functions = set(conn.execute(text(
            "SELECT p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'scheduler'")).scalars())
        assert functions == {"scheduled_events_history", "scheduled_events_announce_due"}


@pytest.mark.clause("EMB-1")
def test_a_database_holding_a_hosts_alembic_history_and_tables_of_the_same_names_migrates_cleanly(
    plain: Engine,
) -> None:
    """EMB-1: beside the host's ``public.alembic_version`` ('host_0001_users') and its own
    ``public.notifications``, migrate creates the scheduler's schema and leaves both alone; the
    history trigger, fired from a session whose search_path is the host's, writes our table."""
    with plain.begin() as conn:
        conn.execute(text("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO public.alembic_version VALUES ('host_0001_users')"))
        conn.execute(text("CREATE TABLE public.notifications (id serial PRIMARY KEY, message text NOT NULL)"))
        conn.execute(text("INSERT INTO public.notifications (message) VALUES ('the host''s own')"))
        conn.execute(text("CREATE TABLE public.scheduled_event_history (id int)"))
    assert migrate(plain).sentence() == f"created schema scheduler at revision {head_revision()}"
    assert migrate(plain).sentence() == f"schema scheduler already at revision {head_revision()}"
    with plain.begin() as conn:
        assert conn.execute(text("SELECT version_num FROM public.alembic_version")).scalars().all() == [
            "host_0001_users"]
        assert conn.execute(text("SELECT id, message FROM public.notifications")).all() == [(1, "the host's own")]
        conn.execute(text(
            "INSERT INTO scheduler.scheduled_events (id, event_type, user_id, trigger_at, facts, created_at, "
            "updated_at) VALUES ('e', 't', 'u', now(), '{}', now(), now())"))
        assert conn.execute(text("SELECT count(*) FROM scheduler.scheduled_event_history")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM public.scheduled_event_history")).scalar_one() == 0


@pytest.mark.clause("DEC-SCHEMA")
@pytest.mark.clause("EMB-2")
@pytest.mark.parametrize("host_row", [False, True], ids=["only-ours", "beside-a-hosts-row"])
def test_a_deployment_at_the_old_head_in_public_is_moved_into_the_schema_with_nothing_lost(
    plain: Engine, host_row: bool,
) -> None:
    """EMB-2: a database migrated by the old layout (0001..0007 in public, rows in every table)
    is moved into the schema in place: every row of every table the same after, the sequences
    continuing, the triggers firing, public.alembic_version dropped when it held only our row
    (a host's row stays, in it)."""
    _legacy_layout(plain)
    with plain.begin() as conn:
        conn.execute(text(LEGACY_ROWS))
        if host_row:
            conn.execute(text("INSERT INTO public.alembic_version VALUES ('host_0001_users')"))
        before = _contents(conn, "public")
        assert all(before[table] for table in TABLES), {t: len(rows) for t, rows in before.items()}
        last_seq = conn.execute(text("SELECT last_value FROM public.notification_stream_seq")).scalar_one()
    result = migrate(plain)
    assert result.moved_from_public and (result.before, result.after) == (LEGACY_HEAD, head_revision())
    assert result.sentence() == (f"moved the scheduler's tables from public into schema scheduler at revision "
                                 f"{LEGACY_HEAD}, then upgraded from {LEGACY_HEAD} to {head_revision()}")
    with plain.begin() as conn:
        assert _contents(conn, "scheduler") == before
        assert _relations_in(conn, "public") == ({"alembic_version"} if host_row else set())
        if host_row:
            assert conn.execute(text("SELECT version_num FROM public.alembic_version")).scalars().all() == [
                "host_0001_users"]
        assert conn.execute(text("SELECT version_num FROM scheduler.alembic_version")).scalars().all() == [
            head_revision()]
        assert conn.execute(text("SELECT nextval('scheduler.notification_stream_seq')")).scalar_one() == last_seq + 1
        # an identity column's sequence moved with its table; the history trigger still fires
        new_id = conn.execute(text(
            "INSERT INTO scheduler.deliveries (notification_id, user_id, channel, status, created_at) "
            "VALUES ('n-1', 'user-2', 'email', 'sent', now()) RETURNING id")).scalar_one()
        assert new_id == max(row["id"] for row in before["deliveries"]) + 1
        conn.execute(text("UPDATE scheduler.scheduled_events SET status = 'pending', updated_at = now() "
                          "WHERE id = 'ev-1'"))
        changes = conn.execute(text("SELECT change FROM scheduler.scheduled_event_history WHERE event_id = 'ev-1' "
                                    "ORDER BY id")).scalars().all()
        assert changes == ["stored", "failed", "pending"]
    assert migrate(plain).sentence() == f"schema scheduler already at revision {head_revision()}"


@pytest.mark.clause("EMB-2")
def test_a_hosts_revision_named_like_ours_without_our_tables_is_refused_and_nothing_changes(plain: Engine) -> None:
    """EMB-2: ``public.alembic_version`` at '0001' (a host's revision of the same name as one
    of ours) but no ``public.scheduled_events``: not a deployment of ours to move."""
    with plain.begin() as conn:
        conn.execute(text("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO public.alembic_version VALUES ('0001')"))
    with pytest.raises(MigrationError, match="public has no scheduled_events table"):
        migrate(plain)
    with plain.connect() as conn:
        assert conn.execute(text("SELECT to_regnamespace('scheduler')")).scalar_one() is None


@pytest.mark.clause("EMB-3")
def test_migrate_says_it_created_the_schema_then_that_it_is_already_at_the_head(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-3: ``scheduler migrate`` on an empty database prints "created schema scheduler at
    revision R", then "already at revision R"."""
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"created schema scheduler at revision {head_revision()}\n"
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"schema scheduler already at revision {head_revision()}\n"


@pytest.mark.clause("EMB-3")
def test_migrate_says_it_upgraded_from_one_revision_to_the_next(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-3: a schema at an older revision of ours: "upgraded from R1 to R2"."""
    engine = make_engine(empty_database_url)
    try:
        migrate(engine, LEGACY_HEAD)
    finally:
        engine.dispose()
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"schema scheduler: upgraded from {LEGACY_HEAD} to {head_revision()}\n"


@pytest.mark.clause("EMB-3")
def test_an_unknown_revision_in_our_version_table_is_a_sentence_and_exit_2(
    plain: Engine, empty_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-3: a revision this code does not know (a newer release's) in scheduler.alembic_version:
    one sentence on stderr naming it, exit 2, no traceback, nothing changed."""
    migrate(plain)
    with plain.begin() as conn:
        conn.execute(text("UPDATE scheduler.alembic_version SET version_num = '0099_from_the_future'"))
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("database error: scheduler.alembic_version holds revision '0099_from_the_future'")
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1
    with plain.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM scheduler.alembic_version")).scalar_one() == (
            "0099_from_the_future")


@pytest.mark.clause("EMB-3")
def test_permission_denied_is_a_sentence_and_exit_2(
    plain: Engine, empty_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-3: a role that may not create the schema: a sentence saying what it needs, exit 2."""
    role = f"limited_{secrets.token_hex(4)}"
    with plain.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"REVOKE CREATE ON DATABASE {make_url(empty_database_url).database} FROM PUBLIC"))
    try:
        monkeypatch.setenv("DATABASE_URL", make_url(empty_database_url).set(username=role, password=None)
                           .set(drivername="postgresql").render_as_string(hide_password=False))
        assert main(["migrate"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("database error: permission denied migrating schema scheduler on ")
        assert "needs CREATE on the database" in err and "Traceback" not in err
    finally:
        with plain.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))


@pytest.mark.clause("EMB-3")
def test_an_unreachable_database_is_a_sentence_and_exit_2(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-3: nothing listening where DATABASE_URL points: "cannot reach the database", exit 2."""
    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres@/scheduler?host={tmp_path}")
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("database error: cannot reach the database at ") and "Traceback" not in err
