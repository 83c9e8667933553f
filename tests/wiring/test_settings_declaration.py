"""WIRE-10: every setting is declared once (its variable, type, default, bounds and meaning),
and everything else is derived from that declaration: the README's configuration table,
the wiring checks' list, the validation of every construction, ``make_engine``'s defaults.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from sqlalchemy import text

from scheduler import config
from scheduler.config import ConfigError, Settings
from scheduler.config.readme import main, markdown_table, readme_table
from scheduler.database.engine import make_engine

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.clause("DEC-CONF-1")
@pytest.mark.clause("WIRE-10")
def test_the_readme_configuration_table_is_the_one_the_declaration_writes() -> None:
    """WIRE-10: the README's table (variable, default, meaning, in order) is exactly what
    ``python -m scheduler.config --markdown`` prints; a drift names the fix."""
    documented = readme_table(README.read_text())
    generated = markdown_table()
    drift = "".join(difflib.unified_diff(documented.splitlines(True), generated.splitlines(True),
                                         "README.md", "the declaration"))
    assert documented == generated, f"run `python -m scheduler.config --write-readme`:\n{drift}"


@pytest.mark.clause("WIRE-10")
def test_the_generator_rewrites_a_drifted_table_and_leaves_the_rest_of_the_readme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """WIRE-10: ``--write-readme`` replaces a stale table (a renamed default, a lost row) with
    the declaration's, and touches nothing around it; ``--markdown`` prints the same table."""
    readme = tmp_path / "README.md"
    stale = README.read_text().replace("| `SCHEDULER_BATCH_SIZE` | `20` |", "| `SCHEDULER_BATCH_SIZE` | `25` |")
    listen = next(line for line in stale.splitlines() if line.startswith("| `SCHEDULER_LISTEN`"))
    stale = stale.replace(listen + "\n", "")
    readme.write_text(stale)
    assert main(["--write-readme", str(readme)]) == 0
    assert readme.read_text() == README.read_text()
    assert main(["--write-readme", str(readme)]) == 0
    assert "already up to date" in capsys.readouterr().out
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table()


@pytest.mark.clause("WIRE-10")
def test_every_declared_setting_names_its_variable_and_meaning() -> None:
    """WIRE-10: each field declares the variable it is read from (all distinct, every old name
    kept) and a meaning; the defaults in code are the declared ones."""
    names = [config.env_name(field) for field in Settings.model_fields]
    assert len(set(names)) == len(names)
    assert {"DATABASE_URL", "SCHEDULER_ENV", "SCHEDULER_ENABLED", "SCHEDULER_JWKS_URL"} <= set(names)
    assert all(n == "DATABASE_URL" or n.startswith("SCHEDULER_") for n in names)
    assert all(field.description for field in Settings.model_fields.values())
    assert Settings() == Settings.from_env({})


@pytest.mark.clause("WIRE-10")
@pytest.mark.parametrize(("variable", "value", "message"), [
    ("SCHEDULER_BATCH_SIZE", "twenty", "SCHEDULER_BATCH_SIZE must be a whole number, got 'twenty'"),
    ("SCHEDULER_BATCH_SIZE", "0", "SCHEDULER_BATCH_SIZE must be at least 1, got 0"),
    ("SCHEDULER_POLL_SECONDS", "soon", "SCHEDULER_POLL_SECONDS must be a number of seconds, got 'soon'"),
    ("SCHEDULER_POOL_TIMEOUT_SECONDS", "0.05", "SCHEDULER_POOL_TIMEOUT_SECONDS must be at least 0.1, got 0.05"),
    ("SCHEDULER_LISTEN", "maybe", "SCHEDULER_LISTEN must be true or false, got 'maybe'"),
    ("SCHEDULER_ENV", "staging", "SCHEDULER_ENV must be development or production, got 'staging'"),
    ("SCHEDULER_MODE", "fast", "SCHEDULER_MODE must be literal or prompt, got 'fast'"),
    ("SCHEDULER_MAX_BODY_BYTES", "100", "SCHEDULER_MAX_BODY_BYTES must be at least 1024, got 100"),
])
def test_a_malformed_variable_is_refused_with_its_name_and_the_value(variable: str, value: str, message: str) -> None:
    """WIRE-10: the declaration's type and bounds refuse a bad value with one sentence
    naming the variable, the rule and what was given."""
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({variable: value})
    assert str(refused.value) == message


@pytest.mark.clause("WIRE-10")
def test_every_construction_is_validated_including_a_copy_with_changed_fields() -> None:
    """WIRE-10: ``Settings(...)`` in code and ``with_`` copies are checked like the
    environment: out of bounds, a wrong type or a misspelt field is a ConfigError."""
    with pytest.raises(ConfigError, match="SCHEDULER_BATCH_SIZE must be at least 1, got 0"):
        Settings(batch_size=0)
    base = Settings(batch_size=5)
    with pytest.raises(ConfigError, match="SCHEDULER_STATEMENT_TIMEOUT_MS must be at least 0, got -1"):
        base.with_(statement_timeout_ms=-1)
    with pytest.raises(ConfigError, match="SCHEDULER_MODE must be literal or prompt, got 'fast'"):
        base.with_(mode="fast")
    with pytest.raises(ConfigError, match="unknown setting 'batch_sise'"):
        base.with_(batch_sise=3)
    copy = base.with_(poll_seconds=1)
    assert (copy.poll_seconds, copy.batch_size, base.poll_seconds) == (1.0, 5, 30.0)


@pytest.mark.clause("DEC-CONF-1")
@pytest.mark.clause("WIRE-10")
def test_settings_in_code_ignore_the_environment_and_from_env_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """WIRE-10: ``Settings(...)`` is the declared defaults plus its arguments, whatever the
    process's environment; ``Settings.from_env()`` reads that environment (blank: unset)."""
    monkeypatch.setenv("SCHEDULER_BATCH_SIZE", "7")
    monkeypatch.setenv("SCHEDULER_MODE", " Prompt ")
    monkeypatch.setenv("SCHEDULER_JWT_AUDIENCE", "  ")
    assert (Settings().batch_size, str(Settings().mode)) == (20, "literal")
    read = Settings.from_env()
    assert (read.batch_size, str(read.mode), read.jwt_audience) == (7, "prompt", "svc-nudging")


@pytest.mark.clause("WIRE-10")
def test_make_engine_without_settings_reads_the_environment(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    """WIRE-10: ``make_engine(url)`` takes its timeouts from the environment, as the service
    does, not from hard-coded defaults."""
    monkeypatch.setenv("SCHEDULER_STATEMENT_TIMEOUT_MS", "4321")
    monkeypatch.setenv("SCHEDULER_LOCK_TIMEOUT_MS", "1234")
    made = make_engine(database_url)
    try:
        with made.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "4321ms"
            assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "1234ms"
    finally:
        made.dispose()


@pytest.mark.clause("WIRE-10")
def test_secrets_stay_out_of_the_settings_repr() -> None:
    """WIRE-10: a log line that prints the settings shows no JWT secret and no database password."""
    shown = repr(Settings(jwt_secret="a-secret-nobody-may-read-0123456789",
                          database_url="postgresql://u:hunter2@db/x"))
    assert "a-secret-nobody" not in shown and "hunter2" not in shown
