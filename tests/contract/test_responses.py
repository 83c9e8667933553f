"""CONTRACT-1 to CONTRACT-6: one contract for every response, and the domain speaks the domain.

The schemathesis run (SEC-17) checks every answer against /openapi.json over generated
requests; these tests pin the cases it found drifting and the rules that keep them fixed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from scheduler.cli import build_parser
from scheduler.service import SchedulerService
from scheduler.types import DispatchOutcome, EventStatus, NotificationStatus
from scheduler.web.api.intake import LIVE_STATUS
from scheduler.web.api.openapi import openapi_document
from tests.conftest import ADMIN, INGEST
from tests.contract.api_doc import declared
from tests.helpers import event_body, reminder_facts

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"
HTTP_STATUSES = {200, 201, 202, 204, 400, 401, 403, 404, 409, 413, 422, 500, 503}
DOMAIN_MODULES = ("nudging/rules.py", "nudging/decision.py", "nudging/orchestrator.py", "core/loop.py", "types.py",
                  "database/events.py")


def _schema(service: SchedulerService, name: str) -> dict[str, Any]:
    schema: dict[str, Any] = openapi_document(service.app.routes)["components"]["schemas"][name]
    return schema


@pytest.mark.clause("CONTRACT-1")
def test_a_live_events_notifications_carry_every_field_the_schema_requires(
    client: TestClient, service: SchedulerService
) -> None:
    """CONTRACT-1: the live path's notifications have every required NotificationOut field
    (``created_at`` was missing), and no field the schema does not know."""
    answer = client.post("/admin/ingest-event", headers=INGEST,
                         json={"event_type": "reminder", "user_id": "u1", "facts": reminder_facts()})
    assert answer.status_code == 200, answer.text
    schema = _schema(service, "NotificationOut")
    (notification,) = answer.json()["notifications"]
    assert sorted(notification) == sorted(schema["properties"])
    assert set(schema["required"]) <= set(notification)
    listed = client.get("/admin/notifications", headers=ADMIN).json()
    assert listed == [notification]  # the same row, the same form, whichever route shows it


@pytest.mark.clause("CONTRACT-2")
def test_the_published_schema_requires_facts_as_the_server_does(
    client: TestClient, service: SchedulerService
) -> None:
    """CONTRACT-2: /openapi.json says facts is required (an object with facts_version and
    scenario), and the server indeed answers REQ-0063's 422 without it."""
    for name in ("ScheduledEventIn", "LiveEventIn"):
        schema = _schema(service, name)
        assert "facts" in schema["required"], name
        assert schema["properties"]["facts"]["required"] == ["facts_version", "scenario"]
    body = event_body()
    del body["facts"]
    answer = client.post("/admin/scheduled-events", headers=INGEST, json=body)
    assert (answer.status_code, answer.json()) == (422, {"detail": "Missing facts in scheduled event"})


@pytest.mark.clause("CONTRACT-3")
@pytest.mark.parametrize(
    ("method", "path", "payload", "field"),
    [
        ("POST", "/admin/scheduled-events", {**event_body(), "trigger_at": "2026-11-30T09:00:00"}, "trigger_at"),
        ("POST", "/admin/scheduled-events", {**event_body(), "surprise": 1}, "surprise"),
        ("POST", "/admin/scheduled-events", ["not", "an", "object"], "body"),
        ("PUT", "/admin/participants/p1/preferences", {"max_per_day": -1}, "max_per_day"),
        ("GET", "/admin/scheduled-events?limit=0", None, "limit"),
        ("GET", "/admin/scheduled-events?status=lost", None, "status"),
        ("GET", "/admin/notifications?status=pending", None, "status"),
        ("GET", "/admin/scheduled-events?user_id=" + "x" * 201, None, "user_id"),
    ],
    ids=["naive-time", "unknown-field", "not-an-object", "negative-cap", "limit", "event-status",
         "notification-status", "long-user-id"],
)
def test_every_other_422_names_its_fields_in_one_shape(
    client: TestClient, method: str, path: str, payload: Any, field: str
) -> None:
    """CONTRACT-3: besides REQ-0063's two shapes, a 422 is ``{"detail": message, "errors":
    [{"field": path, "message": ...}]}`` and names the offending field."""
    answer = client.request(method, path, headers=ADMIN, json=payload)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert sorted(body) == ["detail", "errors"]
    assert isinstance(body["detail"], str) and field in body["detail"]
    assert [e["field"] for e in body["errors"]] == [field]
    assert all(sorted(e) == ["field", "message"] for e in body["errors"])


