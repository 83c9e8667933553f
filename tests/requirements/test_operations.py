"""Operations: the ``scheduler`` command an operator uses.

In our words: ``scheduler`` (or ``python -m scheduler``) explains every command with
``--help``; ``token`` prints only a token minted with the configured secret (no scope: a
participant's) and refuses clearly without one; ``events list`` finds failed rows with
their ``last_error`` and ``events reset`` puts one back to pending; ``rules list`` shows the
loaded catalogue; ``migrate`` brings the schema up to date. ``events show`` prints one row
with its facts, notifications and operator actions; ``events reset`` also resets every row
matching a filter (``--dry-run`` counts, ``--reason`` is required) and records each reset in
the audit trail; reads print only their answer unless ``--verbose``. Their text outputs show
the control and bidi characters of stored text as visible escapes, non-ASCII text as it is.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import threading
import tomllib
import unicodedata
from datetime import timedelta
from pathlib import Path

import jwt
import pytest
from freezegun import freeze_time
from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy import text as sql_text
from starlette.testclient import TestClient

from scheduler.cli import build_parser, main
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import drop_database, ensure_database
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.nudging.rules import load_catalogue
from scheduler.service import SchedulerService
from tests.conftest import T0, TEST_SECRET, bearer
from tests.helpers import FakeDispatcher, event_body, event_row, post_event, reminder_facts


@pytest.mark.clause("OPS-1")
def test_every_command_explains_itself_with_help(capsys: pytest.CaptureFixture[str]) -> None:
    """OPS-1: --help works on the program and on every command and action."""
    commands = [[], ["serve"], ["migrate"], ["token"], ["events"], ["events", "list"], ["events", "reset"],
                ["events", "show"],
                ["rules"], ["rules", "list"], ["participants"], ["participants", "preferences"]]
    for words in commands:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*words, "--help"])
        assert done.value.code == 0
        assert "usage: scheduler" in capsys.readouterr().out
    out = subprocess.run([sys.executable, "-m", "scheduler", "--help"], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert "serve" in out and "token" in out


@pytest.mark.clause("OPS-28")
def test_version_prints_the_installed_distributions_version_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """OPS-28: ``scheduler --version`` prints ``scheduler`` and the version of the installed
    distribution (``nudging-scheduler``, the version ``pyproject.toml`` declares) and exits 0,
    even with a malformed setting; ``python -m scheduler --version`` is the same."""
    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert importlib.metadata.version(declared["name"]) == declared["version"]
    monkeypatch.setenv("SCHEDULER_BATCH_SIZE", "twenty")
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"scheduler {declared['version']}\n"
    run = subprocess.run([sys.executable, "-m", "scheduler", "--version"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "SCHEDULER_BATCH_SIZE": "twenty"})
    assert (run.returncode, run.stdout, run.stderr) == (0, f"scheduler {declared['version']}\n", "")


@pytest.mark.clause("OPS-2")
def test_token_prints_only_a_token_the_service_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: TestClient
) -> None:
    """OPS-2: the output is exactly one JWT carrying the scope and subject asked for."""
    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    assert main(["token", "--scope", "nudging.admin", "--sub", "ops"]) == 0
    printed = capsys.readouterr().out
    token = printed.strip()
    assert printed == token + "\n"
    claims = jwt.decode(token, TEST_SECRET, algorithms=["HS256"], audience="svc-nudging")
    assert (claims["scope"], claims["sub"]) == ("nudging.admin", "ops")
    assert client.get("/admin/notifications", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert main(["token"]) == 0
    participant = capsys.readouterr().out.strip()
    assert "scope" not in jwt.decode(participant, TEST_SECRET, algorithms=["HS256"], audience="svc-nudging")
    assert client.get("/admin/notifications", headers={"Authorization": f"Bearer {participant}"}).status_code == 403


@pytest.mark.clause("OPS-2")
def test_token_refuses_clearly_when_no_secret_is_configured(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """OPS-2: no secret and no generated one: exit code 2 and a message saying what to do."""
    monkeypatch.delenv("SCHEDULER_JWT_SECRET", raising=False)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path))
    assert main(["token", "--scope", "nudging.admin"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "SCHEDULER_JWT_SECRET" in captured.err


@pytest.mark.clause("OPS-3")
def test_events_list_shows_failed_rows_and_events_reset_puts_one_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: TestClient,
    service: SchedulerService, engine: Engine, database_url: str,
) -> None:
    """OPS-3: an operator finds the failed row and its last_error, then resets it to pending."""
    bad = post_event(client, facts={"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"})
    post_event(client, user_id="fine")
    service.scheduler.poll_once()
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["events", "list", "--status", "failed", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [bad["id"]]
    assert listed[0]["last_error"].startswith("missing_or_invalid_time_scope")
    assert main(["events", "reset", bad["id"]]) == 0
    assert "pending again" in capsys.readouterr().out
    assert event_row(engine, bad["id"])["status"] == "pending"
    assert main(["events", "reset", "no-such-id"]) == 1


@pytest.mark.clause("OPS-4")
def test_rules_list_shows_the_loaded_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    """OPS-4: id, scenarios, frequency and kind of every rule, as text or JSON."""
    assert main(["rules", "list", "--json"]) == 0
    rules = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rules["commitment-reminder"]["scenarios"] == ["commitment_reminder"]
    assert (rules["commitment-reminder"]["frequency"], rules["commitment-reminder"]["kind"]) == ("daily", "reminder")
    assert rules["yearly-review"]["enabled"] is False
    assert main(["rules", "list"]) == 0
    assert "commitment-reminder" in capsys.readouterr().out


@pytest.mark.clause("OPS-5")
def test_migrate_is_idempotent_on_an_up_to_date_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    """OPS-5: migrate on a migrated database changes nothing and says the schema is already at
    its revision (the head)."""
    from scheduler.database.schema import head_revision

    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"schema scheduler already at revision {head_revision()}\n"


@pytest.mark.clause("OPS-6")
def test_a_bad_setting_is_a_clear_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """OPS-6: SCHEDULER_BATCH_SIZE=twenty is refused with exit 2 and the variable's name."""
    monkeypatch.setenv("SCHEDULER_BATCH_SIZE", "twenty")
    assert main(["rules", "list"]) == 2
    assert "SCHEDULER_BATCH_SIZE" in capsys.readouterr().err


