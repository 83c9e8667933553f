"""Real processes for the fault scenarios: one PostgreSQL, several `scheduler serve` replicas.

Everything listens on loopback (the replicas) or a Unix socket (PostgreSQL, which listens
on no TCP address at all). Every wait here is on a condition with a deadline, so a
scenario that goes wrong fails with a message instead of hanging.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx
from sqlalchemy import Engine, text

from scheduler.config import Settings
from scheduler.database.engine import (
    create_migrated_database,
    drop_database,
    embedded_server_uri,
    make_engine,
    socket_dir_of,
    sqlalchemy_url,
)
from scheduler.web.http.auth import mint_token

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


class ScenarioError(RuntimeError):
    """A scenario could not run (not a finding about the service: a broken set-up)."""


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ScenarioError(f"timed out after {timeout:g}s waiting for {what}")
        threading.Event().wait(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- PostgreSQL ---------------------------------------------------------------------------


class Postgres:
    """The embedded server (the ``pgserver`` wheel) in ``pgdata``, which a scenario may stop
    and start again; replicas reach it through its Unix socket."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata.resolve()
        self.uri = embedded_server_uri(self.pgdata)
        socket_dir = socket_dir_of(self.uri)
        if socket_dir is None:
            raise ScenarioError(f"the embedded server's URI names no socket directory: {self.uri}")
        self.socket_dir = socket_dir
        self.system_user = "pgserver" if os.geteuid() == 0 else None

    def url(self, database: str, application_name: str | None = None) -> str:
        """A SQLAlchemy URL for ``database``; ``application_name`` tags a replica's backends."""
        url = sqlalchemy_url(self.uri, database)
        if application_name:
            url += ("&" if "?" in url else "?") + urlencode({"application_name": application_name})
        return url

    def _pg_ctl(self, args: list[str], timeout: float = 60) -> None:
        _pg_ctl(self.pgdata, args, timeout)

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast``: every backend is terminated, in-flight transactions roll back."""
        self._pg_ctl(["-w", "-m", mode, "stop"])

    def start(self) -> None:
        """Start it again on the same socket directory, as pgserver first did."""
        self._pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.pgdata / "log"), "start"])

    def create_database(self, name: str) -> str:
        """A fresh, migrated database; returns its SQLAlchemy URL."""
        self.drop_database(name)
        create_migrated_database(sqlalchemy_url(self.uri), name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        drop_database(sqlalchemy_url(self.uri), name)


def _pg_ctl(pgdata: Path, args: list[str], timeout: float = 60) -> None:
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made by a factory

    pg_ctl(args, pgdata=pgdata, user="pgserver" if os.geteuid() == 0 else None, timeout=timeout)


def stop_server(pgdata: Path) -> bool:
    """Stop the server running in ``pgdata``, whoever started it (``pg_ctl stop -m fast``);
    False if none ran there. A scenario that stopped and started the server itself
    (database-restart) leaves one that pgserver no longer stops when its last user exits."""
    if not (pgdata / "postmaster.pid").exists():
        return False
    _pg_ctl(pgdata.resolve(), ["-w", "-m", "fast", "stop"])
    return True


def terminate_backends(engine: Engine, database: str, application_prefix: str = "replica-") -> int:
    """``pg_terminate_backend`` on every replica backend of ``database``; returns how many."""
    with engine.connect() as conn:
        killed = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND application_name LIKE :prefix AND pid <> pg_backend_pid()"
            ),
            {"db": database, "prefix": application_prefix + "%"},
        ).scalar_one()
        conn.commit()
    return int(killed)


def backends_of(engine: Engine, application_name: str) -> list[dict[str, Any]]:
    """The live backends of one replica, with the locks each holds."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.pid, a.state, a.xact_start IS NOT NULL AS in_transaction, "
                "(SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.granted) AS locks "
                "FROM pg_stat_activity a WHERE a.application_name = :name"
            ),
            {"name": application_name},
        ).mappings().all()
    return [dict(r) for r in rows]


def advisory_locks(engine: Engine) -> int:
    with engine.connect() as conn:
        # This database's only: another scenario may share the server.
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )).scalar_one())


def drain_and_check(engine: Engine, timeout: float, problems: list[str],
                    survivors: list[Replica] | None = None) -> float:
    """Wait for the backlog to drain, then check that no advisory lock is left and that each
    of ``survivors`` is still the process it started as. Returns when the drain ended
    (``time.monotonic()``); every failure is added to ``problems``."""
    from reliability.workload import pending_count

    try:
        wait_for(lambda: pending_count(engine) == 0, timeout, "the backlog to drain", interval=0.5)
    except ScenarioError as exc:
        problems.append(str(exc))
    drained = time.monotonic()
    for replica in survivors or []:
        if not replica.alive() or replica.starts != 1:
            problems.append(f"{replica.name} did not survive: alive={replica.alive()} starts={replica.starts}")
    if advisory_locks(engine):
        problems.append("advisory locks still held after the drain")
    return drained