def documented_answers() -> set[tuple[str, str, str]]:
    """(route, status, body) of each row of docs/api.md's per-route table."""
    rows = re.findall(r"^\| `((?:GET|POST|PUT|PATCH|DELETE) \S+)` \| (\d{3}) \| ([^|]+) \|", API_DOC.read_text(), re.M)
    return {(route, status, body.strip()) for route, status, body in rows}


def declared_answers(service: SchedulerService) -> set[tuple[str, str, str]]:
    """(route, status, body model) of every answer /openapi.json declares."""
    return {(route, status, body) for route, status, body, _ in declared(openapi_document(service.app.routes))}


@pytest.mark.clause("CONTRACT-4")
def test_docs_list_exactly_the_answers_the_openapi_document_declares(service: SchedulerService) -> None:
    """CONTRACT-4: docs/api.md lists every (route, status, body model) /openapi.json declares,
    and no other."""
    in_schema, documented = declared_answers(service), documented_answers()
    assert sorted(in_schema - documented) == [], "run python -m tests.contract.api_doc to add them to docs/api.md"
    assert sorted(documented - in_schema) == [], "docs/api.md lists answers the API does not declare"


@pytest.mark.clause("CONTRACT-5")
def test_under_a_mount_the_openapi_document_names_the_prefix_in_servers(service: SchedulerService) -> None:
    """CONTRACT-5: mounted at /nudging, /nudging/openapi.json says ``servers: [{url: /nudging}]``
    and a client joining that URL with a documented path reaches the route."""
    host = Starlette(routes=[Mount("/nudging", app=service.app)])
    with TestClient(host) as client:
        document = client.get("/nudging/openapi.json").json()
        assert document["servers"] == [{"url": "/nudging"}]
        server = document["servers"][0]["url"]
        assert "/health" in document["paths"]
        assert client.get(server + "/health").json() == {"status": "ok"}
        assert client.get(server + "/admin/scheduled-events", headers=ADMIN).status_code == 200
    with TestClient(service.app) as alone:
        assert "servers" not in alone.get("/openapi.json").json()


@pytest.mark.clause("CONTRACT-6")
def test_only_app_py_maps_outcomes_to_http_statuses() -> None:
    """CONTRACT-6: every dispatch outcome has its live HTTP status in app.py, and the domain
    modules (rule engine, dispatch, orchestrator, loop) hold no HTTP status code."""
    assert set(LIVE_STATUS) == set(DispatchOutcome)
    assert {o for o in DispatchOutcome if o.refused} == {
        o for o, status in LIVE_STATUS.items() if status in (400, 422)}
    offenders = []
    for name in DOMAIN_MODULES:
        tree = ast.parse((ROOT / "src" / "scheduler" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in HTTP_STATUSES:
                offenders.append(f"{name}:{node.lineno}: {node.value}")
    assert offenders == []


@pytest.mark.clause("CONTRACT-6")
def test_each_status_word_comes_from_its_enum_everywhere_it_is_offered(service: SchedulerService) -> None:
    """CONTRACT-6: the statuses the schema, the status filters and the CLI offer are exactly
    the enums' members, so adding a member (``cancelled``) reaches all of them."""
    assert _schema(service, "ScheduledEventOut")["properties"]["status"]["$ref"].endswith("EventStatus")
    schemas = openapi_document(service.app.routes)["components"]["schemas"]
    assert schemas["EventStatus"]["enum"] == [str(s) for s in EventStatus]
    assert schemas["NotificationStatus"]["enum"] == [str(s) for s in NotificationStatus]
    parameters = {
        path: {p["name"]: p["schema"] for p in op.get("parameters", [])}
        for path, ops in openapi_document(service.app.routes)["paths"].items() for op in [ops.get("get", {})]
    }
    assert parameters["/admin/scheduled-events"]["status"]["enum"] == [str(s) for s in EventStatus]
    assert parameters["/admin/notifications"]["status"]["enum"] == [str(s) for s in NotificationStatus]
    for status in EventStatus:
        assert build_parser().parse_args(["events", "list", "--status", str(status)]).status == status
    with pytest.raises(SystemExit):
        build_parser().parse_args(["events", "list", "--status", "lost"])