@pytest.mark.clause("OPS-5")
def test_the_migrations_build_exactly_the_schema_the_models_declare(engine: Engine) -> None:
    """OPS-5: Alembic (never create_all) owns the schema; autogenerate finds nothing to change
    (in the scheduler's own schema, where every model's table is: a comparison of ``public``
    alone would find nothing to compare)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from scheduler.database.models import Base
    from scheduler.database.queries import DEFAULT_SCHEMA

    assert {table.schema for table in Base.metadata.tables.values()} == {DEFAULT_SCHEMA}
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "compare_type": True, "include_schemas": True, "version_table_schema": DEFAULT_SCHEMA,
            "include_name": lambda name, kind, _parent: kind != "schema" or name == DEFAULT_SCHEMA})
        assert compare_metadata(context, Base.metadata) == []


@pytest.mark.clause("OPS-5")
def test_the_scheduled_events_table_is_vacuumed_early_so_the_claim_stays_cheap(engine: Engine) -> None:
    """OPS-5: the migrations tune autovacuum on scheduled_events (dead pending-index entries slow the claim)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        options = conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'scheduled_events'")).scalar_one()
    assert sorted(options) == ["autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000"]


@pytest.mark.clause("OPS-20")
def test_events_show_prints_the_row_its_facts_notifications_and_actions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: TestClient,
    service: SchedulerService, database_url: str,
) -> None:
    """OPS-20: every column, the facts, the notification it produced and the reset by hand, as text and JSON."""
    row = post_event(client, user_id="anna", external_key="anna-1")
    service.scheduler.poll_once()
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["events", "reset", row["id"], "--reason", "resend", "--actor", "ops-kim"]) == 0
    capsys.readouterr()
    assert main(["events", "show", row["id"]]) == 0
    out = capsys.readouterr().out
    for text in ("external_key", "anna-1", '"commitment": "run the dishwasher at noon"',
                 "Reminder: run the dishwasher at noon", "reset by ops-kim (cli)  reason: resend"):
        assert text in out, text
    assert main(["events", "show", row["id"], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "pending" and len(shown["notifications"]) == 1
    assert shown["actions"][0]["actor"] == "ops-kim"
    assert main(["events", "show", "no-such-id"]) == 1


@pytest.mark.clause("OPS-21")
def test_events_reset_by_filter_counts_first_needs_a_reason_and_is_audited(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: TestClient,
    service: SchedulerService, engine: Engine, database_url: str, request: pytest.FixtureRequest,
) -> None:
    """OPS-21: --dry-run counts the matching failed rows and changes nothing; without --reason exit 2;
    with it they are pending again and the audit trail says who, why, the filter and the count."""
    bad = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}
    ids = [post_event(client, user_id=u, facts=bad)["id"] for u in ("a", "b")]
    post_event(client, user_id="fine")
    service.scheduler.poll_once()
    monkeypatch.setenv("DATABASE_URL", database_url)
    # The CLI reads the database's clock (DEC-10), which is after the rows' frozen-clock updates
    # (T0); the frozen wall clock only keeps the rest of this test off the real one.
    frozen = freeze_time(T0 + timedelta(minutes=5))
    frozen.start()
    request.addfinalizer(frozen.stop)
    assert main(["events", "reset", "--status", "failed", "--error-contains", "TIME_SCOPE", "--dry-run"]) == 0
    assert "2 rows match" in capsys.readouterr().out
    assert main(["events", "reset", "--status", "failed"]) == 2
    assert "--reason" in capsys.readouterr().err
    assert [event_row(engine, i)["status"] for i in ids] == ["failed", "failed"]
    assert main(["events", "reset", "--status", "failed", "--reason", "rule fixed", "--actor", "ops-kim"]) == 0
    assert "reset 2 rows" in capsys.readouterr().out
    assert [event_row(engine, i)["status"] for i in ids] == ["pending", "pending"]
    with engine.connect() as conn:
        from sqlalchemy import text

        [audit] = conn.execute(text("SELECT * FROM operator_actions")).mappings().all()
    assert (audit["actor"], audit["source"], audit["action"], audit["count"], audit["reason"]) == (
        "ops-kim", "cli", "bulk_reset", 2, "rule fixed")
    assert audit["filter"] == {"status": "failed"}
    assert main(["events", "reset"]) == 2
    assert main(["events", "reset", ids[0], "--status", "failed"]) == 2


@pytest.mark.clause("OPS-26")
def test_events_cancel_by_filter_counts_first_needs_a_reason_cancels_only_pending_or_failed_rows_and_is_audited(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: TestClient,
    service: SchedulerService, engine: Engine, database_url: str,
) -> None:
    """OPS-26: `events cancel` by filter counts with --dry-run and changes nothing; without --reason
    exit 2; with it the matching pending and failed rows are cancelled, a dispatched one and the
    rows outside the filter stay as they were, and the audit trail records the bulk cancel."""
    later = T0 + timedelta(days=1)
    pending = [post_event(client, user_id=u, event_type="demo", trigger_at=later)["id"] for u in ("a", "b")]
    dispatched = post_event(client, user_id="c", event_type="demo")["id"]
    other = post_event(client, user_id="d", event_type="other", trigger_at=later)["id"]
    service.scheduler.poll_once()  # the due one is dispatched
    assert event_row(engine, dispatched)["status"] == "dispatched"
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["events", "cancel", "--event-type", "demo", "--dry-run"]) == 0
    assert "2 rows match" in capsys.readouterr().out
    assert main(["events", "cancel", "--event-type", "demo"]) == 2
    assert "--reason" in capsys.readouterr().err
    assert [event_row(engine, i)["status"] for i in pending] == ["pending", "pending"]
    assert main(["events", "cancel", "--event-type", "demo", "--reason", "campaign withdrawn",
                 "--actor", "ops-kim"]) == 0
    assert "cancelled 2 rows" in capsys.readouterr().out
    assert [event_row(engine, i)["status"] for i in (*pending, dispatched, other)] == [
        "cancelled", "cancelled", "dispatched", "pending"]
    with engine.connect() as conn:
        [audit] = conn.execute(sql_text("SELECT * FROM operator_actions")).mappings().all()
    assert (audit["actor"], audit["source"], audit["action"], audit["count"], audit["reason"]) == (
        "ops-kim", "cli", "bulk_cancel", 2, "campaign withdrawn")
    assert audit["filter"] == {"event_type": "demo"}
    assert main(["events", "cancel"]) == 2
    assert main(["events", "cancel", other, "--event-type", "demo"]) == 2
    assert main(["events", "cancel", "--key", "--event-type", "demo"]) == 2
    assert event_row(engine, other)["status"] == "pending"


