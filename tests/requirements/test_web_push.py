"""Web push on the outbox (PUSH-*), on real PostgreSQL: a participant's subscriptions
(``PUT``/``DELETE /me/push-subscriptions``, the table of migration 0002), one ``web_push``
delivery per subscription queued in the notification's transaction, and the worker's send end
to end against ``scheduler.testing``'s local push service, which plays the browser and
decrypts each push with the subscription's own keys.

The push service has a public name here (``https://push.example.test``: the allow-list admits
only such endpoints); its ``transport()`` carries the worker's requests for that name to its
loopback server, as DNS and TLS would (the one fake: the network's edge).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.database import Database
from scheduler.database.schema import head_revision, migrate
from scheduler.delivery.vapid import VapidKey
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.testing.push_service import Browser, LocalPushService, Reply
from scheduler.web.inbox.push import MAX_SUBSCRIPTIONS
from tests.conftest import T0, TEST_SECRET, bearer, token
from tests.helpers import drain, post_event, reminder_facts, rows

PUSH_ORIGIN = "https://push.example.test"
PUSH_HOST = "push.example.test"
VAPID = VapidKey.generate()
ROUTE = "/me/push-subscriptions"
ANNA = bearer(None, subject="participant-1")
BOB = bearer(None, subject="participant-2")


def push_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"jwt_secret": TEST_SECRET, "poll_seconds": 30.0, "batch_size": 20,
                              "push_allowed_hosts": PUSH_HOST, "vapid_private_key": VAPID.private_key_b64url,
                              "vapid_subject": "mailto:ops@sunny-street.example"}
    return Settings(**(values | overrides))


@pytest.fixture
def push_service(engine: Engine, clock: ManualClock, publisher: RecordingPublisher) -> SchedulerService:
    return SchedulerService(push_settings(), engine=engine, clock=clock, publisher=publisher, run_scheduler=False)


@pytest.fixture
def push_client(push_service: SchedulerService) -> Iterator[TestClient]:
    with TestClient(push_service.app, raise_server_exceptions=True) as client:
        yield client


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def a_subscription(endpoint: str | None = None, **changes: Any) -> dict[str, Any]:
    """A browser's ``PushSubscription.toJSON()`` on the allowed host (keys made here)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    point = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(Encoding.X962,
                                                                               PublicFormat.UncompressedPoint)
    body: dict[str, Any] = {"endpoint": endpoint or f"{PUSH_ORIGIN}/push/{secrets.token_urlsafe(8)}",
                            "expirationTime": None,
                            "keys": {"p256dh": b64(point), "auth": b64(secrets.token_bytes(16))}}
    return body | changes


