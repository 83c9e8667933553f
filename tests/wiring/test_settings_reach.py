"""WIRE-1: every setting read from the environment reaches the thing it configures.

Each field of ``Settings`` has a check here that builds the service the way production
does (``Settings.from_env`` of an environment, the service making its own engines) and
proves the setting changed behaviour where it matters: the loop, the engines, the token
verifier, the catalogue, the body limit. A new setting without a check fails
``test_every_setting_has_a_wiring_check``: add its check to ``CHECKS``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from sqlalchemy import Connection, Engine, make_url, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core import store
from scheduler.core.clock import DatabaseClock
from scheduler.database.database import Database
from scheduler.database.engine import polling
from tests.conftest import T0, TEST_SECRET, token
from tests.helpers import reminder_facts
from tests.operations.support import sign_in
from tests.security.support import auth, claims, hs256, other_rsa_private_key, public_pem, rs256
from tests.wiring.delivery_reach import DELIVERY_CHECKS
from tests.wiring.support import jwks_endpoint, service_from_env

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclasses.dataclass
class Env:
    """What a check gets: the test's database and scratch directory, and the base environment."""

    database_url: str
    engine: Engine
    tmp_path: Path

    def base(self, **extra: str) -> dict[str, str]:
        env = {"DATABASE_URL": self.database_url, "SCHEDULER_JWT_SECRET": TEST_SECRET,
               "SCHEDULER_DATA_DIR": str(self.tmp_path / "data")}
        env.update(extra)
        return {k: v for k, v in env.items() if v != ""}


def _admin_list(client: TestClient, headers: dict[str, str]) -> int:
    status: int = client.get("/admin/scheduled-events", headers=headers).status_code
    return status


def _due(engine: Engine, count: int) -> None:
    sessions = Database(engine)
    for i in range(count):
        store.store_event(sessions, event_type="reminder", user_id=f"user-{i}", community_id=None,
                          external_key=None, trigger_at=T0 - timedelta(minutes=count - i),
                          facts=reminder_facts(), now=T0)


def check_database_url(env: Env) -> None:
    with service_from_env(env.base()) as service, TestClient(service.app) as client:
        assert make_url(str(service.engine.url)).database == make_url(env.database_url).database
        assert service.loop_engine.url.database == service.engine.url.database
        client.post("/admin/scheduled-events", headers=auth(token("nudging.ingest")), json={
            "event_type": "reminder", "user_id": "wired", "trigger_at": T0.isoformat(), "facts": reminder_facts()})
    with env.engine.connect() as conn:
        assert conn.execute(text("SELECT user_id FROM scheduled_events")).scalars().all() == ["wired"]


def check_database_schema(env: Env) -> None:
    """The service's statements name SCHEDULER_DATABASE_SCHEMA: a row stored lands there, and
    the default schema's table stays empty."""
    from scheduler.database.engine import migrate

    result = migrate(env.engine, schema="elsewhere")
    assert (result.schema, result.before) == ("elsewhere", None)
    # the loop is off: the check polls itself (a running loop could take the row first)
    with service_from_env(env.base(SCHEDULER_DATABASE_SCHEMA="elsewhere", SCHEDULER_ENABLED="false")) as service, \
            TestClient(service.app) as client:
        assert client.post("/admin/scheduled-events", headers=auth(token("nudging.ingest")), json={
            "event_type": "reminder", "user_id": "elsewhere", "trigger_at": T0.isoformat(),
            "facts": reminder_facts()}).status_code == 201
        assert service.scheduler.poll_once().dispatched == 1
    with env.engine.connect() as conn:
        assert conn.execute(text("SELECT user_id, status FROM elsewhere.scheduled_events")).all() == [
            ("elsewhere", "dispatched")]
        assert conn.execute(text("SELECT count(*) FROM elsewhere.scheduled_event_history")).scalar_one() == 2
        assert conn.execute(text("SELECT count(*) FROM scheduler.scheduled_events")).scalar_one() == 0


