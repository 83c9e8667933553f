"""A real PgBouncer (Debian's ``pgbouncer`` package) in front of the embedded PostgreSQL.

It listens on 127.0.0.1 on a free port and reaches PostgreSQL through the server's Unix
socket, with a generated ini and userlist (``auth_type = trust``: the embedded server
trusts local connections too). As root, PgBouncer refuses to run unless told a user to
become (``-u``); it becomes the owner of PostgreSQL's socket directory (pgserver's system
user), the only user that may open that socket, and so its files live in a directory of
their own that this user owns (a pytest ``tmp_path`` is private to root). The log is
copied next to the scenario's other logs when PgBouncer stops.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import urlencode

import psycopg

from reliability.cluster import ScenarioError, free_port, log, wait_for

BINARY_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None when the package is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((path for path in BINARY_CANDIDATES if os.access(path, os.X_OK)), None)


class PgBouncer:
    """One PgBouncer process; ``start`` returns once it accepts a query, ``stop`` ends it.

    ``pool_size`` is PgBouncer's ``default_pool_size``: the server connections per
    database and user, which every client connection shares one transaction at a time.
    """

    def __init__(self, server_host: str, log_dir: Path, *, server_port: int = 5432, pool_mode: str = "transaction",
                 pool_size: int = 8, user: str = "postgres", password: str = "") -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise ScenarioError("pgbouncer is not installed (Debian: apt-get install pgbouncer; "
                                "scripts/system-packages installs it)")
        self.binary = binary
        self.server_host = server_host  # a Unix socket directory or a host name
        self.server_port = server_port
        self.log_dir = log_dir
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.user = user
        self.password = password  # for PgBouncer's own login to the server; clients are trusted
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.home: Path | None = None
        # As root, become whoever owns PostgreSQL's socket directory (the only one who may
        # use it), or nobody for a server reached over TCP.
        self.run_as: str | None = None
        if os.geteuid() == 0:
            self.run_as = pwd.getpwuid(os.stat(server_host).st_uid).pw_name if server_host.startswith("/") else "nobody"

    def url(self, database: str, application_name: str | None = None) -> str:
        """A SQLAlchemy URL for ``database`` through PgBouncer."""
        query = f"?{urlencode({'application_name': application_name})}" if application_name else ""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}{query}"

    def conninfo(self, database: str) -> str:
        """A libpq URI for ``database`` through PgBouncer (``pgbouncer`` is the admin console)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def _write_config(self, home: Path) -> Path:
        ini = home / "pgbouncer.ini"
        userlist = home / "userlist.txt"
        userlist.write_text(f'"{self.user}" ""\n')
        ini.write_text("\n".join([
            "[databases]",
            # every database name is forwarded to the embedded server's Unix socket
            f"* = host={self.server_host} port={self.server_port} user={self.user}"
            + (f" password={self.password}" if self.password else ""),
            "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",  # no socket of its own: loopback TCP only
            "auth_type = trust",
            f"auth_file = {userlist}",
            f"pool_mode = {self.pool_mode}",
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 500",
            f"admin_users = {self.user}",
            f"logfile = {home / 'pgbouncer.log'}",
            "server_login_retry = 1",
            "",
        ]))
        return ini

    def start(self, timeout: float = 30) -> None:
        if self.process is not None:
            raise ScenarioError("pgbouncer is already running")
        self.home = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        ini = self._write_config(self.home)
        command = [self.binary]
        if self.run_as is not None:
            account = pwd.getpwnam(self.run_as)
            for path in [self.home, *self.home.iterdir()]:
                os.chown(path, account.pw_uid, account.pw_gid)
            command += ["-u", self.run_as]
        command.append(str(ini))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / "pgbouncer.out").open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._answers, timeout, f"pgbouncer on 127.0.0.1:{self.port} to answer")
        log(f"pgbouncer {self.pool_mode} pooling on 127.0.0.1:{self.port} -> {self.server_host} "
            f"(pool size {self.pool_size}{', as ' + self.run_as if self.run_as else ''})")

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ScenarioError(f"pgbouncer exited with {self.process.returncode}; "
                                f"see {self.log_dir / 'pgbouncer.out'}")
        try:
            with psycopg.connect(self.conninfo("postgres"), connect_timeout=2, autocommit=True) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        except psycopg.Error:
            return False

    def admin(self, command: str) -> list[dict[str, object]]:
        """Run ``SHOW ...`` on PgBouncer's admin console (simple query protocol only)."""
        with psycopg.connect(self.conninfo("pgbouncer"), connect_timeout=5, autocommit=True) as conn:
            cursor = psycopg.ClientCursor(conn)
            cursor.execute(command)
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (PgBouncer closes its connections at once), then keep its log."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=timeout)
            self.process = None
        if self.home is not None:
            if (self.home / "pgbouncer.log").exists():
                shutil.copyfile(self.home / "pgbouncer.log", self.log_dir / "pgbouncer.log")
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
