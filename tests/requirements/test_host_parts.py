"""Embedding in a host's process: the host's authentication, its token's grants, the parts it
mounts and the metrics registry it scrapes.

In our words: a host authenticates requests its own way (a Starlette ``AuthenticationBackend``
returning ``authenticated(subject, permissions)``) or keeps the built-in bearer JWTs with its
identity provider's claims and values mapped to our two permissions (PERM-9, PERM-10); it
mounts only the parts it wants (the API, health, metrics, the console, the inbox:
``SchedulerService.app_for`` / ``routes_for``, EMB-7); and our metrics go into the registry
it passes, so its own ``/metrics`` shows them (EMB-8).
"""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel
from sqlalchemy import Engine
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
)
from starlette.requests import HTTPConnection
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.web.app import PARTS, part_of
from scheduler.web.http.auth import authenticated, mint_token
from tests.conftest import ADMIN, INGEST, TEST_SECRET
from tests.helpers import event_body
from tests.operations.support import loop_step


def _host_token(**claims: object) -> dict[str, str]:
    """A token as a host's identity provider mints it: its own audience, roles instead of scopes."""
    now = int(time.time())
    body = {"sub": "host-operator", "aud": "host-api", "iat": now, "exp": now + 600, **claims}
    return {"Authorization": f"Bearer {jwt.encode(body, TEST_SECRET, algorithm='HS256')}"}