def check_data_dir(env: Env) -> None:
    data = env.tmp_path / "elsewhere"
    data.mkdir()
    (data / "jwt-secret").write_text("a-secret-generated-by-serve-into-the-data-directory")
    with service_from_env(env.base(SCHEDULER_JWT_SECRET="", SCHEDULER_DATA_DIR=str(data))) as service, \
            TestClient(service.app) as client:
        minted = token("nudging.admin", secret="a-secret-generated-by-serve-into-the-data-directory")
        assert _admin_list(client, auth(minted)) == 200


def check_poll_seconds(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_POLL_SECONDS="7.5")) as service, TestClient(service.app) as client:
        assert service.scheduler.poll_seconds == 7.5
        assert client.get("/health/scheduler").json()["poll_seconds"] == 7.5


def check_batch_size(env: Env) -> None:
    _due(env.engine, 3)
    with service_from_env(env.base(SCHEDULER_BATCH_SIZE="2")) as service:
        assert service.scheduler.poll_once().claimed == 2


def check_mode(env: Env) -> None:
    for value in ("literal", "prompt"):
        with service_from_env(env.base(SCHEDULER_MODE=value, SCHEDULER_POLL_SECONDS="3600")) as service, \
                TestClient(service.app) as client:
            assert str(service.scheduler.mode) == value
            assert client.get("/health/scheduler").json()["mode"] == value
            # prompt mode's wake-ups need the LISTEN connection; literal opens none
            assert service.listener.running is (value == "prompt")


def check_listen(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_MODE="prompt", SCHEDULER_LISTEN="false",
                                   SCHEDULER_POLL_SECONDS="3600")) as service, TestClient(service.app) as client:
        assert not service.listener.running
        assert client.get("/health/scheduler").json()["wakeups"]["by"] == "timer"


def check_scheduler_enabled(env: Env) -> None:
    for value, alive in (("false", False), ("true", True)):
        with service_from_env(env.base(SCHEDULER_ENABLED=value, SCHEDULER_POLL_SECONDS="3600")) as service, \
                TestClient(service.app):
            assert service.loop_alive is alive, value


def check_jwt_secret(env: Env) -> None:
    secret = "another-secret-for-the-wiring-test-0123456789"
    with service_from_env(env.base(SCHEDULER_JWT_SECRET=secret)) as service, TestClient(service.app) as client:
        assert _admin_list(client, auth(token("nudging.admin", secret=secret))) == 200
        assert _admin_list(client, auth(token("nudging.admin"))) == 401


def check_jwt_public_key(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_JWT_SECRET="", SCHEDULER_JWT_PUBLIC_KEY=public_pem())) as service, \
            TestClient(service.app) as client:
        assert _admin_list(client, auth(rs256(claims()))) == 200
        assert _admin_list(client, auth(rs256(claims(), other_rsa_private_key()))) == 401


def check_jwks_url(env: Env) -> None:
    with jwks_endpoint(other_rsa_private_key()) as jwks, \
            service_from_env(env.base(SCHEDULER_JWT_SECRET="", SCHEDULER_JWKS_URL=jwks.url)) as service, \
            TestClient(service.app) as client:
        assert _admin_list(client, auth(jwks.token(claims()))) == 200
        assert jwks.fetches, "the JWKS endpoint was never asked"
        assert _admin_list(client, auth(rs256(claims()))) == 401


def check_jwt_audience(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_JWT_AUDIENCE="svc-elsewhere")) as service, \
            TestClient(service.app) as client:
        assert _admin_list(client, auth(hs256(claims(aud="svc-elsewhere")))) == 200
        assert _admin_list(client, auth(hs256(claims()))) == 401


def check_jwt_scope_claims(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_JWT_SCOPE_CLAIMS="roles")) as service, \
            TestClient(service.app) as client:
        assert _admin_list(client, auth(hs256(claims(scope=None, roles=["nudging.admin"])))) == 200
        assert _admin_list(client, auth(hs256(claims()))) == 403


def check_jwt_admin_scopes(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_JWT_ADMIN_SCOPES="operator")) as service, \
            TestClient(service.app) as client:
        assert _admin_list(client, auth(hs256(claims(scope="operator")))) == 200
        assert _admin_list(client, auth(hs256(claims()))) == 403


