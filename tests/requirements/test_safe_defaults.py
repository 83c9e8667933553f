"""Safe defaults (DEC-SAFE-DEFAULTS): production never starts an embedded PostgreSQL, and the
embedded server is an extra (``nudging-scheduler[embedded]``) whose absence is named."""

from __future__ import annotations

import builtins
import socket
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.config import ConfigError, Settings
from scheduler.service import SchedulerService
from tests.conftest import TEST_SECRET

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_embedded_start(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records (and refuses) any start of the embedded server: none may happen here."""
    started: list[Path] = []

    def refuse(pgdata: Path) -> str:
        started.append(pgdata)
        raise AssertionError(f"an embedded PostgreSQL was started in {pgdata}")

    monkeypatch.setattr("scheduler.database.engine.embedded_server_uri", refuse)
    return started


@pytest.mark.clause("DEC-SAFE-DEFAULTS")
@pytest.mark.clause("EMB-6")
def test_production_without_database_url_never_starts_an_embedded_postgresql(
    tmp_path: Path, no_embedded_start: list[Path],
) -> None:
    """EMB-6: ``SchedulerService()`` with SCHEDULER_ENV=production and no DATABASE_URL is a
    ConfigError naming DATABASE_URL; nothing is started, nothing written in the data dir."""
    settings = Settings(environment="production", jwt_secret=TEST_SECRET, data_dir=tmp_path / "data")
    with pytest.raises(ConfigError, match=r"^SCHEDULER_ENV=production never starts an embedded PostgreSQL: set "
                                          r"DATABASE_URL to the production database"):
        SchedulerService(settings)
    assert no_embedded_start == [] and not (tmp_path / "data").exists()


@pytest.mark.clause("EMB-6")
@pytest.mark.parametrize("command", [["migrate"], ["serve", "--port", "FREE"], ["events", "list"]])
def test_production_without_database_url_is_exit_2_from_every_command(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    no_embedded_start: list[Path],
) -> None:
    """EMB-6: the CLI in production without DATABASE_URL: one sentence naming it, exit 2."""
    if "FREE" in command:  # serve binds its port before it reads the database setting
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            command = [str(probe.getsockname()[1]) if word == "FREE" else word for word in command]
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_ENV", "production")
    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path / "data"))
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "SCHEDULER_ENV=production never starts an embedded PostgreSQL: set DATABASE_URL" in err
    assert "Traceback" not in err and no_embedded_start == []


@pytest.mark.clause("EMB-6")
def test_without_the_embedded_extra_and_without_database_url_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """EMB-6: pgserver not installed (its import fails) and no DATABASE_URL: the error names
    ``nudging-scheduler[embedded]`` and DATABASE_URL, exit 2."""
    real_import = builtins.__import__

    def without_pgserver(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pgserver" or name.startswith("pgserver."):
            raise ModuleNotFoundError("No module named 'pgserver'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pgserver", raising=False)
    monkeypatch.setattr(builtins, "__import__", without_pgserver)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("SCHEDULER_ENV", raising=False)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path / "data"))
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert "DATABASE_URL is not set and the embedded PostgreSQL is not installed" in err
    assert "pip install 'nudging-scheduler[embedded]'" in err and "Traceback" not in err


@pytest.mark.clause("DEC-SAFE-DEFAULTS")
@pytest.mark.clause("EMB-6")
def test_pgserver_is_the_embedded_extra_not_a_dependency_and_the_test_install_has_it() -> None:
    """EMB-6: the wheel does not require pgserver; ``[embedded]`` brings it, and so does
    ``[test]`` (what scripts/bootstrap installs, so the README's two commands keep working)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("pgserver") for dep in project["dependencies"])
    assert any(dep.startswith("pgserver") for dep in project["optional-dependencies"]["embedded"])
    assert any(dep.startswith("pgserver") for dep in project["optional-dependencies"]["test"])
    assert "'.[test]'" in (ROOT / "scripts" / "bootstrap").read_text()
    assert '"${wheel}[embedded]"' in (ROOT / "scripts" / "check-wheel").read_text()
