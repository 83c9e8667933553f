"""DELIV-10, DELIV-11, DELIV-14, DELIV-17: RFC 8291 encryption (its Appendix A byte for
byte), VAPID, and the web-push channel end to end: encrypted by ``WebPushSender``, sent over
real loopback HTTP, decrypted by the local push service with the subscription's keys."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.clock import ManualClock
from scheduler.delivery import http
from scheduler.delivery.encryption import MAX_PLAINTEXT_BYTES, encrypt, public_bytes
from scheduler.delivery.vapid import VapidKey, b64url, b64url_decode, origin
from scheduler.delivery.webpush import Urgency, WebPushSender, push_payload
from scheduler.testing.push_service import HANG, LocalPushService, PushRefused, Reply, decrypt_push
from scheduler.types import Delivered, Gone, OutboundDelivery, PushTarget, Retry, Undeliverable

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
PROPERTIES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SUBJECT = "mailto:ops@sunny-street.example"

# RFC 8291 Appendix A: the keys, salt and plaintext of its worked example, and the body.
RFC_PLAINTEXT = b"When I grow up, I want to be a watermelon"
RFC_AS_PRIVATE = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"
RFC_AS_PUBLIC = "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8"
RFC_UA_PRIVATE = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"
RFC_UA_PUBLIC = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
RFC_SALT = "DGv6ra1nlYgDCS1FRnbzlw"
RFC_AUTH = "BTBZMqHH6r4Tts7J_aSIgg"
RFC_BODY = ("DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27ml"
            "mlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPT"
            "pK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN")


def _private(scalar: str) -> ec.EllipticCurvePrivateKey:
    return ec.derive_private_key(int.from_bytes(b64url_decode(scalar), "big"), ec.SECP256R1())


def delivery(target: PushTarget | None, *, body: str = "Run the dishwasher at noon",
             key: str = "dlv_7") -> OutboundDelivery:
    return OutboundDelivery(delivery_id="d-7", idempotency_key=key, channel="web_push", notification_id="n-7",
                            user_id="anna", community_id="sunny-street", kind="commitment_reminder",
                            title="Reminder", body=body, created_at=NOW, push=target)


# -- DELIV-10: RFC 8291 -------------------------------------------------------------------


@pytest.mark.clause("DELIV-10")
def test_the_encryption_reproduces_rfc_8291_appendix_a_byte_for_byte() -> None:
    """DELIV-10: with the example's server key and salt injected, the body is the RFC's."""
    server = _private(RFC_AS_PRIVATE)
    assert b64url(public_bytes(server.public_key())) == RFC_AS_PUBLIC
    body = encrypt(RFC_PLAINTEXT, b64url_decode(RFC_UA_PUBLIC), b64url_decode(RFC_AUTH),
                   salt=b64url_decode(RFC_SALT), sender_key=server)
    assert b64url(body) == RFC_BODY


@pytest.mark.clause("DELIV-10")
@pytest.mark.clause("DELIV-17")
def test_the_local_push_services_browser_opens_the_rfcs_body_and_refuses_a_changed_byte() -> None:
    """DELIV-17: the fake's independent decryption (HKDF from ``cryptography``) reads the RFC's
    body with the browser's key; one flipped byte is refused, so it proves something."""
    browser, auth = _private(RFC_UA_PRIVATE), b64url_decode(RFC_AUTH)
    body = b64url_decode(RFC_BODY)
    assert decrypt_push(body, browser, auth) == RFC_PLAINTEXT
    with pytest.raises(PushRefused):
        decrypt_push(body[:-1] + bytes([body[-1] ^ 0x40]), browser, auth)
    with pytest.raises(PushRefused):
        decrypt_push(body, browser, bytes(16))