def check_jwt_ingest_scopes(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_JWT_INGEST_SCOPES="sender")) as service, \
            TestClient(service.app) as client:
        sender = auth(hs256(claims(scope="sender")))
        assert client.post("/admin/scheduled-events", headers=sender, json={}).status_code == 422  # past auth
        assert client.post("/admin/scheduled-events", headers=auth(hs256(claims(scope="nudging.ingest"))),
                           json={}).status_code == 403


def check_jwt_issuer(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_JWT_ISSUER="https://issuer.example")) as service, \
            TestClient(service.app) as client:
        assert _admin_list(client, auth(hs256(claims(iss="https://issuer.example")))) == 200
        assert _admin_list(client, auth(hs256(claims()))) == 401


def check_jwt_leeway_seconds(env: Env) -> None:
    # a token that expired 30 s ago: within the default 60 s leeway, outside a 10 s one
    stale = hs256(claims(exp=claims()["iat"] - 30))
    with service_from_env(env.base()) as service, TestClient(service.app) as client:
        assert service.verifier.leeway_seconds == 60
        assert _admin_list(client, auth(stale)) == 200
    with service_from_env(env.base(SCHEDULER_JWT_LEEWAY_SECONDS="10")) as service, TestClient(service.app) as client:
        assert _admin_list(client, auth(stale)) == 401


def check_rules_dir(env: Env) -> None:
    rules = env.tmp_path / "rules"
    rules.mkdir()
    (rules / "wired.json").write_text(json.dumps({
        "id": "wired-rule", "scenarios": ["wired"], "frequency": "daily", "kind": "reminder",
        "title": "wired {{ scope }}", "body": "from SCHEDULER_RULES_DIR"}))
    with service_from_env(env.base(SCHEDULER_RULES_DIR=str(rules))) as service, TestClient(service.app) as client:
        assert [r.id for r in service.catalogue.rules] == ["wired-rule"]
        answer = client.post("/admin/ingest-event", headers=auth(token("nudging.ingest")), json={
            "event_type": "wired", "user_id": "u1",
            "facts": {"facts_version": "1", "scenario": "wired", "date": "2026-11-30"}})
        assert answer.status_code == 200, answer.text
        assert answer.json()["notifications"][0]["rule_id"] == "wired-rule"


def check_max_body_bytes(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_MAX_BODY_BYTES="2048")) as service, TestClient(service.app) as client:
        def post(padding: int) -> int:
            facts = reminder_facts(padding="x" * padding)
            status: int = client.post("/admin/scheduled-events", headers=auth(token("nudging.ingest")), json={
                "event_type": "reminder", "user_id": "u1", "trigger_at": T0.isoformat(), "facts": facts}).status_code
            return status

        assert post(3000) == 413
        assert post(1000) == 201


def _what_serve_answers(settings: Settings, request: bytes) -> bytes:
    """What uvicorn, given ``scheduler serve``'s options for ``settings``, answers to ``request``
    sent and then left unfinished: everything until it closes the connection."""
    import socket
    import threading

    import uvicorn

    from scheduler.cli.http_timeouts import uvicorn_options

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            while (await receive()).get("more_body"):
                pass
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                                           **uvicorn_options(settings)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        from tests.servers import wait_for

        wait_for(lambda: server.started or not thread.is_alive(), what="uvicorn to start")
        port = server.servers[0].sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(request)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        return received
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def check_request_header_timeout_seconds(env: Env) -> None:
    settings = Settings.from_env(env.base(SCHEDULER_REQUEST_HEADER_TIMEOUT_SECONDS="0.25"))
    answer = _what_serve_answers(settings, b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"headers did not arrive within 0.25 s"), answer


def check_request_body_timeout_seconds(env: Env) -> None:
    settings = Settings.from_env(env.base(SCHEDULER_REQUEST_BODY_TIMEOUT_SECONDS="0.25"))
    answer = _what_serve_answers(
        settings, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
    assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"body did not arrive within 0.25 s"), answer


def _batch_body(count: int, padding: int = 0) -> list[dict[str, Any]]:
    return [{"event_type": "reminder", "user_id": f"u{i}", "trigger_at": T0.isoformat(),
             "facts": reminder_facts(padding="x" * padding)} for i in range(count)]


