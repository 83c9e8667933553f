"""A primary and a streaming standby from the embedded server's own binaries, on 127.0.0.1.

The ``pgserver`` wheel ships PostgreSQL's programs (``initdb``, ``pg_ctl``, ``pg_basebackup``)
beside its server. ``ReplicatedPostgres`` makes a primary (``wal_level = replica``) in a fresh
directory, a standby from it with ``pg_basebackup -R -X stream -C -S standby`` (so a slot holds
the WAL the standby has not received yet), and starts both on free loopback ports; with
``synchronous`` the primary waits for the standby's flush before it acknowledges a commit
(``synchronous_standby_names``). ``kill_primary`` is a crash: SIGKILL to the postmaster and
every one of its processes at once, nothing flushed or said to clients. ``promote`` makes the
standby the primary (``pg_ctl promote -w``).

As root the servers run as the wheel's own system user (``pgserver``, made the way the wheel
makes it), which owns the directory. Every process started here is ended by ``close`` (SIGCONT
first, so that a stopped one does not linger), even after a failure, and every wait has a
deadline.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs; the wheel's own dependency
import psycopg

from reliability.cluster import ScenarioError, free_port, log, wait_for
from reliability.tcp_proxy import TcpProxy

STANDBY_NAME = "standby1"
STANDBY_SLOT = "standby1_slot"
SYSTEM_USER = "pgserver"


def binaries() -> Path:
    """The wheel's PostgreSQL programs."""
    from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