@pytest.mark.clause("DELIV-10")
@given(plaintext=st.binary(max_size=MAX_PLAINTEXT_BYTES))
@PROPERTIES
def test_any_payload_up_to_the_limit_round_trips_with_a_fresh_key_and_salt_each_time(plaintext: bytes) -> None:
    """DELIV-10: one record of any size that fits; two encryptions of one payload differ."""
    browser = ec.generate_private_key(ec.SECP256R1())
    point = public_bytes(browser.public_key())
    auth = b"0123456789abcdef"
    first, second = encrypt(plaintext, point, auth), encrypt(plaintext, point, auth)
    assert first != second and len(first) == 86 + len(plaintext) + 1 + 16 <= 4096
    assert decrypt_push(first, browser, auth) == plaintext == decrypt_push(second, browser, auth)


@pytest.mark.clause("DELIV-10")
def test_a_payload_past_one_record_a_wrong_size_key_or_auth_is_refused() -> None:
    """DELIV-10: the limits are checked before anything is computed."""
    point, auth = b64url_decode(RFC_UA_PUBLIC), b64url_decode(RFC_AUTH)
    with pytest.raises(ValueError, match="at most 3993"):
        encrypt(b"x" * (MAX_PLAINTEXT_BYTES + 1), point, auth)
    with pytest.raises(ValueError, match="16 bytes"):
        encrypt(b"x", point, auth[:15])
    with pytest.raises(ValueError, match="65-byte"):
        encrypt(b"x", point[1:], auth)
    with pytest.raises(ValueError):
        encrypt(b"x", b"\x04" + bytes(64), auth)  # not on the curve


# -- DELIV-11: VAPID ----------------------------------------------------------------------


@pytest.mark.clause("DELIV-11")
def test_the_vapid_header_carries_an_es256_jwt_for_the_endpoints_origin_and_the_public_key() -> None:
    """DELIV-11: ``vapid t=<JWT>, k=<key>``: the JWT verifies with ``k``, ``aud`` is the
    endpoint's origin, ``exp`` is 12 hours ahead (at most 24), ``sub`` the contact."""
    key = VapidKey.generate()
    value = key.authorization("https://updates.push.services.mozilla.com/wpush/v2/gAAAA", subject=SUBJECT, now=NOW)
    assert value.startswith("vapid t=")
    token, k = value.removeprefix("vapid t=").split(", k=")
    assert k == key.public_key_b64url and len(b64url_decode(k)) == 65
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b64url_decode(k))
    claims = jwt.decode(token, public, algorithms=["ES256"], audience="https://updates.push.services.mozilla.com",
                        options={"verify_exp": False})
    assert claims == {"aud": "https://updates.push.services.mozilla.com",
                      "exp": int((NOW + timedelta(hours=12)).timestamp()), "sub": SUBJECT}
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "typ": "JWT"}
    with pytest.raises(ValueError, match="24 hours"):
        key.token("https://fcm.googleapis.com/x", subject=SUBJECT, now=NOW, lifetime=timedelta(hours=25))


@pytest.mark.clause("DELIV-11")
@pytest.mark.parametrize(("endpoint", "expected"), [
    ("https://fcm.googleapis.com/fcm/send/abc?x=1", "https://fcm.googleapis.com"),
    ("https://FCM.googleapis.com:443/a", "https://fcm.googleapis.com"),
    ("https://push.example:8443/a", "https://push.example:8443"),
    ("http://127.0.0.1:5000/push/x", "http://127.0.0.1:5000"),
])
def test_the_audience_is_the_origin_of_the_endpoint(endpoint: str, expected: str) -> None:
    """DELIV-11: scheme and host in lower case, the port only when not the scheme's default."""
    assert origin(endpoint) == expected


@pytest.mark.clause("DELIV-11")
def test_a_vapid_key_reads_from_pem_or_base64url_and_a_malformed_one_is_a_clear_error_without_the_key() -> None:
    """DELIV-11: both forms give the same key; anything else says what a key must be."""
    key = VapidKey.generate()
    assert VapidKey.parse(key.private_pem()).public_key_b64url == key.public_key_b64url
    assert VapidKey.parse(key.private_key_b64url).public_key_b64url == key.public_key_b64url
    rsa_pem = ("-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEAu1SU1LfVLPHCozMxH2Mo\n"
               "-----END PRIVATE KEY-----")
    secret = key.private_key_b64url
    for text, said in [("not a key", "base64url of a 32-byte"), (secret[:-2], "32-byte"),
                       (b64url(bytes(32)), "out of range"), (rsa_pem, "PEM"),
                       (b64url(b"\xff" * 32), "out of range")]:
        with pytest.raises(ValueError, match=said) as refused:
            VapidKey.parse(text)
        assert secret not in str(refused.value)
    assert secret not in repr(key)


