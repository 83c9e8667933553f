"""HOST-2: production with the host's own authentication, and one API document."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from host_service.app import create_app


@pytest.mark.clause("HOST-2")
def test_one_document_lists_the_hosts_routes_and_the_schedulers_in_production(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HOST-2: built with SCHEDULER_ENV=production, no SCHEDULER_JWT_* key and an async engine,
    the app serves one /openapi.json with the host's routes and the scheduler's under /nudging,
    whose ``facts`` is the host's contract (no database is needed to build it: nothing
    connects before the lifespan starts)."""
    for name in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_PUBLIC_KEY", "SCHEDULER_JWKS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCHEDULER_ENV", "production")
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://host@127.0.0.1:9/nowhere")
    document = TestClient(create_app()).get("/openapi.json").json()
    paths = document["paths"]
    assert {"/host/deliveries", "/host/notifications", "/host/commitments"} <= set(paths)
    assert {"/nudging/admin/scheduled-events", "/nudging/health/scheduler"} <= set(paths)
    assert not any(path.startswith("/nudging/console") for path in paths)
    # the scheduler's bodies carry the host's facts, and the document says so (its contract)
    schemas = document["components"]["schemas"]
    assert schemas["ScheduledEventIn"]["properties"]["facts"]["$ref"] == "#/components/schemas/ReminderFacts"
    assert schemas["ReminderFacts"]["required"] == ["commitment"]