@pytest.mark.clause("OPS-22")
def test_cli_reads_print_only_their_answer_unless_verbose(database_url: str) -> None:
    """OPS-22: `events list` on stdout, nothing on stderr (no Alembic or server INFO); --verbose shows them."""
    import os

    env = {**os.environ, "DATABASE_URL": database_url}
    quiet = subprocess.run([sys.executable, "-m", "scheduler", "events", "list"], capture_output=True, text=True,
                           env=env, timeout=120, check=True)
    assert (quiet.stdout, quiet.stderr) == ("no scheduled events\n", "")
    loud = subprocess.run([sys.executable, "-m", "scheduler", "--verbose", "events", "list"], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    assert "alembic" in loud.stderr and loud.stdout == "no scheduled events\n"


NON_ASCII = "été 漢字 🎉"
# Only these may reach the terminal raw; a line's own end is the one control character printed.
RAW = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def hostile(label: str) -> str:
    """Text a sender or an operator could write: ESC sequences (clear the screen, red), a
    carriage return and newline forging a line, a right-to-left override, a C1 CSI, BEL, tab,
    DEL and a line separator, around ordinary non-ASCII text."""
    return f"{label}-{NON_ASCII} \x1b[2J\x1b[31mred\x1b[0m\r\nFORGED {label}\u202eevil\x9b\x07\t\x7f\u2028end"


def visible(label: str) -> str:
    """``hostile(label)`` as the terminal must show it (written out, not computed by the code under test)."""
    return (f"{label}-{NON_ASCII} \\x1b[2J\\x1b[31mred\\x1b[0m\\r\\nFORGED {label}"
            "\\u202eevil\\x9b\\x07\\t\\x7f\\u2028end")


def raw_controls(out: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in out if c != "\n" and unicodedata.category(c) in RAW]


@pytest.mark.clause("OPS-25")
def test_cli_text_outputs_show_hostile_stored_text_as_visible_escapes_and_non_ascii_as_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings, engine: Engine,
    clock: ManualClock, database_url: str,
) -> None:
    """OPS-25: rows stored through the API with hostile text in every field a sender writes, a
    dispatch failure quoting it, a reset by an operator naming it, a rewrite by a token whose
    subject carries it: ``events list``, ``show`` and ``history`` print no raw control, format or
    line-separator character and no forged line; the escapes are visible and the non-ASCII text
    is unchanged; ``--json`` still gives the text exactly as stored."""
    dispatcher = FakeDispatcher(NudgingPlatform(load_catalogue(None)),
                                fail_for={hostile("bob"): RuntimeError(hostile("error"))})
    service = SchedulerService(settings, engine=engine, clock=clock, publisher=RecordingPublisher(),
                               dispatcher=dispatcher, run_scheduler=False)
    with TestClient(service.app) as client:
        anna = post_event(client, user_id=hostile("anna"), event_type=hostile("type"), external_key=hostile("key"),
                          community_id=hostile("community"),
                          facts=reminder_facts(commitment=hostile("title"), note=hostile("facts")))
        bob = post_event(client, user_id=hostile("bob"))
        service.scheduler.poll_once()
        monkeypatch.setenv("DATABASE_URL", database_url)

        def run(*words: str) -> str:
            assert main(list(words)) == 0, words
            captured = capsys.readouterr()
            assert raw_controls(captured.out) == [], (words, captured.out)
            assert raw_controls(captured.err) == [], (words, captured.err)
            return captured.out

        listed = run("events", "list")
        assert len(listed.splitlines()) == 2
        assert {line.split()[0] for line in listed.splitlines()} == {anna["id"], bob["id"]}
        assert f"user={visible('anna')}" in listed and f"user={visible('bob')}" in listed
        assert visible("error") in listed  # bob's last_error
        as_json = json.loads(run("events", "list", "--json"))
        assert {r["user_id"] for r in as_json} == {hostile("anna"), hostile("bob")}

        assert main(["events", "reset", bob["id"], "--actor", hostile("actor"), "--reason", hostile("reason")]) == 0
        capsys.readouterr()
        moved = client.post("/admin/scheduled-events", headers=bearer("nudging.ingest", subject=hostile("sender")),
                            json=event_body(user_id=hostile("anna"), event_type=hostile("type"),
                                            external_key=hostile("key"), community_id=hostile("moved"),
                                            trigger_at=T0 + timedelta(hours=1),
                                            facts=reminder_facts(commitment=hostile("title"), note=hostile("facts"))))
        assert moved.status_code == 201, moved.text

        shown_anna = run("events", "show", anna["id"])
        for field in ("anna", "type", "key", "moved", "title"):
            assert visible(field) in shown_anna, field
        assert NON_ASCII in shown_anna.split("facts:", 1)[1]  # the facts block, ensure_ascii=False
        shown_bob = run("events", "show", bob["id"])
        assert f"by {visible('actor')} (cli)  reason: {visible('reason')}" in shown_bob
        history_anna = run("events", "history", anna["id"])
        assert f"by {visible('sender')}" in history_anna and "community_id: " in history_anna
        history_bob = run("events", "history", bob["id"])
        assert f"by {visible('actor')}" in history_bob
        for out in (listed, shown_anna, shown_bob, history_anna, history_bob):
            assert NON_ASCII in out
            assert not [line for line in out.splitlines() if line.startswith("FORGED")], out
        assert [line.split()[1] for line in history_bob.splitlines()] == ["stored", "failed", "reset"]
        assert json.loads(run("events", "show", anna["id"], "--json"))["notifications"][0]["title"].endswith(
            hostile("title"))