# -- replicas -----------------------------------------------------------------------------


@dataclass
class Replica:
    """One `scheduler serve` process on 127.0.0.1, restartable under the same name and port."""

    name: str
    port: int
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log_level: str = "warning"
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    # An admin token's header: the loop's error text is only on /admin/health/scheduler
    # (the open /health/scheduler never shows it).
    admin_headers: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def scheduler_health(self, http: httpx.Client | None = None, timeout: float = 5) -> tuple[int, dict[str, Any]]:
        """``GET /admin/health/scheduler`` as an admin: (status, body), ``last_error`` included.
        Raises ``httpx.HTTPError`` without an answer, ``ValueError`` for an answer other than
        the route's 200 or 503 (a refused token, say) or a body that is not JSON."""
        get = http.get if http is not None else httpx.get
        response = get(f"{self.base_url}/admin/health/scheduler", headers=self.admin_headers, timeout=timeout)
        if response.status_code not in (200, 503):
            raise ValueError(f"{self.name}: /admin/health/scheduler answered {response.status_code}: "
                             f"{response.text[:200]}")
        body: dict[str, Any] = response.json()
        return response.status_code, body

    def start(self, wait: bool = True, timeout: float = 60) -> None:
        if self.process is not None and self.process.poll() is None:
            raise ScenarioError(f"{self.name} is already running")
        log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", self.log_level],
            env=self.env, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log_file.close()
        self.starts += 1
        if wait:
            self.wait_healthy(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout: float = 60) -> None:
        def up() -> bool:
            if not self.alive():
                raise ScenarioError(f"{self.name} exited with {self.process and self.process.returncode}; "
                                    f"see {self.log_path}")
            try:
                return httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout, f"{self.name} to answer /health")

    def kill(self) -> None:
        """``kill -9``: no shutdown, no rollback from our side; PostgreSQL must clean up."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.exits.append(self.process.wait(timeout=30))

    def terminate(self, timeout: float = 60) -> tuple[int, float]:
        """SIGTERM and wait for the exit; returns (exit code, seconds to exit).

        `serve` shuts down gracefully (the lifespan stops the loop) and exits 0."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            raise ScenarioError(f"{self.name} did not exit within {timeout:g}s of SIGTERM") from None
        self.exits.append(code)
        return code, time.monotonic() - started

    def stop(self) -> None:
        if self.alive():
            self.terminate()

    def clean_shutdowns(self) -> int:
        """How many times uvicorn logged a completed lifespan shutdown (needs log level info)."""
        return self.log_path.read_text(errors="replace").count("Application shutdown complete")


class Cluster:
    """PostgreSQL, one database for this run, and the replicas sharing it."""

    def __init__(self, pgdata: Path, database: str, workdir: Path, *, secret: str | None = None) -> None:
        self.pg = Postgres(pgdata)
        self.database = database
        self.workdir = workdir
        self.secret = secret or secrets.token_urlsafe(48)
        workdir.mkdir(parents=True, exist_ok=True)
        log(f"PostgreSQL: {self.pg.uri} (pgdata {self.pg.pgdata})")
        self.url = self.pg.create_database(database)
        settings = Settings(statement_timeout_ms=120_000, lock_timeout_ms=0, idle_in_transaction_timeout_ms=0)
        self.engine = make_engine(self.url, settings, pool_size=4, max_overflow=2)
        self.replicas: list[Replica] = []
        # Set by a scenario that found a problem: keep the database and logs to look at.
        self.keep = False

    def token(self, scope: str | None) -> str:
        return mint_token(self.secret, scope=scope, ttl_seconds=24 * 3600)

    def headers(self, scope: str = "nudging.admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(scope)}"}

    def add_replica(self, index: int, **env: str) -> Replica:
        name = f"replica-{index}"
        environment = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        environment.update({
            "DATABASE_URL": self.pg.url(self.database, application_name=name),
            "SCHEDULER_JWT_SECRET": self.secret,
            "SCHEDULER_DATA_DIR": str(self.workdir / name),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + environment.get("PYTHONPATH", ""),
        })
        environment.update(env)
        replica = Replica(name, free_port(), environment, self.workdir / f"{name}.log",
                          admin_headers=self.headers("nudging.admin"))
        self.replicas.append(replica)
        return replica

    def close(self, keep: bool = False) -> None:
        for replica in self.replicas:
            try:
                replica.stop()
            except ScenarioError as exc:
                log(f"warning: {exc}")
        self.engine.dispose()
        if not keep:
            self.pg.drop_database(self.database)
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def cluster(pgdata: Path, database: str, workdir: Path, keep: bool = False) -> Iterator[Cluster]:
    running = Cluster(pgdata, database, workdir)
    try:
        yield running
    finally:
        running.close(keep=keep or running.keep)