def _service(settings: Settings, engine: Engine, clock: ManualClock, **kwargs: object) -> SchedulerService:
    return SchedulerService(settings, engine=engine, clock=clock, publisher=RecordingPublisher(),
                            run_scheduler=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.clause("PERM-9")
@pytest.mark.clause("DEC-AUTH-1")
def test_a_hosts_roles_claim_grants_admin_when_the_settings_name_it(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """PERM-9: with the audience, the grant claim and the admin value set to the host's
    (``host-api``, ``roles``, ``admin``), the host's token is admin; an unmapped role grants
    nothing (403), and by default the roles claim is not read at all."""
    mapped = settings.with_(jwt_audience="host-api", jwt_scope_claims="roles",
                            jwt_admin_scopes="admin nudging.admin", jwt_ingest_scopes="sender")
    with TestClient(_service(mapped, engine, clock).app) as client:
        assert client.get("/admin/scheduled-events", headers=_host_token(roles=["admin"])).status_code == 200
        sender = _host_token(roles=["sender"])
        assert client.post("/admin/scheduled-events", headers=sender, json=event_body()).status_code == 201
        assert client.get("/admin/scheduled-events", headers=sender).status_code == 403
        assert client.get("/admin/scheduled-events", headers=_host_token(roles=["viewer"])).status_code == 403
        # a scope in the default claim is not read once the claims are the host's
        assert client.get("/admin/scheduled-events", headers=_host_token(scope="nudging.admin")).status_code == 403
    default = settings.with_(jwt_audience="host-api")
    with TestClient(_service(default, engine, clock).app) as client:
        assert client.get("/admin/scheduled-events", headers=_host_token(roles=["nudging.admin"])).status_code == 403
        assert client.get("/admin/scheduled-events", headers=_host_token(scope="nudging.admin")).status_code == 200


@pytest.mark.clause("PERM-9")
@pytest.mark.parametrize("value", ["roles  scp", "rôles", "roles\tscp", "roles\x00", "roles,scp"])
def test_a_grant_setting_that_is_not_space_separated_ascii_names_is_refused(settings: Settings, value: str) -> None:
    """PERM-9: the grant settings are space-separated printable ASCII names; anything else is a
    configuration error naming the variable, never a silently empty mapping."""
    with pytest.raises(ValueError, match="SCHEDULER_JWT_SCOPE_CLAIMS"):
        Settings.from_env({"SCHEDULER_JWT_SCOPE_CLAIMS": value})


class FakeHostBackend(AuthenticationBackend):
    """A fake of a host's own authentication: an ``X-Host-User`` header names the user, and the
    user ``ops`` is an operator (a header scheme no real host should use)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        user = conn.headers.get("x-host-user")
        if user is None:
            return None
        if user == "intruder":
            raise AuthenticationError("the host refuses this user")
        return authenticated(user, {"admin", "ingest"} if user == "ops" else set())


@pytest.mark.clause("PERM-10")
@pytest.mark.clause("DEC-AUTH-1")
def test_a_hosts_own_authentication_decides_every_route_and_names_the_actor(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """PERM-10: with the host's backend, its grants are what the routes check (admin for ``ops``,
    a participant's /me for anyone else), our bearer tokens no longer authenticate, its
    refusal is a 401, and the audit trail names the host's subject."""
    service = _service(settings, engine, clock, authentication=FakeHostBackend())
    ops, anna = {"X-Host-User": "ops"}, {"X-Host-User": "anna"}
    with TestClient(service.app) as client:
        stored = client.post("/admin/scheduled-events", headers=ops, json=event_body(user_id="anna"))
        assert stored.status_code == 201
        assert client.post(f"/admin/scheduled-events/{stored.json()['id']}/reset", headers=ops).status_code == 200
        audit = client.get("/admin/audit", headers=ops).json()
        assert audit[0]["actor"] == "ops"
        assert client.get("/admin/scheduled-events", headers=anna).status_code == 403
        assert client.get("/me/notifications", headers=anna).status_code == 200
        assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 401
        assert client.get("/admin/scheduled-events", headers={"X-Host-User": "intruder"}).status_code == 401
        assert client.get("/admin/scheduled-events").status_code == 401


class FakeHostUser(BaseUser):
    """A fake of a host's own user class: Starlette's ``BaseUser`` with a display name and no
    ``identity`` (Starlette's property then raises ``NotImplementedError``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.name


class FakeHostUserBackend(AuthenticationBackend):
    """A fake of a host's authentication that returns its own user class, admin for everyone."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        user = conn.headers.get("x-host-user")
        return None if user is None else (AuthCredentials(["authenticated", "admin", "ingest"]), FakeHostUser(user))


@pytest.mark.clause("PERM-10")
def test_a_hosts_own_user_class_without_an_identity_is_named_by_its_display_name(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """PERM-10: a host's user of its own ``BaseUser`` class that defines no ``identity`` (the
    property Starlette declares) is the actor by its display name: the action is done and the
    audit trail names it, never a 500."""
    service = _service(settings, engine, clock, authentication=FakeHostUserBackend())
    ops = {"X-Host-User": "night-ops"}
    with TestClient(service.app) as client:
        stored = client.post("/admin/scheduled-events", headers=ops, json=event_body(user_id="anna"))
        assert stored.status_code == 201
        assert client.post(f"/admin/scheduled-events/{stored.json()['id']}/reset", headers=ops).status_code == 200
        assert client.get("/admin/audit", headers=ops).json()[0]["actor"] == "night-ops"


@pytest.mark.clause("PERM-10")
def test_authenticated_refuses_a_permission_this_service_does_not_have() -> None:
    """PERM-10: ``authenticated`` takes only ``admin`` and ``ingest``: a host's typo is an error
    at once, not a permission that silently grants nothing."""
    with pytest.raises(ValueError, match="unknown permission"):
        authenticated("ops", {"administrator"})


@pytest.mark.clause("PERM-11")
def test_production_with_the_hosts_own_authentication_needs_no_scheduler_key_and_signs_no_token_in(
    engine: Engine, clock: ManualClock, tmp_path: Path
) -> None:
    """PERM-11: in production the host's backend is a way to verify requests: the service starts
    without SCHEDULER_JWT_SECRET, _PUBLIC_KEY or _JWKS_URL and the host's grants decide; the
    built-in verifier then has no key, so the inbox page's sign-in refuses a token signed with the
    development secret ``serve`` once generated into the data directory; a secret that is set is
    still judged (a development-grade one refused), and without the host's backend production
    still refuses to start."""
    production = Settings(environment="production", jwt_secret=None, data_dir=tmp_path)
    production.secret_file.write_text(TEST_SECRET)  # a development secret left behind
    service = _service(production, engine, clock, authentication=FakeHostBackend())
    with TestClient(service.app) as client:
        ops = {"X-Host-User": "ops"}
        assert client.post("/admin/scheduled-events", headers=ops, json=event_body()).status_code == 201
        assert client.get("/admin/scheduled-events", headers=ops).status_code == 200
        assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 401
        signed_with_the_file = mint_token(TEST_SECRET, scope=None, subject="anna")
        assert client.post("/inbox/session", json={"token": signed_with_the_file}).status_code == 401
    assert not service.verifier.configured
    with pytest.raises(ConfigError, match="development-grade SCHEDULER_JWT_SECRET"):
        _service(production.with_(jwt_secret="dev-secret"), engine, clock, authentication=FakeHostBackend())
    with pytest.raises(ConfigError, match=r"or the host's own authentication \(SchedulerService\(authentication="):
        _service(production, engine, clock)


@pytest.mark.clause("PERM-11")
def test_authenticated_is_exported_from_scheduler_itself() -> None:
    """PERM-11: the function a host's backend returns is public: ``scheduler.authenticated``, the
    same object the service's own bearer backend uses."""
    import scheduler
    from scheduler.web.http import auth

    assert scheduler.authenticated is auth.authenticated
    credentials, user = scheduler.authenticated("ops", ["admin", "ingest"])
    assert credentials.scopes == ["authenticated", "admin", "ingest"] and user.display_name == "ops"


@pytest.mark.clause("EMB-7")
def test_the_api_alone_serves_no_console_inbox_metrics_or_health(service: SchedulerService) -> None:
    """EMB-7: ``app_for("api")`` answers the JSON API and nothing of the other parts (404);
    every route of ``service.app`` belongs to exactly one part."""
    with TestClient(service.app_for("api")) as client:
        assert client.post("/admin/scheduled-events", headers=INGEST, json=event_body()).status_code == 201
        assert client.get("/admin/scheduled-events", headers=ADMIN).status_code == 200
        for path in ("/console", "/inbox", "/me/notifications", "/metrics", "/health", "/health/scheduler",
                     "/admin/health/scheduler"):
            assert client.get(path, headers=ADMIN).status_code == 404, path
    assert {part_of(route) for route in service.app.routes} == set(PARTS)
    assert sum(len(service.routes_for(p)) for p in PARTS) == len(service.app.routes)


@pytest.mark.clause("EMB-7")
def test_health_and_metrics_alone_serve_only_themselves(service: SchedulerService) -> None:
    """EMB-7: ``app_for("health", "metrics")`` answers those and refuses the API (404)."""
    with TestClient(service.app_for("health", "metrics")) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.post("/admin/scheduled-events", headers=INGEST, json=event_body()).status_code == 404


@pytest.mark.clause("EMB-7")
def test_an_unknown_part_is_an_error_naming_the_parts(service: SchedulerService) -> None:
    """EMB-7: a misspelt part is a ``ValueError`` that lists the real ones."""
    with pytest.raises(ValueError, match="api, health, metrics, console, inbox"):
        service.app_for("apis")


@pytest.mark.clause("EMB-8")
def test_metrics_go_into_the_registry_the_host_passes(
    settings: Settings, engine: Engine, clock: ManualClock
) -> None:
    """EMB-8: with the host's registry, a poll's counters appear in the host's own scrape of
    it, and the service's /metrics serves the same registry."""
    registry = CollectorRegistry()
    service = _service(settings, engine, clock, metrics_registry=registry)
    with TestClient(service.app) as client:
        loop_step(service)
        scraped = generate_latest(registry).decode()
        assert "scheduler_polls_total 1.0" in scraped
        assert "scheduler_polls_total 1.0" in client.get("/metrics").text


class ErrorOut(BaseModel):
    """A host's model named like one of the scheduler's, and unlike it."""

    code: int


@pytest.mark.clause("EMB-11")
def test_include_in_fastapi_merges_the_parts_document_and_refuses_a_clash_by_name(service: SchedulerService) -> None:
    """EMB-11: ``include_in_fastapi`` mounts the parts and puts their paths, under the mount, into
    the host's document (one built before the call is rebuilt), sharing a component schema that
    is the same; a path or component the host defines otherwise is a ``ValueError`` naming it,
    and a mount path not of the form ``/name`` is refused at once."""
    pytest.importorskip("fastapi", reason="FastAPI is a test dependency (the example's framework)")
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/host/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    assert "/host/ping" in app.openapi()["paths"]  # built (and cached) before the mount
    service.include_in_fastapi(app, "/nudging", "health")
    with TestClient(app) as client:
        document = client.get("/openapi.json").json()
        assert client.get("/nudging/health").status_code == 200
    assert set(document["paths"]) == {"/host/ping", "/nudging/health", "/nudging/health/scheduler",
                                      "/nudging/admin/health/scheduler"}
    assert document["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer",
                                                                    "bearerFormat": "JWT"}}

    clashing = FastAPI()

    @clashing.get("/nudging/health")
    def own_health() -> dict[str, str]:
        return {"ok": "host"}

    service.include_in_fastapi(clashing, "/nudging", "health")
    with pytest.raises(ValueError, match="already has the path /nudging/health"):
        clashing.openapi()

    named_alike = FastAPI()

    @named_alike.get("/host/error", response_model=ErrorOut)
    def error() -> dict[str, int]:
        return {"code": 1}

    service.include_in_fastapi(named_alike, "/nudging", "api")
    with pytest.raises(ValueError, match=r"components.schemas.ErrorOut otherwise than the scheduler's"):
        named_alike.openapi()
    for path in ("nudging", "/nudging/", ""):
        with pytest.raises(ValueError, match="mount path"):
            service.include_in_fastapi(FastAPI(), path, "api")