def check_bulk_max_events(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_BULK_MAX_EVENTS="2")) as service, TestClient(service.app) as client:
        def post(count: int) -> int:
            status: int = client.post("/admin/scheduled-events/bulk", headers=auth(token("nudging.ingest")),
                                      json=_batch_body(count)).status_code
            return status

        assert post(3) == 413
        assert post(2) == 200


def check_bulk_max_body_bytes(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_BULK_MAX_BODY_BYTES="4096")) as service, \
            TestClient(service.app) as client:
        def post(padding: int) -> int:
            status: int = client.post("/admin/scheduled-events/bulk", headers=auth(token("nudging.ingest")),
                                      json=_batch_body(2, padding)).status_code
            return status

        assert post(3000) == 413
        assert post(1000) == 200


def check_default_expiry_seconds(env: Env) -> None:
    for value, expected in (("5400", T0 + timedelta(minutes=90)), ("", None)):
        with service_from_env(env.base(SCHEDULER_DEFAULT_EXPIRY_SECONDS=value)) as service, \
                TestClient(service.app) as client:
            response = client.post("/admin/scheduled-events", headers=auth(token("nudging.ingest")), json={
                "event_type": "reminder", "user_id": "u1", "trigger_at": T0.isoformat(), "facts": reminder_facts()})
            assert response.status_code == 201, response.text
            assert response.json()["expires_at"] == (expected.isoformat() if expected else None), value


def _shown(engine: Engine, name: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text(f"SHOW {name}")).scalar_one())


def check_statement_timeout_ms(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_STATEMENT_TIMEOUT_MS="1234")) as service:
        assert _shown(service.engine, "statement_timeout") == "1234ms"
        assert _shown(service.loop_engine, "statement_timeout") == "1234ms"


def check_lock_timeout_ms(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_LOCK_TIMEOUT_MS="4321")) as service:
        assert _shown(service.engine, "lock_timeout") == "4321ms"
        assert _shown(service.loop_engine, "lock_timeout") == "4321ms"


def check_pool_timeout_seconds(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_POOL_TIMEOUT_SECONDS="2.5")) as service:
        assert service.engine.pool.timeout() == 2.5  # type: ignore[attr-defined]
        assert service.loop_engine.pool.timeout() == 2.5  # type: ignore[attr-defined]


def check_pool_ping_after_idle_seconds(env: Env) -> None:
    for value, pinged in (("0", True), ("3600", False)):
        with service_from_env(env.base(SCHEDULER_POOL_PING_AFTER_IDLE_SECONDS=value)) as service:
            engine = service.loop_engine
            pings: list[int] = []
            real_ping = engine.dialect.do_ping

            def counting_ping(dbapi_connection: Any, real: Any = real_ping, seen: list[int] = pings) -> bool:
                seen.append(1)
                return bool(real(dbapi_connection))

            engine.dialect.do_ping = counting_ping  # type: ignore[method-assign]
            for _ in range(2):  # a poll's checkout, a moment after the last
                with Session(engine) as session, polling():
                    session.connection()
            assert bool(pings) is pinged, value


def _raw(conn: Connection) -> psycopg.Connection[Any]:
    return cast("psycopg.Connection[Any]", conn.connection.dbapi_connection)


def check_transaction_pooling(env: Env) -> None:
    pooled = env.base(SCHEDULER_TRANSACTION_POOLING="true", SCHEDULER_LOCK_TIMEOUT_MS="4321")
    with service_from_env(pooled) as service:
        for engine in (service.engine, service.loop_engine):
            with engine.connect() as conn:
                assert _raw(conn).prepare_threshold is None  # nothing prepared on a server session
                assert "options" not in _raw(conn).info.get_parameters()  # nothing PgBouncer refuses
                assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "4321ms"  # set per transaction
    with service_from_env(env.base()) as service, service.engine.connect() as conn:
        assert _raw(conn).prepare_threshold is not None and "options" in _raw(conn).info.get_parameters()


def check_environment(env: Env) -> None:
    with pytest.raises(ConfigError, match="development-grade"), \
            service_from_env(env.base(SCHEDULER_ENV="production")):
        pass
    with service_from_env(env.base(SCHEDULER_ENV="development")) as service:
        assert service.settings.environment == "development"


