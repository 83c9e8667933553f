"""The scheduler's schema of its own (DEC-SCHEMA): beside a host's tables and Alembic history,
and ``scheduler migrate`` saying what it did, or why it cannot, in a sentence."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, make_url, text

from scheduler.cli import main
from scheduler.database import schema
from scheduler.database.engine import drop_database, ensure_database, make_engine, migrate
from scheduler.database.queries import TABLES
from scheduler.database.schema import head_revision


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
@pytest.mark.clause("EMB-2")
def test_a_database_holding_a_hosts_alembic_history_and_tables_of_the_same_names_migrates_cleanly(
    plain: Engine,
) -> None:
    """EMB-1, EMB-2: beside the host's ``public.alembic_version`` ('host_0001_users', and a revision
    of the host's named like ours) and its own ``public.notifications``, migrate creates the
    scheduler's schema and leaves both alone; the history trigger, fired from a session whose
    search_path is the host's, writes our table."""
    with plain.begin() as conn:
        conn.execute(text("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO public.alembic_version VALUES ('host_0001_users'), (:ours)"),
                     {"ours": head_revision()})
        conn.execute(text("CREATE TABLE public.notifications (id serial PRIMARY KEY, message text NOT NULL)"))
        conn.execute(text("INSERT INTO public.notifications (message) VALUES ('the host''s own')"))
        conn.execute(text("CREATE TABLE public.scheduled_event_history (id int)"))
    assert migrate(plain).sentence() == f"created schema scheduler at revision {head_revision()}"
    assert migrate(plain).sentence() == f"schema scheduler already at revision {head_revision()}"
    with plain.begin() as conn:
        assert sorted(conn.execute(text("SELECT version_num FROM public.alembic_version")).scalars()) == sorted([
            "host_0001_users", head_revision()])
        assert conn.execute(text("SELECT id, message FROM public.notifications")).all() == [(1, "the host's own")]
        conn.execute(text(
            "INSERT INTO scheduler.scheduled_events (id, event_type, user_id, trigger_at, facts, created_at, "
            "updated_at) VALUES ('e', 't', 'u', now(), '{}', now(), now())"))
        assert conn.execute(text("SELECT count(*) FROM scheduler.scheduled_event_history")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM public.scheduled_event_history")).scalar_one() == 0


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


NEXT_REVISION = """
revision = "0002_next"
down_revision = {head!r}
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
"""


@pytest.mark.clause("EMB-3")
def test_migrate_says_it_upgraded_from_one_revision_to_the_next(
    empty_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-3: a schema at an older revision of ours: "upgraded from R1 to R2" (the migrations
    of this release, and a next revision after its head, as a later release would add)."""
    head = head_revision()
    migrations = tmp_path / "migrations"
    shutil.copytree(schema.MIGRATIONS, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "0002_next.py").write_text(NEXT_REVISION.format(head=head))
    engine = make_engine(empty_database_url)
    try:
        migrate(engine)
        monkeypatch.setattr(schema, "MIGRATIONS", migrations)
        assert head_revision() == "0002_next"
    finally:
        engine.dispose()
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"schema scheduler: upgraded from {head} to 0002_next\n"


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
