"""SEC-1 to SEC-3: the route table in specs/routes.md against the running app."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.testclient import TestClient

from scheduler.service import SchedulerService
from tests.conftest import INGEST, PARTICIPANT
from tests.security.support import PERMISSIONS, RouteEntry, app_table, spec_table

TABLE = spec_table()
# Bearer-protected API routes; the console's cookie-protected pages are tested in tests/console.
PROTECTED = [e for e in TABLE if e.permission in {"ingest", "admin", "participant"}]
SCOPED = [e for e in TABLE if e.permission in {"ingest", "admin"}]
STREAMS = {"/me/notifications/stream"}  # never end: called here only where they must refuse
ADMIN_ROUTES = [e for e in TABLE if e.path.startswith("/admin")]


def _id(entry: RouteEntry) -> str:
    return f"{entry.method} {entry.path}"


def _call(client: TestClient, entry: RouteEntry, headers: Mapping[str, str] | None = None) -> int:
    kwargs: dict[str, object] = {"headers": headers or {}}
    if entry.method in {"POST", "PUT"}:
        kwargs["json"] = {}
    status: int = client.request(entry.method, entry.concrete_path(), **kwargs).status_code  # type: ignore[arg-type]
    return status


@pytest.mark.clause("SEC-1")
def test_the_running_app_serves_exactly_the_route_table(service: SchedulerService) -> None:
    """SEC-1: every mounted method and path is in specs/routes.md with its permission, and only those."""
    assert len(TABLE) >= 10, "the route table in specs/routes.md was not parsed"
    assert {e.permission for e in TABLE} <= set(PERMISSIONS)
    assert app_table(list(service.app.routes)) == TABLE


@pytest.mark.clause("SEC-1")
def test_a_route_added_without_require_is_caught_as_open(service: SchedulerService) -> None:
    """SEC-1: a new endpoint without ``require(...)`` appears as ``open`` and breaks the equality."""

    class Careless(SchedulerService):
        def routes(self) -> list[BaseRoute]:
            return [*super().routes(), Route("/admin/export", self.export, methods=["GET"])]

        async def export(self, request: Request) -> Response:
            return JSONResponse([])

    careless = Careless(service.settings, engine=service.engine, clock=service.clock, run_scheduler=False)
    extra = sorted(set(app_table(list(careless.app.routes))) - set(TABLE))
    assert extra == [RouteEntry("GET", "/admin/export", "open")]


@pytest.mark.clause("SEC-1")
def test_the_openapi_document_describes_every_route_but_itself(client: TestClient) -> None:
    """SEC-1: /openapi.json lists every route of the table except itself, with bearer security on /admin."""
    document = client.get("/openapi.json").json()
    described = sorted(
        (method.upper(), path) for path, operations in document["paths"].items() for method in operations
    )
    assert described == sorted(
        (e.method, e.path) for e in TABLE if e.path != "/openapi.json" and not e.path.startswith("/console")
    )
    for entry in ADMIN_ROUTES:
        assert document["paths"][entry.path][entry.method.lower()]["security"] == [{"bearer": []}]


@pytest.mark.clause("SEC-2")
@pytest.mark.parametrize("entry", PROTECTED, ids=_id)
def test_every_protected_route_without_a_token_is_401(client: TestClient, entry: RouteEntry) -> None:
    """SEC-2: no token: 401 with a JSON detail and a Bearer challenge, whatever the body."""
    kwargs: dict[str, object] = {"json": {}} if entry.method in {"POST", "PUT"} else {}
    response = client.request(entry.method, entry.concrete_path(), **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 401
    assert response.json()["detail"] == "missing bearer token"
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.clause("SEC-2")
def test_open_routes_answer_without_a_token(client: TestClient) -> None:
    """SEC-2: the open routes need no token (the scheduler health is 503 here: no loop runs)."""
    answers = {f"{e.method} {e.path}": _call(client, e) for e in TABLE if e.permission == "open"}
    assert answers == {
        "GET /health": 200, "GET /health/scheduler": 503, "GET /openapi.json": 200, "GET /metrics": 200,
        # the console's sign-in page, its form (403: no sign-in nonce), a static file that does not exist
        "GET /console/sign-in": 200, "POST /console/sign-in": 403, "GET /console/static/{name}": 404,
        "GET /inbox": 200,  # the participant's page holds no data
        "GET /inbox/service-worker.js": 200,  # the page's service worker (web push), a static script
        "POST /inbox/session": 422,  # the inbox page's sign-in: the empty body has no token
    }


@pytest.mark.clause("SEC-3")
@pytest.mark.parametrize("entry", ADMIN_ROUTES, ids=_id)
def test_a_participant_token_on_every_admin_route_is_403(client: TestClient, entry: RouteEntry) -> None:
    """SEC-3: a valid token without scopes is authenticated but has no permission: 403 naming it."""
    kwargs: dict[str, object] = {"json": {}} if entry.method in {"POST", "PUT"} else {}
    response = client.request(entry.method, entry.concrete_path(), headers=PARTICIPANT, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 403
    assert response.json()["detail"] == f"missing permission: nudging.{entry.permission} ({entry.permission})"


@pytest.mark.clause("SEC-3")
@pytest.mark.parametrize("entry", SCOPED, ids=_id)
def test_an_ingest_token_is_403_on_admin_only_routes_and_passes_on_ingest_routes(
    client: TestClient, entry: RouteEntry
) -> None:
    """SEC-3: ingest reaches the ingest routes (the empty body is then a 422, the unknown row
    of a cancel a 404) and nothing else."""
    status = _call(client, entry, INGEST)
    reached = 404 if entry.method == "DELETE" else 422
    assert status == (reached if entry.permission == "ingest" else 403)


@pytest.mark.clause("SEC-3")
@pytest.mark.parametrize("entry", [e for e in TABLE if e.permission == "participant" and e.path not in STREAMS],
                         ids=_id)
def test_a_participant_token_reaches_the_participant_routes(client: TestClient, entry: RouteEntry) -> None:
    """SEC-3: any valid token reaches the routes under /me (its own inbox); the stream's
    refusals are in tests/requirements/test_inbox.py. The empty body of a PUT of a push
    subscription is then a 422 (no endpoint, no keys)."""
    assert _call(client, entry, PARTICIPANT) == (422 if entry.method == "PUT" else 200)