def check_delivery_stale_seconds(env: Env) -> None:
    with env.engine.begin() as conn:  # an outbox row due 60 s before the service's clock, unsent
        conn.execute(text("INSERT INTO deliveries (notification_id, user_id, channel, status, created_at, attempts, "
                          "next_attempt_at) VALUES ('n-late', 'user-d', 'sms', 'queued', :t, 0, :t)"),
                     {"t": T0 - timedelta(seconds=60)})
    for seconds, late in (("45", True), ("90", False)):
        with service_from_env(env.base(SCHEDULER_DELIVERY_STALE_SECONDS=seconds)) as service:
            outbox = service.health.outbox
            assert outbox is not None and outbox.stale_seconds == int(seconds)
            assert outbox.overdue_seconds() == 60.0 and outbox.stale(60.0) is late, seconds


def check_notification_retention_days(env: Env) -> None:
    with env.engine.begin() as conn:  # a delivered notification of twelve days before the service's clock
        conn.execute(text("INSERT INTO notifications (id, user_id, community_id, rule_id, kind, scenario, time_scope, "
                          "dedup_key, title, body, status, source, created_at) VALUES ('n-old', 'user-n', NULL, "
                          "'r', 'k', 's', 'day', 'key-n-old', 't', 'b', 'sent', 'live', :t)"),
                     {"t": T0 - timedelta(days=12)})
    for days, kept in (("0", True), ("20", True), ("10", False)):
        with service_from_env(env.base(SCHEDULER_NOTIFICATION_RETENTION_DAYS=days)) as service:
            assert service.retention.notification_days == int(days)
            service.retention.run_if_due()
            with env.engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM notifications WHERE id = 'n-old'")).scalar_one()
                assert (left == 1) is kept, days
            with env.engine.begin() as conn:  # the next service may start its own run at once
                conn.execute(text("DELETE FROM scheduler_maintenance"))


def check_retention_days(env: Env) -> None:
    sessions = Database(env.engine)
    row = store.store_event(sessions, event_type="reminder", user_id="user-r", community_id=None, external_key=None,
                            trigger_at=T0, facts=reminder_facts(), now=T0)
    with env.engine.begin() as conn:  # dispatched eight days before the service's clock
        conn.execute(text("UPDATE scheduled_events SET status = 'dispatched', dispatched_at = :t, updated_at = :t "
                          "WHERE id = :id"), {"t": T0 - timedelta(days=8), "id": row["id"]})
    for days, kept in (("10", True), ("0", True), ("7", False)):
        with service_from_env(env.base(SCHEDULER_RETENTION_DAYS=days)) as service:
            assert service.retention.days == int(days)
            service.retention.run_if_due()
            with env.engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM scheduled_events WHERE id = :id"), {"id": row["id"]})
                assert (left.scalar_one() == 1) is kept, days
            with env.engine.begin() as conn:  # the next service may start its own run at once
                conn.execute(text("DELETE FROM scheduler_maintenance"))
def check_replica_retention_seconds(env: Env) -> None:
    for seconds, kept in (("14400", True), ("7200", False)):
        with env.engine.begin() as conn:  # a killed replica, silent for three hours by the service's clock
            conn.execute(text(
                "INSERT INTO scheduler_replicas (replica_id, name, host, pid, mode, poll_seconds, started_at, "
                "last_poll_at, seen_at, last_error, consecutive_failures, polls, dispatched, failed) "
                "VALUES ('killed', 'scheduler', 'h', 1, 'literal', 30, :t, NULL, :t, NULL, 0, 0, 0, 0) "
                "ON CONFLICT DO NOTHING"), {"t": T0 - timedelta(hours=3)})
            conn.execute(text("DELETE FROM scheduler_maintenance"))  # the service may start its run at once
        with service_from_env(env.base(SCHEDULER_REPLICA_RETENTION_SECONDS=seconds)) as service:
            assert service.retention.replicas == timedelta(seconds=int(seconds))
            service.retention.run_if_due()
            with env.engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM scheduler_replicas WHERE replica_id = 'killed'"))
                assert (left.scalar_one() == 1) is kept, seconds


