"""WIRE-5 to WIRE-7: what shares the API process with the loop cannot stall it or the event loop.

- WIRE-5: a JWKS key fetch (blocking network I/O) runs off the event loop.
- WIRE-6: requests that take every request thread and every pooled connection do not
  starve the polls: the loop has a thread limiter and a connection pool of its own.
- WIRE-7: the package imports what it needs only (``scheduler.nudging.rules`` pulls in no web
  framework), and a subcommand whose module is broken fails loudly instead of vanishing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler import cli, extensions
from scheduler.core.clock import SystemClock
from tests.conftest import T0, TEST_SECRET, token
from tests.helpers import DEADLINE_SECONDS, event_body, eventually, statuses
from tests.security.support import auth, claims, other_rsa_private_key
from tests.wiring.support import jwks_endpoint, service_from_env


@pytest.mark.clause("WIRE-5")
def test_a_jwks_fetch_does_not_block_other_requests(database_url: str, tmp_path: Path) -> None:
    """WIRE-5: while one request waits for the JWKS endpoint, another request is answered."""
    with jwks_endpoint(other_rsa_private_key()) as jwks, service_from_env({
        "DATABASE_URL": database_url, "SCHEDULER_JWKS_URL": jwks.url, "SCHEDULER_DATA_DIR": str(tmp_path),
        "SCHEDULER_ENABLED": "false",
    }) as service:
        jwks.gate.clear()  # every fetch now waits until the test opens the gate

        async def scenario() -> None:
            transport = httpx.ASGITransport(app=service.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
                waiting = asyncio.create_task(
                    client.get("/admin/scheduled-events", headers=auth(jwks.token(claims()))))
                await eventually(jwks.fetching.is_set, "the request to fetch the JWKS")
                other = await asyncio.wait_for(client.get("/health"), timeout=DEADLINE_SECONDS)
                assert other.status_code == 200
                assert not waiting.done(), "the JWKS request finished first: was the event loop blocked?"
                jwks.gate.set()
                assert (await asyncio.wait_for(waiting, timeout=DEADLINE_SECONDS)).status_code == 200

        asyncio.run(scenario())


def _blocked_on_locks(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )).scalar_one())


@pytest.mark.clause("WIRE-6")
def test_polls_keep_completing_while_requests_hold_every_thread_and_connection(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    """WIRE-6: sixty requests blocked on a row lock hold all request threads and pooled
    connections; meanwhile the loop keeps polling and dispatches a due event."""
    with engine.begin() as conn:  # a due event for the loop, stored before the siege
        conn.execute(text(
            "INSERT INTO scheduled_events (id, event_type, user_id, trigger_at, facts, status, created_at, updated_at) "
            "VALUES ('due-1', 'reminder', 'loop-user', :t, CAST(:facts AS jsonb), 'pending', :t, :t)"),
            {"t": datetime.now(UTC) - timedelta(hours=1),
             "facts": '{"facts_version": "1", "scenario": "commitment_reminder", '
                                                   '"date": "2026-11-30", "commitment": "x"}'})
    env = {"DATABASE_URL": database_url, "SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_DATA_DIR": str(tmp_path),
           "SCHEDULER_POLL_SECONDS": "0", "SCHEDULER_LOCK_TIMEOUT_MS": "0", "SCHEDULER_POOL_TIMEOUT_SECONDS": "120"}
    body = event_body(external_key="contended", trigger_at=T0 + timedelta(days=1))
    holder = engine.connect()
    with service_from_env(env, clock=SystemClock()) as service:
        async def scenario() -> None:
            transport = httpx.ASGITransport(app=service.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://service", timeout=120) as client:
                assert (await client.post("/admin/scheduled-events", headers=auth(token("nudging.ingest")),
                                          json=body)).status_code == 201
                holder.execute(text("SELECT id FROM scheduled_events WHERE external_key = 'contended' FOR UPDATE"))
                siege = [asyncio.create_task(client.post("/admin/scheduled-events",
                                                         headers=auth(token("nudging.ingest")), json=body))
                         for _ in range(60)]
                pool = service.engine.pool
                await eventually(lambda: _blocked_on_locks(engine) >= pool.size() + pool._max_overflow,  # type: ignore[attr-defined]
                                 "every pooled request connection to block on the row lock")
                await service.start()
                try:
                    before = service.scheduler.health.polls
                    await eventually(lambda: service.scheduler.health.polls >= before + 3,
                                     "three polls while the requests are blocked")
                    assert statuses(engine)["due-1"] == "dispatched"
                    assert not any(task.done() for task in siege), "the siege ended early"
                finally:
                    holder.rollback()
                    await service.stop()
                answers = await asyncio.wait_for(asyncio.gather(*siege), timeout=DEADLINE_SECONDS * 4)
                assert {a.status_code for a in answers} == {201}

        try:
            asyncio.run(scenario())
        finally:
            holder.close()


@pytest.mark.clause("WIRE-7")
def test_importing_the_rules_pulls_in_no_web_framework_migrations_or_jwt() -> None:
    """WIRE-7: ``import scheduler.nudging.rules`` (a rule author's import) loads neither Starlette,
    Alembic nor PyJWT."""
    probe = ("import sys, scheduler.nudging.rules; "
             "print(sorted(m for m in ('starlette', 'alembic', 'jwt', 'uvicorn') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.clause("WIRE-7")
def test_a_subcommand_whose_module_is_broken_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    """WIRE-7: a broken import in an extension (``simulate``, ``bench``) is an error naming
    it when that subcommand runs, not a subcommand that silently disappears; the other
    commands (and ``--help``) never import it, so it cannot stop them."""
    broken = (extensions.Extension("simulate", "scheduler.no_such_module", "add_command", "the simulation"),
              extensions.Extension("bench", "bench.no_such_module", "add_command", "benchmarks", checkout_only=True))
    monkeypatch.setattr(extensions, "EXTENSIONS", broken)
    help_text = cli.build_parser().format_help()
    assert "simulate" in help_text and "bench" in help_text
    with pytest.raises(ImportError, match="no_such_module"):
        cli.main(["simulate", "--steps", "1"])
    with pytest.raises(ImportError, match=r"bench\.no_such_module"):
        cli.main(["bench", "claim"])  # a checkout's bench/ is found, and its broken module still fails
    monkeypatch.undo()
    help_text = cli.build_parser().format_help()
    assert "simulate" in help_text and "bench" in help_text


@pytest.mark.clause("WIRE-8")
def test_the_engines_a_service_created_are_disposed_when_its_lifespan_ends(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    """WIRE-8: after service.app's lifespan ends, no connection of the engines it created
    (requests' and loop's) is left open in PostgreSQL; an engine passed in stays usable."""
    tagged = f"{database_url}&application_name=dispose-check"
    env = {"DATABASE_URL": tagged, "SCHEDULER_JWT_SECRET": TEST_SECRET, "SCHEDULER_DATA_DIR": str(tmp_path),
           "SCHEDULER_POLL_SECONDS": "3600"}

    def backends() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dispose-check'")).scalar_one())

    with service_from_env(env, clock=SystemClock()) as service:
        with TestClient(service.app) as client:
            assert client.get("/admin/scheduled-events", headers=auth(token("nudging.admin"))).status_code == 200
            asyncio.run(eventually(lambda: service.scheduler.health.polls >= 1, "the first poll"))
            assert backends() >= 2  # one pooled connection each for requests and the loop
        asyncio.run(eventually(lambda: backends() == 0, "the service's connections to close"))
    with engine.connect() as conn:  # the test's own engine, never the service's to dispose
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
