"""Where the benchmarks run: the server, a fresh database per benchmark, the machine's facts.

By default the server is the embedded PostgreSQL (``pgserver``) in
``$SCHEDULER_DATA_DIR/pgdata``, exactly as ``scheduler serve`` would start it; with
``--database-url`` (or ``DATABASE_URL``) it is that server instead. Each benchmark creates
its own database, migrates it with Alembic, and drops it at the end, so runs never see
each other's rows.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError

from scheduler.config import Settings
from scheduler.database.engine import (
    create_migrated_database,
    drop_database,
    embedded_server_uri,
    make_engine,
    sqlalchemy_url,
)
from scheduler.database.queries import Query, load_queries

BENCH_SQL = Path(__file__).parent / "sql" / "bench.sql"
# One instant for every run: the claim binds it as :now, the loaders place rows around it.
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
DAY = "2026-11-30"


def progress(message: str) -> None:
    """A progress line on stderr (stdout stays free for the table)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def bench_query(name: str) -> Query:
    return load_queries(BENCH_SQL)[name]


def bench_sql(name: str) -> Any:
    """A benchmark statement (bench/sql/bench.sql) as a SQLAlchemy ``text``."""
    return bench_query(name).statement


def psycopg_sql(sql: str) -> str:
    """A named-parameter statement (``:now``) in psycopg's style (``%(now)s``), comments dropped."""
    lines = [line.split("--", 1)[0].rstrip() for line in sql.splitlines()]
    body = "\n".join(line for line in lines if line.strip())
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", body.replace("%", "%%"))


def libpq_uri(url: str) -> str:
    """A SQLAlchemy URL as a libpq URI (for psycopg, procrastinate, pgqueuer, DATABASE_URL)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Server:
    """A PostgreSQL server the benchmarks may create and drop databases on."""

    def __init__(self, database_url: str | None = None, settings: Settings | None = None) -> None:
        settings = settings or Settings.from_env()
        url = database_url or settings.database_url
        if url:
            self.admin_url = sqlalchemy_url(url)
            self.embedded = False
        else:
            pgdata = settings.data_dir / "pgdata"
            progress(f"starting (or joining) the embedded PostgreSQL in {pgdata}")
            self.admin_url = sqlalchemy_url(embedded_server_uri(pgdata), "postgres")
            self.embedded = True

    def _admin(self) -> Engine:
        return create_engine(self.admin_url, isolation_level="AUTOCOMMIT")

    @contextlib.contextmanager
    def fresh_database(self, label: str) -> Iterator[str]:
        """A newly created, migrated database (its SQLAlchemy URL), dropped afterwards."""
        name = f"bench_{label}_{os.getpid()}_{secrets.token_hex(3)}"
        try:
            yield create_migrated_database(self.admin_url, name)
        finally:
            drop_database(self.admin_url, name)

    def facts(self) -> dict[str, Any]:
        """PostgreSQL's version and the settings that shape the figures."""
        admin = self._admin()
        try:
            with admin.connect() as conn:
                version = conn.execute(text("SELECT version()")).scalar_one()
                shown = {
                    name: conn.execute(text(f"SHOW {name}")).scalar_one()
                    for name in ("shared_buffers", "work_mem", "max_connections", "synchronous_commit", "fsync")
                }
        finally:
            admin.dispose()
        return {"version": version, "embedded": self.embedded, "settings": shown}


def bench_engine(url: str, **kwargs: Any) -> Engine:
    """An engine with production's connection options and a generous statement timeout."""
    settings = Settings(statement_timeout_ms=600_000, lock_timeout_ms=0, idle_in_transaction_timeout_ms=0)
    return make_engine(url, settings, **kwargs)


def load_events(engine: Engine, *, pending: int, terminal: int = 0, prefix: str = "user-", held: int = 0) -> None:
    """Bulk-load due pending rows (and older terminal rows, and pending rows ``held`` in quiet
    hours until after ``NOW``), then ANALYZE."""
    params: Mapping[str, Any] = {"now": NOW, "day": DAY, "prefix": prefix}
    with engine.begin() as conn:
        if terminal:
            conn.execute(bench_sql("load_terminal_events"), {**params, "count": terminal})
        if held:
            conn.execute(bench_sql("load_held_events"), {**params, "count": held})
        if pending:
            conn.execute(bench_sql("load_pending_events"), {**params, "count": pending})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(bench_sql("analyze_events"))
    checkpoint(engine)


def checkpoint(engine: Engine) -> None:
    """Flush a bulk load's dirty pages now, so the checkpoint it would trigger later does
    not compete with the measurements (skipped where the role may not CHECKPOINT)."""
    with contextlib.suppress(DBAPIError), engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(bench_sql("checkpoint"))


def machine_facts() -> dict[str, Any]:
    """Cores, memory, CPU model, load and Python: what a reader needs to weigh the figures."""
    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        meminfo = Path("/proc/meminfo").read_text()
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        if match:
            facts["memory_gib"] = round(int(match[1]) / 1024 / 1024, 1)
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        match = re.search(r"model name\s*:\s*(.+)", cpuinfo)
        if match:
            facts["cpu"] = match[1].strip()
    with contextlib.suppress(OSError):
        facts["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return facts


def rss_bytes() -> int:
    """This process's resident set size, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")