def check_metrics_require_admin(env: Env) -> None:
    for value, status in (("true", 401), ("false", 200)):
        with service_from_env(env.base(SCHEDULER_METRICS_REQUIRE_ADMIN=value)) as service, \
                TestClient(service.app) as client:
            assert client.get("/metrics").status_code == status, value
            assert client.get("/metrics", headers=auth(token("nudging.admin"))).status_code == 200


def check_console_refresh_seconds(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_CONSOLE_REFRESH_SECONDS="0.5")) as service, \
            TestClient(service.app) as client:
        assert service.console.refresh_seconds == 0.5
        sign_in(client)
        assert 'data-refresh-ms="500"' in client.get("/console").text


def check_idle_in_transaction_timeout_ms(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS="2345")) as service:
        for engine in (service.engine, service.loop_engine):
            with engine.begin() as conn:
                assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "2345ms"
    pooled = env.base(SCHEDULER_TRANSACTION_POOLING="true", SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS="3456")
    with service_from_env(pooled) as service, service.loop_engine.begin() as conn:
        assert "options" not in _raw(conn).info.get_parameters()
        assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "3456ms"  # SET LOCAL


def _libpq_parameter(engine: Engine, name: str) -> str | None:
    with engine.connect() as conn:
        return _raw(conn).info.get_parameters().get(name)


def check_tcp_keepalives_idle_seconds(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_TCP_KEEPALIVES_IDLE_SECONDS="17")) as service:
        for engine in (service.engine, service.loop_engine):
            assert _libpq_parameter(engine, "keepalives") == "1"
            assert _libpq_parameter(engine, "keepalives_idle") == "17"
        assert service.listener.connect_args["keepalives_idle"] == 17


def check_tcp_user_timeout_ms(env: Env) -> None:
    with service_from_env(env.base(SCHEDULER_TCP_USER_TIMEOUT_MS="4567")) as service:
        for engine in (service.engine, service.loop_engine):
            assert _libpq_parameter(engine, "tcp_user_timeout") == "4567"
        assert service.listener.connect_args["tcp_user_timeout"] == 4567


def check_clock_skew_warn_seconds(env: Env) -> None:
    for value, warns in (("0", True), ("86400", False)):
        with service_from_env(env.base(SCHEDULER_CLOCK_SKEW_WARN_SECONDS=value), clock=None) as service:
            clock = service.clock
            assert isinstance(clock, DatabaseClock) and clock.warn_seconds == float(value)
            clock.sync()  # this host and the test's server differ by some microseconds at least
            assert clock.warned is warns, value


def _signed_in_session(env: Env, **extra: str) -> dict[str, Any]:
    with service_from_env(env.base(**extra)) as service, TestClient(service.app) as client:
        sign_in(client, ttl_seconds=86_400)
        [session] = client.get("/admin/sessions", headers=auth(token("nudging.admin"))).json()
        assert isinstance(session, dict)
        return session


def check_session_max_seconds(env: Env) -> None:
    session = _signed_in_session(env, SCHEDULER_SESSION_MAX_SECONDS="120")
    lifetime = datetime.fromisoformat(session["expires_at"]) - datetime.fromisoformat(session["created_at"])
    assert lifetime == timedelta(seconds=120)


def check_session_idle_seconds(env: Env) -> None:
    session = _signed_in_session(env, SCHEDULER_SESSION_IDLE_SECONDS="90")
    assert session["idle_seconds"] == 90
    idle_end = datetime.fromisoformat(session["ends_at"]) - datetime.fromisoformat(session["last_seen_at"])
    assert idle_end == timedelta(seconds=90)


def check_log_format(env: Env) -> None:
    """The CLI's log lines (here Alembic's, with --verbose) are JSON objects, or text."""
    for value in ("json", "text"):
        done = subprocess.run([sys.executable, "-m", "scheduler", "--verbose", "migrate"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, **env.base(SCHEDULER_LOG_FORMAT=value)})
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert any("alembic" in line for line in lines), done.stderr
        if value == "json":
            assert all(json.loads(line)["logger"] for line in lines), done.stderr
        else:
            assert not any(line.startswith("{") for line in lines), done.stderr