@dataclass
class Node:
    """One server: its data directory, its port on 127.0.0.1 and its socket directory."""

    name: str
    pgdata: Path
    port: int
    socket_dir: Path
    log_path: Path

    def conninfo(self, database: str = "postgres", **options: str) -> str:
        extra = "".join(f" {key}={value}" for key, value in options.items())
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database} connect_timeout=5{extra}"

    def url(self, database: str) -> str:
        """A SQLAlchemy URL to ``database`` on this server alone."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def processes(self) -> list[psutil.Process]:
        """The postmaster and every process it started (backends, walsender, checkpointer...)."""
        pid = self.postmaster_pid()
        if pid is None:
            return []
        try:
            postmaster = psutil.Process(pid)
            if postmaster.name() != "postgres" or str(self.pgdata) not in postmaster.cmdline():
                return []  # a stale pid file: that pid is someone else's now
            return [postmaster, *postmaster.children(recursive=True)]
        except psutil.Error:
            return []


class ReplicatedPostgres:
    """A primary and a standby streaming from it (see the module)."""

    def __init__(self, *, synchronous: bool, root: Path | None = None, log_dir: Path | None = None,
                 link_delay_ms: float = 0.0) -> None:
        self.synchronous = synchronous
        self.link_delay_ms = link_delay_ms
        self.link: TcpProxy | None = None  # the standby's link to the primary, when it has latency
        # Not under a pytest tmp_path (private to root): the servers' user must reach it.
        self.root = root or Path(tempfile.mkdtemp(prefix="reliability-replication-"))
        self.log_dir = log_dir or self.root
        self.run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self.primary = self._node("primary")
        self.standby = self._node("standby")
        self.started: list[Node] = []
        self.killed_at: float | None = None
        self.promoted_at: float | None = None  # when pg_ctl promote -w returned: writes are accepted
        self.promotion_seconds: float | None = None

    def _node(self, name: str) -> Node:
        return Node(name, self.root / name, free_port(), self.root / f"{name}-socket",
                    self.log_dir / f"postgres-{name}.log")

    # -- running the wheel's programs ---------------------------------------------------

    def _run(self, program: str, args: list[str], timeout: float = 120) -> str:
        """Run one of the wheel's programs (as its system user under root); its output, or a
        ``ScenarioError`` with its stderr."""
        command = [str(binaries() / program), *args]
        identity: dict[str, Any] = {}
        if self.run_as is not None:
            identity = {"user": self.run_as, "group": self.run_as, "extra_groups": []}
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            # files, not pipes: pg_ctl's server inherits the streams and would hold a pipe open
            try:
                subprocess.run(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True, timeout=timeout,
                               check=True, cwd=self.root, **identity)
            except subprocess.CalledProcessError as exc:
                err.seek(0)
                raise ScenarioError(
                    f"{program} {' '.join(args)} failed ({exc.returncode}): {err.read()[-2000:]}") from None
            except subprocess.TimeoutExpired:
                raise ScenarioError(f"{program} {' '.join(args)} did not finish within {timeout:g}s") from None
            out.seek(0)
            return out.read()

    def _own(self, *paths: Path) -> None:
        """Give ``paths`` to the servers' user (as root), so the servers may write there."""
        if self.run_as is None:
            return
        account = pwd.getpwnam(self.run_as)
        for path in paths:
            os.chown(path, account.pw_uid, account.pw_gid)

    def _prepare_root(self) -> None:
        if self.run_as is not None:
            from pgserver.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            ensure_user_exists(self.run_as)  # the wheel makes its user so; it exists once it ran once
            ensure_prefix_permissions(binaries())
            ensure_folder_permissions(binaries(), 0o055)
            ensure_folder_permissions(binaries().parent / "lib", 0o044)
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        for node in (self.primary, self.standby):
            node.socket_dir.mkdir(exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._own(self.root, self.primary.socket_dir, self.standby.socket_dir)

    def _server_log(self, node: Node) -> Path:
        """Where the server writes its log (a directory its user may write), copied to
        ``node.log_path`` at close."""
        return self.root / f"{node.name}.log"

    # -- the pair ------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        """The primary, then the standby from its base backup, streaming (and synchronous if asked)."""
        self._prepare_root()
        primary, standby = self.primary, self.standby
        self._run("initdb", ["-D", str(primary.pgdata), "-U", "postgres", "--auth=trust", "--auth-local=trust",
                             "--encoding=utf8", "--no-sync"])
        with (primary.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n".join([
                "", "# reliability.replication",
                "wal_level = replica", "max_wal_senders = 5", "max_replication_slots = 5", "hot_standby = on",
                "wal_keep_size = '64MB'", "max_connections = 200", "shared_buffers = '64MB'",
                "log_min_messages = warning", "log_line_prefix = '%m [%p] '", "",
            ]))
        self._start(primary, timeout)
        self._run("pg_basebackup", ["-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                                    "-D", str(standby.pgdata), "-R", "-X", "stream", "-C", "-S", STANDBY_SLOT],
                  timeout=timeout)
        auto = standby.pgdata / "postgresql.auto.conf"
        text = auto.read_text()
        named, count = re.subn(r"^(primary_conninfo = '.*)'$", rf"\1 application_name={STANDBY_NAME}'", text,
                               flags=re.M)
        if count != 1:
            raise ScenarioError(f"pg_basebackup -R wrote no primary_conninfo line in {auto}")
        if self.link_delay_ms > 0:
            # the WAL goes through a slow link: a proxy that holds each chunk link_delay_ms each way
            self.link = TcpProxy(None, self.log_dir / "link.log", target=("127.0.0.1", primary.port),
                                 delay_ms=self.link_delay_ms)
            self.link.start()
            named = named.replace(f"port={primary.port}", f"port={self.link.port}")
        auto.write_text(named)
        self._start(standby, timeout)
        if self.synchronous:
            with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                conn.execute("SELECT pg_reload_conf()")
        wanted = "sync" if self.synchronous else "async"
        wait_for(lambda: self.replication_state() == ("streaming", wanted), timeout,
                 f"the standby to stream from the primary ({wanted})", interval=0.1)
        link = f" through a link of {self.link_delay_ms:g} ms each way" if self.link is not None else ""
        log(f"replication: primary 127.0.0.1:{primary.port}, standby 127.0.0.1:{standby.port} "
            f"streaming ({wanted}){link}, in {self.root}")

    def _start(self, node: Node, timeout: float, *options: str) -> None:
        server_options = f"-p {node.port} -k {node.socket_dir} -c listen_addresses=127.0.0.1"
        if options:
            server_options = " ".join(options)
        self._run("pg_ctl", ["-D", str(node.pgdata), "-l", str(self._server_log(node)), "-w", "-t", str(int(timeout)),
                             "-o", server_options, "start"], timeout=timeout + 10)
        if node not in self.started:
            self.started.append(node)

    def replication_state(self) -> tuple[str, str] | None:
        """(state, sync_state) of the standby as the primary sees it, or None."""
        with psycopg.connect(self.primary.conninfo(), autocommit=True) as conn:
            row = conn.execute("SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                               (STANDBY_NAME,)).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def wait_caught_up(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary wrote so far (what a scenario
        seeded before its fault is on both servers, synchronous or not)."""
        with psycopg.connect(self.primary.conninfo(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = str(row[0])

        def replayed() -> bool:
            with psycopg.connect(self.primary.conninfo(), autocommit=True) as conn:
                done = conn.execute("SELECT replay_lsn >= %s::pg_lsn FROM pg_stat_replication "
                                    "WHERE application_name = %s", (target, STANDBY_NAME)).fetchone()
            return bool(done and done[0])

        wait_for(replayed, timeout, "the standby to replay the primary's WAL", interval=0.05)

    def kill_primary(self) -> int:
        """A crash of the primary: SIGKILL to the postmaster and all its processes at once (and to
        the standby's slow link, if any: what was on the wire is lost with the host). Returns how
        many processes of the primary were killed."""
        victims = self.primary.processes()
        if not victims:
            raise ScenarioError("the primary is not running")
        postmaster = victims[0].pid
        # pg_ctl starts the postmaster in a session of its own: one signal to its process group
        # reaches every process at once, and none of them outlives the others to say goodbye.
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(postmaster) == postmaster:
                os.killpg(postmaster, signal.SIGKILL)
        if self.link is not None:
            self.link.kill()
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
        gone, alive = psutil.wait_procs(victims, timeout=30)
        if alive:
            raise ScenarioError(f"{len(alive)} processes of the primary outlived SIGKILL")
        return len(gone)

    def promote(self, timeout: float = 60) -> None:
        """``pg_ctl promote -w``: the standby ends recovery and accepts writes."""
        started = time.monotonic()
        self._run("pg_ctl", ["-D", str(self.standby.pgdata), "-w", "-t", str(int(timeout)), "promote"],
                  timeout=timeout + 10)
        self.promoted_at = time.monotonic()
        self.promotion_seconds = self.promoted_at - started

    @contextlib.contextmanager
    def old_primary(self, timeout: float = 60) -> Iterator[Node]:
        """The killed primary's data, started again on its Unix socket only (no TCP: no client
        of the scenario can reach it) and without waiting for any standby, to read what it had
        committed; stopped on the way out."""
        node = self.primary
        self._start(node, timeout, f"-p {node.port} -k {node.socket_dir}", "-c listen_addresses=''",
                    "-c synchronous_standby_names=''")
        try:
            yield node
        finally:
            self._stop(node)

    def stop_standby(self) -> None:
        """Stop the standby (the new primary after ``promote``) at once."""
        self._stop(self.standby)

    def old_primary_conninfo(self, database: str) -> str:
        return f"host={self.primary.socket_dir} port={self.primary.port} user=postgres dbname={database}"

    def _stop(self, node: Node) -> None:
        """``pg_ctl stop -m immediate`` (every process continued first: a stopped one would not
        hear it); then anything left of it is killed."""
        running = node.processes()
        for process in running:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGCONT)
        if running:
            with contextlib.suppress(ScenarioError):
                self._run("pg_ctl", ["-D", str(node.pgdata), "-w", "-t", "30", "-m", "immediate", "stop"], timeout=40)
        leftovers = node.processes()
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGCONT)  # a stopped process ignores SIGKILL until continued
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(leftovers, timeout=30)

    def close(self, keep: bool = False) -> None:
        """Stop every server started here, keep their logs beside the scenario's, and remove
        the directory (unless ``keep``)."""
        if self.link is not None:
            self.link.stop()
        for node in (self.standby, self.primary):
            self._stop(node)
            server_log = self._server_log(node)
            if server_log.exists() and server_log != node.log_path:
                with contextlib.suppress(OSError):
                    shutil.copyfile(server_log, node.log_path)
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicatedPostgres:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