@pytest.mark.clause("OPS-8")
@pytest.mark.parametrize("name", ['scratch "quoted" name', "scratch:colon%percent"])
def test_a_scratch_database_created_by_several_processes_at_once_is_created_once_without_error(
    database_url: str, name: str
) -> None:
    """OPS-8: DDL quotes the name whatever it holds, and eight concurrent creators of one
    database all succeed (the losers of the race find it created)."""
    admin = str(make_url(database_url).set(database="postgres").render_as_string(hide_password=False))
    barrier = threading.Barrier(8, timeout=30)
    errors: list[BaseException] = []

    def create() -> None:
        barrier.wait()
        try:
            ensure_database(admin, name)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert errors == []
        with create_engine(admin).connect() as conn:
            found = conn.execute(sql_text("SELECT count(*) FROM pg_database WHERE datname = :n"),
                                 {"n": name}).scalar_one()
        assert found == 1
    finally:
        drop_database(admin, name)
    with create_engine(admin).connect() as conn:
        assert conn.execute(sql_text("SELECT count(*) FROM pg_database WHERE datname = :n"),
                            {"n": name}).scalar_one() == 0


@pytest.mark.clause("OPS-9")
def test_token_refuses_a_ttl_below_one_second(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPS-9: ``--ttl 0`` or a negative TTL would mint an expired token: refused with exit 2."""
    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    for ttl in ("0", "-10"):
        with pytest.raises(SystemExit) as refused:
            main(["token", "--scope", "nudging.admin", "--ttl", ttl])
        assert refused.value.code == 2
        assert "must be at least 1" in capsys.readouterr().err
    assert main(["token", "--ttl", "1"]) == 0


@pytest.mark.clause("OPS-9")
def test_serve_on_a_busy_port_says_the_port_is_taken_and_never_claims_to_listen(tmp_path: Path) -> None:
    """OPS-9: a second ``serve`` on a port already in use exits 1 with a message naming the
    port as taken, before starting anything, and never prints "listening"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
        env.update({"SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_DATA_DIR": str(tmp_path / "data")})
        second = subprocess.run([sys.executable, "-m", "scheduler", "serve", "--port", str(port)],
                                env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in second.stderr
    assert "listening" not in second.stderr + second.stdout
    assert not (tmp_path / "data" / "pgdata").exists()  # nothing was started