CHECKS: dict[str, Callable[[Env], None]] = {
    "database_url": check_database_url,
    "database_schema": check_database_schema,
    "data_dir": check_data_dir,
    "poll_seconds": check_poll_seconds,
    "batch_size": check_batch_size,
    "default_expiry_seconds": check_default_expiry_seconds,
    "scheduler_enabled": check_scheduler_enabled,
    "mode": check_mode,
    "listen": check_listen,
    "jwt_secret": check_jwt_secret,
    "jwt_public_key": check_jwt_public_key,
    "jwks_url": check_jwks_url,
    "jwt_audience": check_jwt_audience,
    "jwt_issuer": check_jwt_issuer,
    "jwt_scope_claims": check_jwt_scope_claims,
    "jwt_admin_scopes": check_jwt_admin_scopes,
    "jwt_ingest_scopes": check_jwt_ingest_scopes,
    "jwt_leeway_seconds": check_jwt_leeway_seconds,
    "rules_dir": check_rules_dir,
    "max_body_bytes": check_max_body_bytes,
    "bulk_max_events": check_bulk_max_events,
    "bulk_max_body_bytes": check_bulk_max_body_bytes,
    "request_header_timeout_seconds": check_request_header_timeout_seconds,
    "request_body_timeout_seconds": check_request_body_timeout_seconds,
    "statement_timeout_ms": check_statement_timeout_ms,
    "lock_timeout_ms": check_lock_timeout_ms,
    "pool_timeout_seconds": check_pool_timeout_seconds,
    "pool_ping_after_idle_seconds": check_pool_ping_after_idle_seconds,
    "transaction_pooling": check_transaction_pooling,
    "environment": check_environment,
    "retention_days": check_retention_days,
    "delivery_stale_seconds": check_delivery_stale_seconds,
    "notification_retention_days": check_notification_retention_days,
    "replica_retention_seconds": check_replica_retention_seconds,
    "metrics_require_admin": check_metrics_require_admin,
    "console_refresh_seconds": check_console_refresh_seconds,
    "idle_in_transaction_timeout_ms": check_idle_in_transaction_timeout_ms,
    "tcp_keepalives_idle_seconds": check_tcp_keepalives_idle_seconds,
    "tcp_user_timeout_ms": check_tcp_user_timeout_ms,
    "clock_skew_warn_seconds": check_clock_skew_warn_seconds,
    "session_max_seconds": check_session_max_seconds,
    "session_idle_seconds": check_session_idle_seconds,
    "log_format": check_log_format,
    **DELIVERY_CHECKS,  # the delivery channels' settings (tests/wiring/delivery_reach.py)
}


@pytest.mark.clause("WIRE-1")
def test_every_setting_has_a_wiring_check() -> None:
    """WIRE-1: each field of Settings (its one declaration) has a check below; a new setting must bring one."""
    fields = set(Settings.model_fields)
    assert sorted(fields - set(CHECKS)) == [], "add a check to tests/wiring/test_settings_reach.py::CHECKS"
    assert sorted(set(CHECKS) - fields) == []


@pytest.mark.clause("WIRE-1")
@pytest.mark.parametrize("setting", sorted(CHECKS))
def test_each_setting_from_the_environment_reaches_what_it_configures(
    setting: str, database_url: str, engine: Engine, tmp_path: Path
) -> None:
    """WIRE-1: the setting, read from the environment, changes the behaviour it names."""
    CHECKS[setting](Env(database_url, engine, tmp_path))


def readme_variables() -> list[str]:
    rows = re.findall(r"^\| `([A-Z_]+)` \|", README.read_text(), re.M)
    assert rows, "README's configuration table not found"
    return rows


@pytest.mark.clause("WIRE-1")
@pytest.mark.parametrize("variable", readme_variables())
def test_every_variable_in_the_readme_is_read_from_the_environment(variable: str) -> None:
    """WIRE-1: a variable the README documents changes the settings (or is refused as malformed)."""
    default = Settings.from_env({})
    changed: Any
    try:
        changed = Settings.from_env({variable: "7"})
    except ConfigError:
        return  # read, and refused as malformed: it is wired
    assert changed != default, f"{variable} is documented but Settings.from_env ignores it"
