"""EMB-9: the worked example a host team copies (examples/fastapi_host), run for real.

A FastAPI notification service with its own Alembic schema (a ``notifications`` table of its
own among it), its own engine, its own dispatcher writing a ``host_deliveries`` row in the
scheduler's transaction, and its own tokens, with the scheduler's API mounted beside its
routes. Here it runs under uvicorn on the embedded PostgreSQL: both schemas migrated into one
blank database, reminders stored through the mount (one re-posted by key, one for a
participant the host refuses), the rows and the host's table checked, FastAPI's ``/docs`` and
the host's routes beside the mount, and a clean SIGTERM (a complete shutdown).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from reliability.cluster import free_port, wait_for
from sqlalchemy import create_engine, make_url, text

from scheduler.database.engine import drop_database, ensure_database

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_host"
pytest.importorskip("fastapi", reason="FastAPI is a test dependency (the example's framework)")


@pytest.fixture
def blank_database(postgresql: psycopg.Connection[Any]) -> Iterator[str]:
    """A database with nothing in it, as a host's would be before either side migrated."""
    info = postgresql.info
    admin = f"postgresql+psycopg://{info.user}@/postgres?host={info.host}&port={info.port}"
    name = f"fastapi_host_{uuid.uuid4().hex[:8]}"
    ensure_database(admin, name)
    yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    drop_database(admin, name)


def _run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(args, cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.mark.clause("EMB-9")
@pytest.mark.clause("EMB-23")
@pytest.mark.clause("PERM-11")
def test_the_fastapi_host_example_migrates_both_schemas_dispatches_through_its_own_dispatcher_and_stops_cleanly(
    blank_database: str, tmp_path: Path
) -> None:
    """EMB-9: the example's two migrations share one database (the host's ``notifications``
    beside the scheduler's), reminders stored through the mount with the host's tokens go out
    through the host's dispatcher (exactly one ``host_deliveries`` row per dispatched event, none
    for the refused one, a re-post by key is one row), ``/docs`` and the host's routes answer
    beside the mount, its one ``/openapi.json`` lists both, the console is not mounted, and
    SIGTERM ends it with exit 0 and no error; PERM-11: all of it with ``SCHEDULER_ENV=production``
    and no scheduler key, the host's own authentication deciding."""
    src = Path(__file__).resolve().parents[2] / "src"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    # production, with the host's own authentication and no SCHEDULER_JWT_* key (PERM-11)
    env.update({"DATABASE_URL": blank_database, "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{src}",
                "SCHEDULER_ENV": "production", "SCHEDULER_POLL_SECONDS": "0.2",
                "SCHEDULER_DATA_DIR": str(tmp_path / "data")})
    env.pop("HOST_TOKEN_SECRET", None)  # the example's development secret, in both processes
    _run(env, sys.executable, "-m", "alembic", "-c", "alembic.ini", "upgrade", "head")
    _run(env, sys.executable, "-m", "scheduler", "migrate")
    engine = create_engine(blank_database)
    with engine.begin() as conn:
        # each side's history in its own version table: the host's untouched by the scheduler's
        assert conn.execute(text("SELECT version_num FROM public.alembic_version")).scalars().all() == [
            "host_0002_commitments"]
        conn.execute(text("INSERT INTO users (id, opted_out) VALUES ('anna', false), ('bob', false), "
                          "('carl', true)"))
        conn.execute(text("INSERT INTO notifications (user_id, body) VALUES ('anna', 'the host''s own')"))
    sys.path.insert(0, str(EXAMPLE))
    try:
        from host_service.auth import mint
    finally:
        sys.path.remove(str(EXAMPLE))
    sender = {"Authorization": f"Bearer {mint('sender-1', ['sender'])}"}
    admin = {"Authorization": f"Bearer {mint('ops', ['admin'])}"}
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "host_service.app:app", "--port", str(port)],
            cwd=EXAMPLE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: "Uvicorn running" in log_path.read_text() or process.poll() is not None, 60,
                 "uvicorn to start the host")
        assert process.poll() is None, log_path.read_text()
        with httpx.Client(base_url=base, timeout=10) as client:
            due = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()

            def post(user: str, key: str | None, commitment: str) -> dict[str, Any]:
                # the host's own facts contract: a commitment, no facts_version nor scenario
                body = {"event_type": "commitment_reminder", "user_id": user, "trigger_at": due,
                        "facts": {"commitment": commitment}}
                if key:
                    body["external_key"] = key
                answer = client.post("/nudging/admin/scheduled-events", headers=sender, json=body)
                assert answer.status_code == 201, answer.text
                row: dict[str, Any] = answer.json()
                return row

            first = post("anna", "anna-dishwasher", "run the dishwasher")
            again = post("anna", "anna-dishwasher", "run the dishwasher at noon")
            bob = post("bob", None, "charge the car")
            carl = post("carl", None, "hang the washing out")
            assert first["id"] == again["id"]
            assert client.post("/nudging/admin/scheduled-events", json={}).status_code == 401
            ids = {first["id"], bob["id"], carl["id"]}

            def settled() -> bool:
                rows = [client.get(f"/nudging/admin/scheduled-events/{i}", headers=admin).json() for i in ids]
                return all(r["status"] != "pending" for r in rows)

            wait_for(settled, 30, "the host's loop to dispatch every reminder")
            rows = {i: client.get(f"/nudging/admin/scheduled-events/{i}", headers=admin).json() for i in ids}
            assert rows[first["id"]]["status"] == rows[bob["id"]]["status"] == "dispatched"
            assert rows[carl["id"]]["status"] == "failed", rows[carl["id"]]
            assert "opted out" in rows[carl["id"]]["last_error"]
            deliveries = client.get("/host/deliveries").json()
            assert sorted((d["scheduled_event_id"], d["body"]) for d in deliveries) == sorted([
                (first["id"], "Reminder: run the dishwasher at noon"), (bob["id"], "Reminder: charge the car")])
            assert client.get("/host/notifications").json() == [
                {"id": 1, "user_id": "anna", "body": "the host's own"}]
            assert client.get("/docs").status_code == 200
            paths = client.get("/openapi.json").json()["paths"]  # one document: the host's and ours
            assert {"/host/deliveries", "/nudging/admin/scheduled-events"} <= set(paths)
            assert client.get("/nudging/health/scheduler").json()["state"] == "running"
            assert client.get("/nudging/console", headers=admin).status_code == 404
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        engine.dispose()
    output = log_path.read_text()
    # uvicorn re-raises the signal once its shutdown is complete (a supervisor then sees the
    # signal it sent); what matters is the complete shutdown before it
    assert code in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output and "Finished server process" in output
    assert "Traceback" not in output and "ERROR" not in output, output
