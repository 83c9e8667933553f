"""Permissions: who may call what.

In our words: callers present a bearer JWT (HS256 with the configured secret, or RS256
against a configured public key or JWKS), for the configured audience (``svc-nudging``).
The ``scope`` claim (a space-separated string or a list) grants permissions:
``nudging.ingest`` grants ingest; ``nudging.admin`` grants admin and ingest; anything else
is a participant and gets 403 naming the missing permission. A missing, expired, wrongly
signed or wrong-audience token is a 401 with ``WWW-Authenticate: Bearer``. Health and the
OpenAPI document are open.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, PARTICIPANT, TEST_SECRET, bearer
from tests.helpers import event_body, reminder_facts

INGEST_ROUTES = [("POST", "/admin/scheduled-events"), ("POST", "/admin/ingest-event")]
ADMIN_ROUTES = [
    ("GET", "/admin/scheduled-events"),
    ("GET", "/admin/scheduled-events/some-id"),
    ("POST", "/admin/scheduled-events/some-id/reset"),
    ("GET", "/admin/notifications"),
    ("PUT", "/admin/participants/p1/preferences"),
]
OPEN_ROUTES = [("GET", "/health"), ("GET", "/openapi.json")]


def call(client: TestClient, method: str, path: str, headers: Mapping[str, str] | None = None) -> int:
    body: dict[str, object] | None = None
    if path == "/admin/scheduled-events" and method == "POST":
        body = event_body()
    elif path == "/admin/ingest-event":
        body = {"event_type": "t", "user_id": "p1", "facts": reminder_facts()}
    elif method == "PUT":
        body = {"max_per_day": 3}
    return int(client.request(method, path, headers=headers or {}, json=body).status_code)


@pytest.mark.clause("PERM-1")
@pytest.mark.parametrize(("method", "path"), INGEST_ROUTES + ADMIN_ROUTES)
def test_every_protected_route_without_a_token_is_a_401_with_a_bearer_challenge(
    client: TestClient, method: str, path: str
) -> None:
    """PERM-1: no token: 401 and WWW-Authenticate: Bearer."""
    response = client.request(method, path)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["detail"]


@pytest.mark.clause("PERM-2")
@pytest.mark.parametrize(
    "headers",
    [
        bearer("nudging.admin", secret="a-different-secret-0123456789abcdef"),
        bearer("nudging.admin", ttl_seconds=-60),
        bearer("nudging.admin", audience="someone-else"),
        {"Authorization": "Bearer not.a.jwt"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ],
    ids=["wrong-signature", "expired", "wrong-audience", "garbage", "not-bearer"],
)
def test_a_bad_token_is_a_401_on_every_protected_route(client: TestClient, headers: dict[str, str]) -> None:
    """PERM-2: wrongly signed, expired, wrong-audience or malformed: 401 everywhere, never 403."""
    for method, path in INGEST_ROUTES + ADMIN_ROUTES:
        assert call(client, method, path, headers) == 401, (method, path)


@pytest.mark.clause("PERM-3")
def test_the_ingest_scope_may_ingest_but_not_administer(client: TestClient) -> None:
    """PERM-3: nudging.ingest: both ingest routes work; every admin route is 403 naming nudging.admin."""
    assert call(client, *INGEST_ROUTES[0], INGEST) == 201
    assert call(client, *INGEST_ROUTES[1], INGEST) == 200
    for method, path in ADMIN_ROUTES:
        response = client.request(method, path, headers=INGEST, json={"max_per_day": 3} if method == "PUT" else None)
        assert response.status_code == 403, (method, path)
        assert "nudging.admin" in response.json()["detail"]


@pytest.mark.clause("PERM-4")
def test_the_admin_scope_grants_admin_and_ingest(client: TestClient) -> None:
    """PERM-4: nudging.admin may call every route."""
    assert call(client, *INGEST_ROUTES[0], ADMIN) == 201
    assert call(client, *INGEST_ROUTES[1], ADMIN) == 200
    answers = {path: call(client, method, path, ADMIN) for method, path in ADMIN_ROUTES}
    assert answers == {
        "/admin/scheduled-events": 200,
        "/admin/scheduled-events/some-id": 404,  # allowed in, and there is no such row
        "/admin/scheduled-events/some-id/reset": 404,
        "/admin/notifications": 200,
        "/admin/participants/p1/preferences": 200,
    }


@pytest.mark.clause("PERM-5")
@pytest.mark.parametrize(("method", "path"), INGEST_ROUTES + ADMIN_ROUTES)
def test_a_participant_token_is_a_403_naming_the_missing_permission(
    client: TestClient, engine: Engine, method: str, path: str
) -> None:
    """PERM-5: a valid token without the scope: 403 whose detail names the permission."""
    response = client.request(method, path, headers=PARTICIPANT, json={})
    assert response.status_code == 403
    needed = "nudging.ingest" if (method, path) in INGEST_ROUTES else "nudging.admin"
    assert needed in response.json()["detail"]


@pytest.mark.clause("PERM-6")
def test_scopes_may_be_a_space_separated_string_or_a_list(client: TestClient) -> None:
    """PERM-6: "openid nudging.admin" and ["openid", "nudging.admin"] both grant admin."""
    as_string = bearer("openid nudging.admin")
    claims = {"sub": "svc", "aud": "svc-nudging", "exp": int(time.time()) + 60, "scope": ["openid", "nudging.admin"]}
    as_list = {"Authorization": "Bearer " + jwt.encode(claims, TEST_SECRET, algorithm="HS256")}
    assert call(client, "GET", "/admin/notifications", as_string) == 200
    assert call(client, "GET", "/admin/notifications", as_list) == 200


@pytest.mark.clause("PERM-7")
@pytest.mark.parametrize(("method", "path"), OPEN_ROUTES)
def test_health_and_the_openapi_document_are_open(client: TestClient, method: str, path: str) -> None:
    """PERM-7: no token needed for liveness and the API description."""
    assert call(client, method, path) == 200


@pytest.mark.clause("PERM-7")
def test_the_openapi_document_describes_every_route_with_its_bodies(client: TestClient) -> None:
    """PERM-7: the document is derived from the same models that validate the bodies."""
    document = client.get("/openapi.json").json()
    assert set(document["paths"]) >= {
        "/admin/scheduled-events", "/admin/scheduled-events/{event_id}", "/admin/scheduled-events/{event_id}/reset",
        "/admin/ingest-event", "/admin/notifications", "/health", "/health/scheduler",
    }
    schema = document["components"]["schemas"]["ScheduledEventIn"]
    assert {"event_type", "user_id", "trigger_at", "facts", "external_key"} <= set(schema["properties"])


@pytest.mark.clause("PERM-8")
def test_rs256_tokens_verify_against_a_configured_public_key(
    engine: Engine, clock: ManualClock
) -> None:
    """PERM-8: with a public key configured, RS256 tokens are accepted and HS256 ones (any secret) refused."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    settings = Settings(jwt_public_key=public_pem)
    service = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    claims = {"sub": "svc", "aud": "svc-nudging", "exp": int(time.time()) + 60, "scope": "nudging.admin"}
    good = jwt.encode(claims, private, algorithm="RS256")
    hs256 = jwt.encode(claims, "x" * 32, algorithm="HS256")
    with TestClient(service.app) as client:
        assert client.get("/admin/notifications", headers={"Authorization": f"Bearer {good}"}).status_code == 200
        assert client.get("/admin/notifications", headers={"Authorization": f"Bearer {hs256}"}).status_code == 401