# -- DELIV-14: the web-push channel end to end ------------------------------------------------


def _sender(client: http.HttpClient, key: VapidKey, clock: ManualClock, **kwargs: Any) -> WebPushSender:
    return WebPushSender(key, subject=SUBJECT, client=client, clock=clock, timeout=kwargs.pop("timeout", 5.0),
                         retry_after_cap=600.0, **kwargs)


@pytest.mark.clause("DELIV-14")
@pytest.mark.clause("DELIV-17")
def test_a_push_is_encrypted_for_the_subscription_sent_over_loopback_and_decrypted_equal() -> None:
    """DELIV-14: ``WebPushSender`` encrypts the payload for the browser's keys, identifies itself
    with VAPID, sends ``TTL``, ``Urgency`` and ``Content-Encoding: aes128gcm``; the local push
    service (playing the browser, which made the keys) verifies the token and decrypts the
    payload: exactly ``push_payload``'s JSON. A 201 is ``Delivered``."""
    clock, key = ManualClock(NOW), VapidKey.generate()

    async def scenario() -> None:
        async with LocalPushService(clock=clock) as push, http.DeliveryHttp(4) as client:
            browser = push.subscribe(application_server_key=key.public_key_b64url)
            sent = delivery(browser.target, body="Run the dishwasher at noon \u2600")
            result = await _sender(client, key, clock, urgency=Urgency.HIGH).send(sent)
            assert result == Delivered(status=201, answer="")
            [got] = push.pushes_to(browser)
            assert got.accepted, got.problems
            assert got.plaintext == push_payload(sent)
            assert json.loads(got.plaintext or b"") == {
                "id": "n-7", "idempotency_key": "dlv_7", "kind": "commitment_reminder", "title": "Reminder",
                "body": "Run the dishwasher at noon \u2600", "created_at": "2026-05-04T09:30:00+00:00"}
            assert got.headers["ttl"] == "86400" and got.headers["urgency"] == "high"
            assert got.headers["content-encoding"] == "aes128gcm"
            assert got.claims is not None and got.claims["aud"] == push.origin and got.claims["sub"] == SUBJECT

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-14")
@pytest.mark.parametrize(("reply", "expected"), [
    (Reply.of(404), Gone(status=404, reason="HTTP 404")),
    (Reply.of(410, "unsubscribed"), Gone(status=410, reason="HTTP 410: unsubscribed")),
    (Reply.of(429, retry_after="120"), Retry(reason="HTTP 429", retry_after=120.0)),
    (Reply.of(500, "internal"), Retry(reason="HTTP 500: internal", retry_after=None)),
    (Reply.of(413, "payload too large"), Undeliverable(reason="HTTP 413: payload too large")),
])
def test_the_push_services_answers_are_classified_gone_retry_or_undeliverable(reply: Reply, expected: object) -> None:
    """DELIV-14: 404/410 are ``Gone`` (remove the subscription), 429 honours ``Retry-After``,
    500 is retried, any other 4xx undeliverable."""
    clock, key = ManualClock(NOW), VapidKey.generate()

    async def scenario() -> None:
        async with LocalPushService(clock=clock) as push, http.DeliveryHttp(4) as client:
            browser = push.subscribe()
            push.answer(reply)
            assert await _sender(client, key, clock).send(delivery(browser.target)) == expected
            assert push.pushes_to(browser)[0].accepted  # the push itself was sound

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-14")
@pytest.mark.clause("DELIV-17")
def test_an_unsubscribed_browsers_endpoint_answers_410_and_a_hanging_push_service_times_out() -> None:
    """DELIV-17: the fake answers 410 for a subscription the browser dropped; DELIV-14: that is
    ``Gone``, and a push service that never answers is a ``Retry`` after the per-send timeout."""
    clock, key = ManualClock(NOW), VapidKey.generate()

    async def scenario() -> None:
        async with LocalPushService(clock=clock) as push, http.DeliveryHttp(4) as client:
            dropped, hanging = push.subscribe(), push.subscribe()
            push.unsubscribe(dropped)
            assert await _sender(client, key, clock).send(delivery(dropped.target)) == Gone(status=410,
                                                                                           reason="HTTP 410")
            push.answer(HANG)
            result = await _sender(client, key, clock, timeout=0.2).send(delivery(hanging.target))
            assert result == Retry(reason="timeout: no answer within 0.2 s")

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-17")
def test_the_local_push_service_refuses_a_push_signed_with_another_key_or_an_expired_token() -> None:
    """DELIV-17: the fake checks what a push service checks: ``k`` must be the key the browser
    subscribed with (401), and a token already expired by its clock is refused."""
    clock, key, other = ManualClock(NOW), VapidKey.generate(), VapidKey.generate()

    async def scenario() -> None:
        async with LocalPushService(clock=clock) as push, http.DeliveryHttp(4) as client:
            browser = push.subscribe(application_server_key=key.public_key_b64url)
            result = await _sender(client, other, clock).send(delivery(browser.target))
            assert isinstance(result, Undeliverable) and result.reason.startswith("HTTP 401")
            stale = ManualClock(NOW - timedelta(hours=13))  # the sender's token expired an hour ago
            result = await _sender(client, key, stale).send(delivery(browser.target))
            assert isinstance(result, Undeliverable) and "expired" in result.reason
            assert [p.accepted for p in push.pushes_to(browser)] == [False, False]

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-14")
def test_a_delivery_without_a_subscription_or_with_unusable_keys_is_undeliverable_without_a_request() -> None:
    """DELIV-14: nothing to encrypt for is ``Undeliverable``, and so is a stored key that is no point."""
    clock, key = ManualClock(NOW), VapidKey.generate()

    async def scenario() -> None:
        async with LocalPushService(clock=clock) as push, http.DeliveryHttp(4) as client:
            sender = _sender(client, key, clock)
            assert isinstance(await sender.send(delivery(None)), Undeliverable)
            broken = PushTarget(endpoint=push.origin + "/push/x", p256dh=b"\x04" + bytes(64), auth=bytes(16))
            result = await sender.send(delivery(broken))
            assert isinstance(result, Undeliverable) and "cannot encrypt" in result.reason
            assert push.received == []

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-14")
def test_a_body_too_long_for_one_push_is_shortened_with_an_ellipsis_to_fit() -> None:
    """DELIV-14: the payload always fits one record; the title and the rest stay whole."""
    payload = push_payload(delivery(None, body="\u00e9" * 5000))
    assert len(payload) <= MAX_PLAINTEXT_BYTES
    shown = json.loads(payload)
    assert shown["body"].endswith("\u2026") and shown["title"] == "Reminder" and len(shown["body"]) > 1000
    short = delivery(None)
    assert json.loads(push_payload(short))["body"] == short.body


@pytest.mark.clause("DELIV-14")
def test_a_sender_refuses_a_subject_that_is_no_contact_and_a_ttl_past_four_weeks() -> None:
    """DELIV-14: built wrong, a sender fails at once, not on the first push."""
    client, key = http.DeliveryHttp(1), VapidKey.generate()
    with pytest.raises(ValueError, match="contact"):
        WebPushSender(key, subject="ops", client=client, clock=ManualClock(NOW), timeout=5.0, retry_after_cap=60.0)
    with pytest.raises(ValueError, match="TTL"):
        WebPushSender(key, subject=SUBJECT, client=client, clock=ManualClock(NOW), timeout=5.0, retry_after_cap=60.0,
                      ttl=timedelta(days=29))
    assert base64.urlsafe_b64decode(key.public_key_b64url + "==")[0] == 4
