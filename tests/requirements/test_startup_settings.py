"""Startup settings (OPS-6.1, OPS-6.2): ``DATABASE_URL`` and ``serve --port`` are read strictly
before anything starts; a value the scheduler cannot use is one sentence naming the setting on
stderr and exit code 2, from ``migrate`` and ``serve`` alike, never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.config import ConfigError, Settings
from tests.conftest import TEST_SECRET

# Each DATABASE_URL the scheduler cannot use, with words its sentence must hold.
BAD_URLS = {
    "not-a-url": ("notaurl", "must be a PostgreSQL URL"),
    "asyncpg": ("postgresql+asyncpg://u:hunter2@localhost/db", "asynchronous driver 'asyncpg'"),
    "psycopg-async": ("postgresql+psycopg_async://u:hunter2@localhost/db", "asynchronous driver 'psycopg_async'"),
    "psycopg2": ("postgresql+psycopg2://u:hunter2@localhost/db", "driver 'psycopg2'"),
    "mysql": ("mysql://u:hunter2@localhost/db", "names the database 'mysql'"),
    "sqlite": ("sqlite:///scheduler.db", "names the database 'sqlite'"),
    "ipv6-unclosed": ("postgresql://u:hunter2@[::1/db", "IPv6 host whose '[' is never closed"),
    "ipv6-unopened": ("postgresql://u:hunter2@::1]/db", "IPv6 host whose ']' is never opened"),
    "ipv6-bare": ("postgresql://u:hunter2@::1:5432/db", "IPv6 host without brackets"),
    "ipv6-trailing": ("postgresql://u:hunter2@[::1]5432/db", "text after the IPv6 host's ']'"),
    "port-too-big": ("postgresql://u:hunter2@localhost:99999/db", "port outside 1 to 65535"),
    "port-zero": ("postgresql://u:hunter2@localhost:0/db", "port outside 1 to 65535"),
    "port-letters": ("postgresql://u:hunter2@localhost:abc/db", "port that is not a number"),
    "port-arabic-digits": ("postgresql://u:hunter2@localhost:\u0665\u0664\u0663\u0662/db", "port that is not a number"),
    "slash-in-password": ("postgresql://u:hunt/er2@localhost/db", "percent-encoded"),
    "two-at-signs": ("postgresql://u:hunter@2@localhost/db", "more than one '@'"),
    # several hosts: every libpq spelling passes (GOOD_URLS), each host and port checked
    "hosts-in-both-places": ("postgresql://u:hunter2@h1/db?host=h2", "names hosts both before the database and in"),
    "ports-both-ways": ("postgresql://u:hunter2@/db?host=h1:5432,h2:5433&port=5432", "gives ports both after"),
    "port-count": ("postgresql://u:hunter2@/db?host=h1,h2,h3&port=5432,5433", "gives 2 ports for 3 hosts"),
    "empty-host-in-list": ("postgresql://u:hunter2@h1:5432,,h2/db", "an empty host in its list"),
    "empty-host-entry": ("postgresql://u:hunter2@/db?host=h1,,h2", "an empty entry in ?host="),
    "empty-port-entry": ("postgresql://u:hunter2@/db?host=h1,h2&port=5432,", "an empty entry in ?port="),
    "bad-port-in-list": ("postgresql://u:hunter2@h1:5432,h2:99999/db", "port outside 1 to 65535"),
    "bad-port-in-host-list": ("postgresql://u:hunter2@/db?host=h1:5432,h2:54x2", "port that is not a number"),
    "bad-port-in-port-list": ("postgresql://u:hunter2@/db?host=h1,h2&port=5432,0", "port outside 1 to 65535"),
    "bare-ipv6-in-list": ("postgresql://u:hunter2@h1:5432,::1:5433/db", "IPv6 host without brackets"),
    "unknown-option": ("postgresql://u:hunter2@h1/db?target_sesion_attrs=read-write", "that libpq does not know"),
    "repeated-option": ("postgresql://u:hunter2@h1/db?sslmode=require&sslmode=disable", "'sslmode' twice"),
    "user-twice": ("postgresql://u:hunter2@h1/db?user=v", "'user' both in the URL and in its query"),
    "fragment": ("postgresql://u:hunter2@h1/db#main", "has a '#'"),
    "parameter-without-value": ("postgresql://u:hunter2@h1/db?sslmode", "without a name and '='"),
    "not-utf8": ("postgresql://u:hunter2@h1/db?application_name=%ff", "not UTF-8"),
}
GOOD_URLS = ["postgresql://u:pw@db.example:5432/scheduler", "postgres://u@db/scheduler",
             "postgresql+psycopg://u:p%40ss@[::1]:5432/scheduler", "postgresql://u@[fe80::1%25eth0]/scheduler",
             "postgresql://postgres@/scheduler?host=/run/postgresql&port=5432", "postgresql:///scheduler",
             # every libpq spelling of several hosts, with target_session_attrs (DBURL-1)
             "postgresql://u:pw@h1:5432,h2:5433/scheduler?target_session_attrs=read-write",
             "postgresql://u:pw@[::1]:5432,[::2]:5433,h3/scheduler?target_session_attrs=read-write",
             "postgresql://u:pw@/scheduler?host=h1:5432,h2:5433&target_session_attrs=read-write",
             "postgresql://u:pw@/scheduler?host=h1:5432&host=h2:5433&target_session_attrs=read-write",
             "postgresql://u:pw@/scheduler?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
             "postgresql://u:pw@/scheduler?host=h1&host=h2&port=5432&port=5433&target_session_attrs=primary",
             "postgresql://u:pw@/scheduler?host=h1,h2&port=6432&sslmode=require&application_name=scheduler"]


def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path / "data"))


def _one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


@pytest.mark.clause("OPS-6.1")
@pytest.mark.parametrize("command", [["migrate"], ["serve", "--port", "1"]], ids=["migrate", "serve"])
@pytest.mark.parametrize("case", BAD_URLS.values(), ids=BAD_URLS.keys())
def test_a_database_url_the_scheduler_cannot_use_is_one_sentence_naming_it_and_exit_2(
    command: list[str], case: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """OPS-6.1: not a URL, an async driver, another driver or another database, an IPv6 host
    with a bracket missing, a port outside 1 to 65535 or not in ASCII digits (any host's of a
    list), an unencoded '/' or '@' in the password, hosts or ports given two ways or in
    numbers that do not match, an empty host or port in a list, a query option libpq does not
    know or given twice, a '#', a byte that is not UTF-8: ``migrate`` and ``serve`` each say
    one sentence naming DATABASE_URL and what to write, exit 2, before binding a port or
    writing anything; the password never appears."""
    url, words = case
    _environment(monkeypatch, tmp_path, url)
    assert main(command) == 2
    captured = capsys.readouterr()
    line = _one_sentence(captured.err)
    assert line.startswith("configuration error: DATABASE_URL "), line
    assert words in line, line
    assert "hunter" not in line and "er2" not in line, line
    assert captured.out == ""
    assert not (tmp_path / "data").exists()  # no secret generated, no embedded server started


@pytest.mark.clause("OPS-6.1")
@pytest.mark.parametrize("url", GOOD_URLS)
def test_the_postgresql_urls_the_scheduler_connects_with_are_accepted(url: str) -> None:
    """OPS-6.1: the control: postgresql://, postgres:// and postgresql+psycopg:// with a user,
    a percent-encoded password, a host name, an IPv6 address in brackets (with its zone), a
    Unix socket as ``?host=``, nothing but the database, or several hosts in every spelling
    libpq users write, with libpq's options, pass the check unchanged."""
    assert Settings(database_url=url).database_url == url
    assert Settings.from_env({"DATABASE_URL": url}).database_url == url


