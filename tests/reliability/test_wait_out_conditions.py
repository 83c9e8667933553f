"""REL-20: every database condition a client can wait out is a 503 with Retry-After, on every
route: a read-only database (a standby after a failover), too many connections, an admin
shutdown, a serialization failure, a deadlock, a lock or statement timeout. A sender that
retries on 503 then loses nothing; an error no wait can cure stays a 500.

The read-only database is real PostgreSQL (``default_transaction_read_only = on``). The
conditions that cannot be produced on demand for every route at once come from a failing
database at the driver's edge (``FailingDatabase``): each statement raises the error
psycopg raises for that SQLSTATE, as the server would send it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient

from scheduler.service import SchedulerService
from scheduler.web.http.errors import wait_out_reason
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import post_event, reminder_facts
from tests.security.hostile import call, targets
from tests.security.test_hostile_input import console_session

UNAVAILABLE = {"detail": "database unavailable; retry later"}
# The conditions a client waits out, by the SQLSTATE the server sends (PostgreSQL appendix A).
WAIT_OUT = {
    "25006": "read_only_sql_transaction",
    "53300": "too_many_connections",
    "57P01": "admin_shutdown",
    "57P03": "cannot_connect_now",
    "40001": "serialization_failure",
    "40P01": "deadlock_detected",
    "55P03": "lock_not_available",
    "57014": "query_canceled",
    "08006": "connection_failure",
}
NO_WAIT_CURES = {"42P01": "undefined_table", "42501": "insufficient_privilege", "XX000": "internal_error"}


class FailingDatabase:
    """A fake at the driver's edge: while installed, every statement on ``engine`` raises
    psycopg's error for ``sqlstate`` (SQLAlchemy wraps it as it wraps the server's)."""

    def __init__(self, engine: Engine, sqlstate: str) -> None:
        self.engine = engine
        self.error = psycopg.errors.lookup(sqlstate)

    def _fail(self, *_: Any) -> bool:
        raise self.error(f"injected {self.error.__name__}")

    @contextmanager
    def installed(self) -> Iterator[None]:
        hooks = ("do_execute", "do_execute_no_params", "do_executemany")
        for hook in hooks:
            event.listen(self.engine, hook, self._fail)
        try:
            yield
        finally:
            for hook in hooks:
                event.remove(self.engine, hook, self._fail)


@contextmanager
def read_only(engine: Engine) -> Iterator[None]:
    """The database as a standby serves it: every new transaction is read-only."""
    with engine.connect() as conn:
        conn.execute(text("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', "
                          "current_database()); END $$"))
        conn.commit()
    engine.dispose()  # pooled connections started before the switch: the new ones are read-only
    try:
        yield
    finally:
        with engine.connect() as conn:
            conn.execute(text("SET TRANSACTION READ WRITE"))  # this one transaction may write
            conn.execute(text("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only', "
                              "current_database()); END $$"))
            conn.commit()
        engine.dispose()


def _event() -> dict[str, Any]:
    return {"event_type": "commitment_reminder", "user_id": "participant-1", "trigger_at": T0.isoformat(),
            "facts": reminder_facts()}


def _unavailable(response: Any, label: str) -> None:
    assert response.status_code == 503, f"{label}: {response.status_code} {response.text[:300]}"
    assert response.json() == UNAVAILABLE, label
    assert response.headers.get("retry-after") == "5", label


@pytest.mark.clause("REL-20")
def test_a_read_only_database_is_a_503_with_retry_after_on_every_route_that_writes_and_the_retry_lands(
    client: TestClient, engine: Engine
) -> None:
    """REL-20: after a failover to a standby (``default_transaction_read_only = on``) every
    write is a 503 with Retry-After, reads still answer, and the sender's retry is stored."""
    existing = post_event(client)["id"]
    event = _event()
    writes: list[tuple[str, str, dict[str, Any] | None, Any]] = [
        ("POST", "/admin/scheduled-events", event, INGEST),
        ("POST", "/admin/ingest-event", {k: v for k, v in event.items() if k != "trigger_at"}, INGEST),
        ("PUT", "/admin/participants/participant-1/preferences", {"max_per_day": 2}, ADMIN),
        ("POST", f"/admin/scheduled-events/{existing}/reset", None, ADMIN),
        ("DELETE", f"/admin/scheduled-events/{existing}", None, ADMIN),
    ]
    with read_only(engine):
        for method, path, body, headers in writes:
            _unavailable(client.request(method, path, json=body, headers=headers), f"{method} {path}")
        assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 200
    stored = client.post("/admin/scheduled-events", json=event, headers=INGEST)
    assert stored.status_code == 201, stored.text


@pytest.mark.clause("REL-20")
@pytest.mark.parametrize("sqlstate", sorted(WAIT_OUT), ids=lambda s: f"{s}-{WAIT_OUT[s]}")
def test_every_condition_a_client_can_wait_out_is_a_503_with_retry_after_on_every_route(
    service: SchedulerService, engine: Engine, sqlstate: str
) -> None:
    """REL-20: on every route of the app, a statement that meets the condition answers 503
    with Retry-After; no route answers 500."""
    session = console_session(service)
    unavailable = []
    with FailingDatabase(engine, sqlstate).installed():
        for target in targets(service.app.routes):
            answer = call(service.app, target.method, target.path, target.finite, target.credentials(session))
            assert answer.error is None, f"{target.label}: {answer.error!r}"
            if answer.status == 503 and target.template in ("/health/scheduler", "/admin/health/scheduler"):
                continue  # documented: no loop runs in this test's service
            assert answer.status != 500, f"{target.label}: {answer.text[:300]}"
            if answer.status == 503:
                assert answer.headers.get("retry-after") == "5", target.label
                unavailable.append(target.label)
        # and a valid body that reaches its INSERT (the raw requests above send none)
        with TestClient(service.app, raise_server_exceptions=False) as client:
            _unavailable(client.post("/admin/scheduled-events", headers=INGEST, json=_event()), sqlstate)
    # Every route that reads or writes the database met the condition (the API's, the console's).
    assert len(unavailable) >= 25, unavailable
    assert {"GET /admin/scheduled-events", "GET /console/events", "DELETE /admin/sessions/some-id"} <= set(unavailable)


@pytest.mark.clause("REL-20")
@pytest.mark.parametrize("sqlstate", sorted(NO_WAIT_CURES), ids=lambda s: f"{s}-{NO_WAIT_CURES[s]}")
def test_a_database_error_no_wait_can_cure_is_still_a_500(service: SchedulerService, engine: Engine,
                                                         sqlstate: str) -> None:
    """REL-20: a missing table, a privilege the role lacks, an internal error: retrying
    later changes nothing, so it is a server error, not a 503 that sends the sender round."""
    error = psycopg.errors.lookup(sqlstate)("injected")
    assert wait_out_reason(DBAPIError("SELECT 1", None, error)) is None
    with (FailingDatabase(engine, sqlstate).installed(),
          TestClient(service.app, raise_server_exceptions=False) as client):
        answer = client.get("/admin/scheduled-events", headers=ADMIN)
    assert answer.status_code == 500, answer.text
