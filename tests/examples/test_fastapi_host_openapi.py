"""EMB-11: the FastAPI host's one API document (examples/fastapi_host), in process.

``SchedulerService.include_in_fastapi(app, "/nudging", "api", "health")`` mounts the parts and
merges their OpenAPI document into the host's: its ``/openapi.json`` holds the host's routes and
the scheduler's under the mount, is a valid OpenAPI 3.1 document (checked against the
specification's own schema, as schemathesis ships it, every component a valid JSON Schema and
every reference resolving), and every scheduler operation it lists answers at its path through
the mount. The app runs as production runs it: ``SCHEDULER_ENV=production``, the host's own
authentication, no scheduler key.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.helpers import running

pytest.importorskip("fastapi", reason="FastAPI is a test dependency (the example's framework)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_host"
PATH_VALUES = {"event_id": str(uuid.UUID(int=7)), "session_id": str(uuid.UUID(int=8)), "user_id": "anna",
               "external_key": "no-such-key", "delivery_id": "9999"}
REFERENCE = re.compile(r'"\$ref":\s*"#/components/schemas/([^"]+)"')


@pytest.fixture
def host_document(monkeypatch: pytest.MonkeyPatch, database_url: str, tmp_path: Path) -> Iterator[
        tuple[TestClient, dict[str, Any], dict[str, str]]]:
    """The example host in production on this test's database, its lifespan running (the loop and
    the database's clock), with its one document and an admin token of the host's own."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    from host_service.app import create_app
    from host_service.auth import mint

    for name in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_PUBLIC_KEY", "SCHEDULER_JWKS_URL", "HOST_TOKEN_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCHEDULER_ENV", "production")
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DATABASE_URL", database_url)
    with running(create_app(), "the host's shutdown") as client:
        answer = client.get("/openapi.json")
        assert answer.status_code == 200, answer.text
        yield client, answer.json(), {"Authorization": f"Bearer {mint('ops', ['admin'])}"}


@pytest.mark.clause("EMB-11")
def test_the_hosts_one_openapi_document_holds_its_routes_and_the_schedulers_and_is_valid_openapi_3_1(
    host_document: tuple[TestClient, dict[str, Any], dict[str, str]],
) -> None:
    """EMB-11: one document: the host's paths and the mounted parts' (API and health) under
    /nudging, none of the parts not mounted; it validates against the OpenAPI 3.1 schema, each
    component schema is a valid JSON Schema and every reference names a component it holds."""
    import jsonschema_rs
    from schemathesis.specs.openapi.definitions import OPENAPI_31

    _, document, _ = host_document
    paths = set(document["paths"])
    assert {"/host/deliveries", "/host/notifications"} <= paths
    assert {"/nudging/admin/scheduled-events", "/nudging/admin/scheduled-events/{event_id}/reset",
            "/nudging/health", "/nudging/health/scheduler", "/nudging/admin/health/scheduler"} <= paths
    assert not [p for p in paths if p.startswith(("/nudging/console", "/nudging/me", "/nudging/inbox",
                                                  "/nudging/metrics", "/admin", "/health"))]
    assert document["info"]["title"] == "Host notification service"  # the host's document, not ours
    validator = jsonschema_rs.validator_for(OPENAPI_31)
    assert [error.message for error in validator.iter_errors(document)] == []
    schemas = document["components"]["schemas"]
    assert [name for name, schema in schemas.items() if not jsonschema_rs.meta.is_valid(schema)] == []
    assert sorted(set(REFERENCE.findall(json.dumps(document))) - set(schemas)) == []
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    # the check can fail: a document with a path that is not a path is refused
    assert not validator.is_valid({**document, "paths": {"nudging/health": {}}})


@pytest.mark.clause("EMB-11")
def test_every_scheduler_operation_in_the_hosts_document_answers_at_its_path(
    host_document: tuple[TestClient, dict[str, Any], dict[str, str]],
) -> None:
    """EMB-11: each scheduler operation the host's document lists is served at that path through
    the mount: never a 404 for an unknown route, a 405, or a 5xx other than health's 503 (a row
    that does not exist is the route's own 404, an empty body its 422)."""
    client, document, admin = host_document
    answered = []
    for path, operations in sorted(document["paths"].items()):
        if not path.startswith("/nudging/"):
            continue
        url = re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m.group(1)], path)
        for method in operations:
            body: dict[str, Any] = {"json": {}} if method in ("post", "put") else {}
            answer = client.request(method.upper(), url, headers=admin, **body)
            unknown_route = answer.status_code == 404 and answer.json().get("detail") == "Not Found"
            unhealthy = answer.status_code == 503 and path.endswith("/health/scheduler")
            failed = answer.status_code >= 500 and not unhealthy
            problem = answer.status_code == 405 or failed or unknown_route
            assert not problem, f"{method.upper()} {url}: {answer.status_code} {answer.text[:200]}"
            answered.append((method, path, answer.status_code))
    assert len(answered) >= 17, answered
    assert ("get", "/nudging/admin/scheduled-events", 200) in answered
    assert ("post", "/nudging/admin/scheduled-events", 422) in answered
    assert client.get("/nudging/admin/no-such-route", headers=admin).json() == {"detail": "Not Found"}