def web_push_rows(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM deliveries WHERE channel = 'web_push' ORDER BY id")


def subscriptions(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM push_subscriptions ORDER BY id")


# -- PUSH-1: the table, in the scheduler's own schema -------------------------------------


@pytest.mark.clause("PUSH-1")
def test_migration_0002_puts_the_subscriptions_in_the_configured_schema_and_links_push_deliveries(
    engine: Engine, clock: ManualClock
) -> None:
    """PUSH-1: migrated into another schema, ``push_subscriptions`` and the deliveries' link are
    that schema's; its repository writes there, and the default schema's table stays empty."""
    result = migrate(engine, schema="tenant_push")
    assert result.after == head_revision()  # 0002_push_subscriptions, and what follows it
    with engine.connect() as conn:
        columns = set(conn.execute(text(
            "SELECT table_name || '.' || column_name FROM information_schema.columns "
            "WHERE table_schema = 'tenant_push' AND column_name IN ('endpoint', 'push_subscription_id')")).scalars())
    assert columns == {"push_subscriptions.endpoint", "deliveries.push_subscription_id"}
    tenant = Database(engine, "tenant_push")
    with tenant.begin() as session:
        stored = tenant.push_subscriptions.upsert(session, user_id="anna", endpoint=f"{PUSH_ORIGIN}/push/a",
                                                  p256dh=b"\x04" + bytes(64), auth=bytes(16), expiration_time=None,
                                                  now=clock.now(), keep=MAX_SUBSCRIPTIONS)
    assert stored["created"] and stored["evicted"] == 0
    assert rows(engine, "SELECT user_id FROM tenant_push.push_subscriptions") == [{"user_id": "anna"}]
    assert subscriptions(engine) == []


# -- PUSH-2: PUT stores by endpoint --------------------------------------------------------


@pytest.mark.clause("PUSH-2")
def test_a_put_stores_the_callers_subscription_by_its_endpoint_and_never_answers_its_keys(
    push_client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """PUSH-2: 201 for a new endpoint with its decoded keys and expiry stored for the caller;
    the same endpoint again is 200 with the keys replaced (one row); another participant's PUT
    of it makes it theirs; no answer shows a key."""
    first = a_subscription(expirationTime=1_800_000_000_000)
    created = push_client.put(ROUTE, headers=ANNA, json=first)
    assert created.status_code == 201, created.text
    assert set(created.json()) == {"id", "endpoint", "expiration_time", "created_at", "updated_at", "evicted"}
    assert created.json()["expiration_time"] == "2027-01-15T08:00:00+00:00"
    [row] = subscriptions(engine)
    assert (row["user_id"], row["endpoint"], bytes(row["p256dh"])) == (
        "participant-1", first["endpoint"], base64.urlsafe_b64decode(first["keys"]["p256dh"] + "="))
    assert len(bytes(row["auth"])) == 16

    clock.advance(timedelta(minutes=5))
    again = a_subscription(first["endpoint"])
    replaced = push_client.put(ROUTE, headers=ANNA, json=again)
    assert replaced.status_code == 200 and replaced.json()["id"] == created.json()["id"]
    [row] = subscriptions(engine)
    assert b64(bytes(row["p256dh"])) == again["keys"]["p256dh"] and row["expiration_time"] is None
    assert row["updated_at"] == clock.now() and row["created_at"] == T0

    taken = push_client.put(ROUTE, headers=BOB, json=again)
    assert taken.status_code == 200
    assert [r["user_id"] for r in subscriptions(engine)] == ["participant-2"]
    for answer in (created, replaced, taken):
        assert again["keys"]["auth"] not in answer.text and again["keys"]["p256dh"] not in answer.text


@pytest.mark.clause("PUSH-2")
def test_a_participant_keeps_at_most_the_limit_the_least_recently_updated_removed(
    push_client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """PUSH-2: past ``MAX_SUBSCRIPTIONS`` browsers, each new one removes the caller's least
    recently updated (never another participant's), and the answer counts it."""
    push_client.put(ROUTE, headers=BOB, json=a_subscription())
    endpoints = []
    for _ in range(MAX_SUBSCRIPTIONS):
        clock.advance(timedelta(seconds=1))
        endpoints.append(push_client.put(ROUTE, headers=ANNA, json=a_subscription()).json()["endpoint"])
    clock.advance(timedelta(seconds=1))
    push_client.put(ROUTE, headers=ANNA, json=a_subscription(endpoints[0]))  # the oldest, refreshed
    clock.advance(timedelta(seconds=1))
    newest = push_client.put(ROUTE, headers=ANNA, json=a_subscription())
    assert newest.status_code == 201 and newest.json()["evicted"] == 1
    anna = [r["endpoint"] for r in subscriptions(engine) if r["user_id"] == "participant-1"]
    assert len(anna) == MAX_SUBSCRIPTIONS
    assert endpoints[1] not in anna and endpoints[0] in anna and newest.json()["endpoint"] in anna
    assert [r["user_id"] for r in subscriptions(engine)].count("participant-2") == 1


# -- PUSH-3: DELETE -----------------------------------------------------------------------


@pytest.mark.clause("PUSH-3")
def test_a_delete_removes_the_named_endpoint_or_every_one_of_the_callers_and_no_one_elses(
    push_client: TestClient, engine: Engine
) -> None:
    """PUSH-3: a body with the endpoint removes that subscription of the caller's (another
    participant's endpoint is not theirs to remove: 0); no body removes all of the caller's."""
    mine = [push_client.put(ROUTE, headers=ANNA, json=a_subscription()).json()["endpoint"] for _ in range(3)]
    theirs = push_client.put(ROUTE, headers=BOB, json=a_subscription()).json()["endpoint"]
    one = push_client.request("DELETE", ROUTE, headers=ANNA, json={"endpoint": mine[0]})
    assert (one.status_code, one.json()) == (200, {"removed": 1})
    assert push_client.request("DELETE", ROUTE, headers=ANNA, json={"endpoint": theirs}).json() == {"removed": 0}
    every = push_client.delete(ROUTE, headers=ANNA)
    assert (every.status_code, every.json()) == (200, {"removed": 2})
    assert [r["endpoint"] for r in subscriptions(engine)] == [theirs]
    refused = push_client.request("DELETE", ROUTE, headers=ANNA, json={"endpoint": theirs, "user_id": "participant-2"})
    assert refused.status_code == 422 and [e["field"] for e in refused.json()["errors"]] == ["user_id"]
    assert push_client.request("DELETE", ROUTE, headers=ANNA, content=b"{}",
                               ).status_code == 415  # a body must say it is JSON


# -- PUSH-4: who may, and when ------------------------------------------------------------


@pytest.mark.clause("PUSH-4")
def test_the_routes_take_a_bearer_or_the_inbox_cookie_with_its_csrf_token(
    push_client: TestClient, engine: Engine
) -> None:
    """PUSH-4: no token is a 401; the inbox page's cookie without its session's X-CSRF-Token
    is a 403 (nothing stored), with it the caller's subscription is stored and removed; a body
    not sent as JSON is a 415."""
    body = a_subscription()
    assert push_client.put(ROUTE, json=body).status_code == 401
    assert push_client.delete(ROUTE).status_code == 401
    signed_in = push_client.post("/inbox/session", json={"token": token(None, subject="participant-1")})
    csrf = signed_in.json()["csrf"]
    assert push_client.put(ROUTE, json=body).status_code == 403
    assert push_client.put(ROUTE, json=body, headers={"X-CSRF-Token": "not-it"}).status_code == 403
    assert push_client.delete(ROUTE).status_code == 403
    assert subscriptions(engine) == []
    stored = push_client.put(ROUTE, json=body, headers={"X-CSRF-Token": csrf})
    assert stored.status_code == 201
    assert [r["user_id"] for r in subscriptions(engine)] == ["participant-1"]
    assert push_client.put(ROUTE, content=json.dumps(body), headers={"X-CSRF-Token": csrf,
                                                                      "Content-Type": "text/plain"}).status_code == 415
    assert push_client.delete(ROUTE, headers={"X-CSRF-Token": csrf}).json() == {"removed": 1}


@pytest.mark.clause("PUSH-4")
def test_without_a_vapid_key_web_push_is_off_a_put_is_409_and_nothing_is_queued(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """PUSH-4: the default service has no VAPID key: no web_push channel, a well-formed PUT is
    a 409 saying web push is off (a malformed one is still the 422), and the page offers no push."""
    assert "web_push" not in service.outbox_channels
    answer = client.put(ROUTE, headers=ANNA, json=a_subscription(f"https://fcm.googleapis.com/fcm/send/{'a' * 20}"))
    assert answer.status_code == 409 and "SCHEDULER_VAPID_PRIVATE_KEY" in answer.json()["detail"]
    assert client.put(ROUTE, headers=ANNA, json={}).status_code == 422
    assert subscriptions(engine) == []
    assert '<meta name="vapid-public-key" content="">' in client.get("/inbox").text


# -- PUSH-5: the one strict parse, the allow-list ------------------------------------------


@pytest.mark.clause("PUSH-5")
@pytest.mark.parametrize("endpoint", [
    "https://127.0.0.1/push/x", "https://[::1]/push/x", "https://169.254.169.254/latest/meta-data",
    f"https://user:pw@{PUSH_HOST}/push/x", f"https://{PUSH_HOST}@127.0.0.1/push/x", f"http://{PUSH_HOST}/push/x",
    f"https://{PUSH_HOST}:8443/push/x", "https://fcm.googleapis.com/fcm/send/x", "https://localhost/push/x",
    f"https://{PUSH_HOST}.evil.example/push/x", f"https://evil.example/{PUSH_HOST}",
])
def test_an_endpoint_off_the_allow_list_is_a_422_naming_endpoint_and_nothing_is_stored(
    push_client: TestClient, engine: Engine, endpoint: str
) -> None:
    """PUSH-5: an internal address, an IP in any spelling, credentials, another scheme, port or
    host (here only ``push.example.test`` is allowed) is refused naming ``endpoint``."""
    answer = push_client.put(ROUTE, headers=ANNA, json=a_subscription(endpoint))
    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["endpoint"]
    assert subscriptions(engine) == []


@pytest.mark.clause("PUSH-5")
def test_a_body_that_is_not_exactly_a_push_subscription_is_a_422_naming_each_field(push_client: TestClient) -> None:
    """PUSH-5: every wrong field is named at once; a key that is no P-256 point, an auth secret
    of the wrong size, an unknown member, an expiry past year 9999, a body that is no object."""
    body = a_subscription(extra=1, expirationTime=10**30)
    body["keys"] = {"p256dh": b64(b"\x04" + bytes(64)), "auth": b64(bytes(15))}
    answer = push_client.put(ROUTE, headers=ANNA, json=body)
    assert answer.status_code == 422
    assert sorted(e["field"] for e in answer.json()["errors"]) == ["expirationTime", "extra", "keys.auth",
                                                                    "keys.p256dh"]
    for hostile in (b"[]", b"null", b'"endpoint"', b"{", b'{"endpoint": NaN}'):
        refused = push_client.put(ROUTE, headers=ANNA | {"Content-Type": "application/json"}, content=hostile)
        assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "body", hostile


# -- PUSH-6: one delivery per subscription, in the notification's transaction --------------


@pytest.mark.clause("PUSH-6")
def test_a_sent_notification_queues_one_web_push_row_per_unexpired_subscription_of_its_participant(
    push_client: TestClient, push_service: SchedulerService, engine: Engine, clock: ManualClock,
    publisher: RecordingPublisher
) -> None:
    """PUSH-6: of three subscriptions of the participant one has expired, and someone else has
    one: the notification queues one row for each of its participant's two unexpired ones,
    queued and due at once, each with its own key and the message; the publisher sees the
    in-app message only."""
    live = [push_client.put(ROUTE, headers=ANNA, json=a_subscription()).json()["id"] for _ in range(2)]
    expired_at = int((clock.now() - timedelta(minutes=1)).timestamp() * 1000)
    push_client.put(ROUTE, headers=ANNA, json=a_subscription(expirationTime=expired_at))
    push_client.put(ROUTE, headers=BOB, json=a_subscription())
    post_event(push_client)
    drain(push_service)
    [note] = rows(engine, "SELECT * FROM notifications")
    queued = web_push_rows(engine)
    assert [r["push_subscription_id"] for r in queued] == live
    assert {(r["status"], r["attempts"], r["notification_id"], r["user_id"]) for r in queued} == {
        ("queued", 0, note["id"], "participant-1")}
    assert all(r["next_attempt_at"] == note["created_at"] for r in queued)
    assert len({r["idempotency_key"] for r in queued}) == 2
    assert all(r["message"]["title"] == note["title"] for r in queued)
    assert [m.channel for m in publisher.messages] == ["web"]


@pytest.mark.clause("PUSH-6")
def test_no_subscription_queues_no_push_and_a_decision_rolled_back_queues_none(
    push_client: TestClient, push_service: SchedulerService, engine: Engine
) -> None:
    """PUSH-6: a participant without a subscription gets no web_push row (and the write's own
    count check still holds); a batch that rolls back leaves none for one who has."""
    post_event(push_client, user_id="participant-2")
    drain(push_service)
    assert web_push_rows(engine) == [] and len(rows(engine, "SELECT id FROM notifications")) == 1
    push_client.put(ROUTE, headers=ANNA, json=a_subscription())
    post_event(push_client)
    scheduler = push_service.scheduler
    batch = scheduler.claim()
    while scheduler.dispatch_next(batch) is not None:
        pass
    scheduler.abort(batch)
    assert web_push_rows(engine) == []


# -- PUSH-7 and PUSH-8: end to end ---------------------------------------------------------


async def _subscribe(client: TestClient, push: LocalPushService, headers: dict[str, str]) -> Browser:
    browser = push.subscribe(application_server_key=VAPID.public_key_b64url)
    answer = await asyncio.to_thread(client.put, ROUTE, headers=headers, json=browser.subscription_json())
    assert answer.status_code == 201, answer.text
    return browser


async def _dispatch(client: TestClient, service: SchedulerService, **event: Any) -> None:
    await asyncio.to_thread(post_event, client, **event)
    await asyncio.to_thread(drain, service)


@pytest.mark.clause("PUSH-7")
def test_a_put_subscription_receives_the_reminder_encrypted_and_the_browser_decrypts_its_title_and_body(
    engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """PUSH-7: PUT from the browser's subscription, a reminder dispatched, the worker's one
    claim sends it: the push service verifies the VAPID token (the service's key, its own
    origin), decrypts with the subscription's private key and auth secret, and finds the
    notification's id, title and body; the row is delivered with the service's 201."""

    async def scenario() -> None:
        async with LocalPushService(clock=clock, public_origin=PUSH_ORIGIN) as push:
            service = SchedulerService(push_settings(), engine=engine, clock=clock, publisher=publisher,
                                       run_scheduler=False)
            assert service.outbox_channels == ("web_push",)
            with TestClient(service.app) as client:
                browser = await _subscribe(client, push, ANNA)
                await _dispatch(client, service)
            worker = service.delivery_worker(client=httpx.AsyncClient(transport=push.transport()))
            [recorded] = await worker.run_once()
            assert recorded.kept
            [received] = push.pushes_to(browser)
            assert received.accepted and received.status == 201, received.problems
            assert received.claims is not None and received.claims["aud"] == PUSH_ORIGIN
            assert received.plaintext is not None
            shown = json.loads(received.plaintext)
            [note] = await asyncio.to_thread(rows, engine, "SELECT * FROM notifications")
            assert (shown["id"], shown["title"], shown["body"]) == (note["id"], note["title"], note["body"])
            [row] = await asyncio.to_thread(web_push_rows, engine)
            assert shown["idempotency_key"] == row["idempotency_key"]
            assert (row["status"], row["attempts"], row["provider_status"]) == ("delivered", 1, 201)
            await service.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


@pytest.mark.clause("PUSH-8")
def test_a_410_from_the_push_service_removes_the_subscription_and_ends_the_delivery_undeliverable(
    engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """PUSH-8: the browser unsubscribed (its endpoint answers 410) and another's answers 404:
    both rows end undeliverable, both subscriptions are removed, a third participant's live one is
    delivered and kept; the next reminder queues nothing for the removed ones."""

    async def scenario() -> None:
        async with LocalPushService(clock=clock, public_origin=PUSH_ORIGIN) as push:
            service = SchedulerService(push_settings(), engine=engine, clock=clock, publisher=publisher,
                                       run_scheduler=False)
            with TestClient(service.app) as client:
                gone = await _subscribe(client, push, ANNA)
                missing = await _subscribe(client, push, BOB)
                kept = await _subscribe(client, push, bearer(None, subject="participant-3"))
                push.unsubscribe(gone)
                push.answer(Reply.of(404))
                for user in ("participant-2", "participant-1", "participant-3"):
                    await _dispatch(client, service, user_id=user)
                worker = service.delivery_worker(client=httpx.AsyncClient(transport=push.transport()))
                await worker.run_once()
                assert [p.status for p in push.pushes_to(gone)] == [410]
                assert [p.status for p in push.pushes_to(missing)] == [404]
                assert [p.status for p in push.pushes_to(kept)] == [201]
                by_user = {r["user_id"]: r for r in await asyncio.to_thread(web_push_rows, engine)}
                for user, status in (("participant-1", 410), ("participant-2", 404)):
                    row = by_user[user]
                    assert (row["status"], row["provider_status"]) == ("undeliverable", status)
                    assert "push subscription is gone" in row["last_error"] and row["push_subscription_id"] is None
                assert by_user["participant-3"]["status"] == "delivered"
                assert [r["user_id"] for r in await asyncio.to_thread(subscriptions, engine)] == ["participant-3"]
                clock.advance(timedelta(days=1))
                await _dispatch(client, service, user_id="participant-1", trigger_at=clock.now(),
                                facts=reminder_facts(day="2026-12-01"))
                assert len(await asyncio.to_thread(web_push_rows, engine)) == 3
            await service.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


@pytest.mark.clause("PUSH-8")
def test_a_subscription_removed_or_renewed_before_the_send_is_neither_pushed_nor_removed_by_an_old_answer(
    engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """PUSH-8: a row whose subscription was DELETEd before its send is undeliverable with no
    request; a browser that subscribed again (new keys, same endpoint) between the claim and
    a 410 for its old keys keeps its new subscription."""

    async def scenario() -> None:
        async with LocalPushService(clock=clock, public_origin=PUSH_ORIGIN) as push:
            service = SchedulerService(push_settings(), engine=engine, clock=clock, publisher=publisher,
                                       run_scheduler=False)
            with TestClient(service.app) as client:
                dropped = await _subscribe(client, push, ANNA)
                renewed = await _subscribe(client, push, BOB)
                await _dispatch(client, service, user_id="participant-1")
                await _dispatch(client, service, user_id="participant-2")
                answer = await asyncio.to_thread(client.request, "DELETE", ROUTE, headers=ANNA,
                                                 json={"endpoint": dropped.target.endpoint})
                assert answer.json() == {"removed": 1}
                worker = service.delivery_worker(client=httpx.AsyncClient(transport=push.transport()))
                claimed = await asyncio.to_thread(worker.claim, 10)
                assert [c.delivery.push is None for c in claimed] == [True, False]
                clock.advance(timedelta(seconds=1))
                again = await asyncio.to_thread(client.put, ROUTE, headers=BOB,
                                                json=a_subscription(renewed.target.endpoint))
                assert again.status_code == 200
                push.unsubscribe(renewed)
                results = [await worker.attempt_one(c) for c in claimed]
                await asyncio.to_thread(worker.record, list(zip(claimed, results, strict=True)))
            assert push.pushes_to(dropped) == [] and [p.status for p in push.pushes_to(renewed)] == [410]
            by_user = {r["user_id"]: r for r in await asyncio.to_thread(web_push_rows, engine)}
            assert by_user["participant-1"]["status"] == "undeliverable"
            assert "without a push subscription" in by_user["participant-1"]["last_error"]
            assert by_user["participant-2"]["status"] == "undeliverable"
            assert [r["user_id"] for r in await asyncio.to_thread(subscriptions, engine)] == ["participant-2"]
            await service.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


# -- PUSH-9: the inbox page offers it --------------------------------------------------------


@pytest.mark.clause("PUSH-9")
def test_the_inbox_page_offers_web_push_with_the_vapid_public_key_and_serves_its_service_worker(
    push_client: TestClient
) -> None:
    """PUSH-9: the page carries the VAPID public key for ``PushManager.subscribe``, subscribes
    and PUTs with its CSRF token, and its CSP still allows only its own hashed script and now its
    own worker; the service worker is a script with a CSP of its own that shows each push with
    its title and body, tagged by the notification's id."""
    page = push_client.get("/inbox")
    assert f'<meta name="vapid-public-key" content="{VAPID.public_key_b64url}">' in page.text
    assert "pushManager.subscribe" in page.text and '"me/push-subscriptions"' in page.text
    assert '"X-CSRF-Token": session.csrf' in page.text
    policy = page.headers["content-security-policy"]
    assert "worker-src 'self'" in policy and "script-src 'sha256-" in policy and "unsafe-inline" not in policy
    worker = push_client.get("/inbox/service-worker.js")
    assert worker.status_code == 200 and worker.headers["content-type"].startswith("text/javascript")
    assert worker.headers["content-security-policy"] == "default-src 'none'"
    assert worker.headers["x-content-type-options"] == "nosniff"
    for piece in ('addEventListener("push"', "showNotification(", "note.title", "note.body", "options.tag = note.id"):
        assert piece in worker.text, piece