@pytest.mark.clause("OPS-6.1")
def test_a_settings_error_never_quotes_the_database_url() -> None:
    """OPS-6.1: DATABASE_URL may hold a password: the ConfigError says what is wrong without the value."""
    with pytest.raises(ConfigError) as refused:
        Settings(database_url="mysql://admin:s3cr3t-pw@db/x")
    assert "s3cr3t" not in str(refused.value) and "admin" not in str(refused.value)


@pytest.mark.clause("OPS-6.2")
@pytest.mark.parametrize("port", ["70000", "65536", "-1", "0", "80a", "\u0668\u0660", ""])
def test_serve_refuses_a_port_outside_1_to_65535_in_one_sentence_with_exit_2(
    port: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """OPS-6.2: ``serve --port`` is a whole number from 1 to 65535 in ASCII digits; anything
    else is the usage line and one sentence naming --port, exit 2, before anything starts."""
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--port", port])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --port: must be a port number from 1 to 65535, got {port!r}" in err, err
    assert "Traceback" not in err and not (tmp_path / "data").exists()


@pytest.mark.clause("OPS-6.1")
@pytest.mark.clause("OPS-6.2")
def test_the_installed_command_says_the_sentence_without_a_traceback(tmp_path: Path) -> None:
    """OPS-6.1, OPS-6.2: the real process (``python -m scheduler``), not only ``main``: a bad
    DATABASE_URL for ``migrate`` and ``serve``, and ``serve --port 70000``, each exit 2 with
    one sentence on stderr and no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") and k != "DATABASE_URL"}
    env.update({"SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_DATA_DIR": str(tmp_path / "data")})
    runs = {
        "migrate": (["migrate"], "notaurl"),
        "serve": (["serve", "--port", "1"], "postgresql+asyncpg://u@localhost/db"),
        "port": (["serve", "--port", "70000"], None),
    }
    for name, (args, url) in runs.items():
        run_env = {**env, "DATABASE_URL": url} if url else env
        done = subprocess.run([sys.executable, "-m", "scheduler", *args], env=run_env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, (name, done.stderr)
        assert "Traceback" not in done.stderr, (name, done.stderr)
        named = "DATABASE_URL" if url else "--port"
        assert named in done.stderr.strip().splitlines()[-1], (name, done.stderr)
    assert not (tmp_path / "data").exists()
