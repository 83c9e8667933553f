"""DELIV-6, DELIV-8, DELIV-9, DELIV-17, DELIV-18: one POST of a channel, Standard Webhooks
signatures, the webhook channel end to end against a local receiver over real loopback HTTP,
and the production HTTP client (``DeliveryHttp``) that these tests send with."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.clock import ManualClock
from scheduler.delivery import http
from scheduler.delivery.signing import (
    WebhookVerificationError,
    format_secret,
    parse_secret,
    sign,
    sign_headers,
    verify,
)
from scheduler.delivery.webhook import WebhookSender, webhook_body
from scheduler.testing.loopback import LoopbackServer, Request
from scheduler.testing.webhook_receiver import HANG, LocalWebhookReceiver, Reply
from scheduler.types import Delivered, OutboundDelivery, Retry, Undeliverable

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
KEY = bytes(range(32))
PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# The Standard Webhooks reference libraries' published test vector (libraries/python/tests:
# test_sign_function): the secret, message id, timestamp and payload, and the signature.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def independent_signature(key: bytes, message_id: str, timestamp: str, body: bytes) -> str:
    """The spec's scheme computed here, with nothing of ``scheduler.delivery``."""
    mac = hmac.new(key, message_id.encode() + b"." + timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def production_client() -> http.DeliveryHttp:
    """The client the service sends with (DEC-DELIVERY-HTTP), a few connections."""
    return http.DeliveryHttp(4)


def delivery(key: str = "dlv_01HX", attempt_number: int = 1) -> OutboundDelivery:
    return OutboundDelivery(delivery_id="d-1", idempotency_key=key, channel="webhook", notification_id="n-42",
                            user_id="anna", community_id="sunny-street", kind="commitment_reminder",
                            title="Reminder: run the dishwasher", body="At noon, when the sun is out \u2600",
                            created_at=NOW - timedelta(minutes=5), attempt=attempt_number)


# -- DELIV-8: Standard Webhooks signatures ----------------------------------------------------


@pytest.mark.clause("DELIV-8")
def test_the_signature_is_the_reference_libraries_published_vector() -> None:
    """DELIV-8: ``whsec_`` secret, ``{id}.{timestamp}.{body}``, ``v1,`` and base64 HMAC-SHA256:
    byte for byte the Standard Webhooks reference vector, and this test's own HMAC."""
    key = parse_secret(SPEC_SECRET)
    assert sign(key, SPEC_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD) == SPEC_SIGNATURE
    assert independent_signature(key, SPEC_ID, str(SPEC_TIMESTAMP), SPEC_PAYLOAD) == SPEC_SIGNATURE
    when = datetime.fromtimestamp(SPEC_TIMESTAMP, UTC)
    verify(SPEC_SECRET, {"Webhook-Id": SPEC_ID, "Webhook-Timestamp": str(SPEC_TIMESTAMP),
                         "Webhook-Signature": SPEC_SIGNATURE}, SPEC_PAYLOAD, now=when)


@pytest.mark.clause("DELIV-8")
@given(key=st.binary(min_size=24, max_size=64), body=st.binary(max_size=500),
       message_id=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=".,"),
                          min_size=1, max_size=40),
       timestamp=st.integers(min_value=0, max_value=10**11))
@PROPERTIES
def test_every_signed_message_verifies_matches_an_independent_hmac_and_a_changed_byte_does_not(
        key: bytes, body: bytes, message_id: str, timestamp: int) -> None:
    """DELIV-8: for any key, id, time and body: the signature equals this test's HMAC, the
    message verifies at its time, and flipping one byte of the body, the id or the key fails."""
    headers = sign_headers(key, message_id, timestamp, body)
    assert headers["webhook-signature"] == independent_signature(key, message_id, str(timestamp), body)
    when = datetime.fromtimestamp(timestamp, UTC)
    verify(key, headers, body, now=when)
    tampered = body[:-1] + bytes([body[-1] ^ 1]) if body else b"x"
    with pytest.raises(WebhookVerificationError):
        verify(key, headers, tampered, now=when)
    with pytest.raises(WebhookVerificationError):
        verify(bytes([key[0] ^ 1]) + key[1:], headers, body, now=when)
    with pytest.raises(WebhookVerificationError):
        verify(key, {**headers, "webhook-id": message_id + "x"}, body, now=when)


@pytest.mark.clause("DELIV-8")
def test_a_receiver_accepts_any_matching_signature_of_a_space_separated_list_and_skips_other_versions() -> None:
    """DELIV-8: during a rotation the header lists several signatures; one ``v1`` match is
    enough; ``v1a`` and unknown versions, and malformed entries, are skipped."""
    good = sign(KEY, "msg_1", 1_700_000_000, b"{}")
    other = sign(bytes(32), "msg_1", 1_700_000_000, b"{}")
    listed = f"v1,not-base64!! v2,{good[3:]} {other} v1a,{good[3:]} {good}"
    now = datetime.fromtimestamp(1_700_000_000, UTC)
    verify(KEY, {"webhook-id": "msg_1", "webhook-timestamp": "1700000000", "webhook-signature": listed}, b"{}",
           now=now)
    with pytest.raises(WebhookVerificationError, match="no signature matches"):
        verify(KEY, {"webhook-id": "msg_1", "webhook-timestamp": "1700000000",
                     "webhook-signature": f"{other} v2,{good[3:]}"}, b"{}", now=now)


@pytest.mark.clause("DELIV-8")
@pytest.mark.parametrize(("change", "said"), [
    ({"webhook-id": None}, "missing header webhook-id"),
    ({"webhook-timestamp": None}, "missing header webhook-timestamp"),
    ({"webhook-signature": None}, "missing header webhook-signature"),
    ({"webhook-timestamp": "hello"}, "malformed webhook-timestamp"),
    ({"webhook-timestamp": "-1700000000"}, "malformed webhook-timestamp"),
    ({"webhook-id": "msg.1"}, "malformed webhook-id"),
])
def test_a_message_without_its_three_headers_or_with_a_malformed_one_is_refused(
        change: dict[str, str | None], said: str) -> None:
    """DELIV-8: each header is required and read strictly; the refusal says which."""
    headers: dict[str, str] = sign_headers(KEY, "msg_1", 1_700_000_000, b"{}")
    for name, value in change.items():
        headers.pop(name)
        if value is not None:
            headers[name] = value
    with pytest.raises(WebhookVerificationError, match=said):
        verify(KEY, headers, b"{}", now=datetime.fromtimestamp(1_700_000_000, UTC))


@pytest.mark.clause("DELIV-8")
def test_a_timestamp_more_than_five_minutes_from_the_receivers_clock_is_refused() -> None:
    """DELIV-8: replay protection: 5 minutes either way, as the reference libraries."""
    headers = sign_headers(KEY, "msg_1", 1_700_000_000, b"{}")
    at = datetime.fromtimestamp(1_700_000_000, UTC)
    verify(KEY, headers, b"{}", now=at + timedelta(seconds=300))
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(KEY, headers, b"{}", now=at + timedelta(seconds=301))
    with pytest.raises(WebhookVerificationError, match="in the future"):
        verify(KEY, headers, b"{}", now=at - timedelta(seconds=301))


@pytest.mark.clause("DELIV-8")
@pytest.mark.parametrize(("text", "said"), [
    ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with whsec_"),
    ("whsec_not base64!", "standard base64"),
    ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS", "standard base64"),  # a padding error
    ("whsec_" + base64.b64encode(b"short").decode(), "24 to 64 bytes"),
    ("whsec_" + base64.b64encode(bytes(65)).decode(), "24 to 64 bytes"),
    ("whsec_" + base64.urlsafe_b64encode(b"\xfb" * 30).decode(), "standard base64"),  # base64url, not base64
])
def test_a_secret_is_whsec_and_the_standard_base64_of_24_to_64_bytes_and_a_refusal_never_shows_it(
        text: str, said: str) -> None:
    """DELIV-8: a malformed secret is a ``ValueError`` saying what is wrong, never the value."""
    with pytest.raises(ValueError, match=said) as refused:
        parse_secret(text)
    assert text.removeprefix("whsec_")[:8] not in str(refused.value)
    assert parse_secret(format_secret(KEY)) == KEY


# -- DELIV-9: the webhook channel, end to end ------------------------------------------------


@pytest.mark.clause("DELIV-9")
@pytest.mark.clause("DELIV-17")
def test_a_signed_webhook_is_one_post_of_the_notifications_json_that_the_receiver_verifies() -> None:
    """DELIV-9: one POST of compact JSON (type, id, user, community, kind, title, body,
    created_at) with ``webhook-id`` the idempotency key, ``webhook-timestamp`` the clock's
    second and a signature this test checks with its own HMAC; DELIV-17: the local receiver
    verified it too."""
    clock = ManualClock(NOW)

    async def scenario() -> None:
        async with LocalWebhookReceiver(format_secret(KEY), clock=clock) as receiver, production_client() as client:
            sender = WebhookSender(receiver.url, client=client, clock=clock, timeout=5.0, retry_after_cap=60.0,
                                   secret=KEY)
            assert await sender.send(delivery()) == Delivered(status=204, answer="")
            [got] = receiver.received
            assert got.accepted
            assert got.payload == {"type": "notification.sent", "id": "n-42", "user_id": "anna",
                                   "community_id": "sunny-street", "kind": "commitment_reminder",
                                   "title": "Reminder: run the dishwasher",
                                   "body": "At noon, when the sun is out \u2600",
                                   "created_at": "2026-05-04T09:25:00+00:00"}
            assert got.body == webhook_body(delivery()) and b'", "' not in got.body and b'": ' not in got.body
            assert got.headers["content-type"] == "application/json"
            assert got.headers["webhook-id"] == "dlv_01HX"
            assert got.headers["webhook-timestamp"] == str(int(NOW.timestamp()))
            assert got.headers["webhook-signature"] == independent_signature(
                KEY, "dlv_01HX", got.headers["webhook-timestamp"], got.body)

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-9")
def test_every_attempt_carries_the_same_webhook_id_and_its_own_timestamp() -> None:
    """DELIV-9: a retried delivery is the same message (``webhook-id``) at a later time, signed anew."""
    clock = ManualClock(NOW)

    async def scenario() -> None:
        async with LocalWebhookReceiver(KEY, clock=clock) as receiver, production_client() as client:
            receiver.answer(Reply.of(503, "try later", retry_after="30"))
            sender = WebhookSender(receiver.url, client=client, clock=clock, timeout=5.0, retry_after_cap=60.0,
                                   secret=KEY)
            assert await sender.send(delivery()) == Retry(reason="HTTP 503: try later", retry_after=30.0)
            clock.advance(timedelta(seconds=31))
            assert isinstance(await sender.send(delivery(attempt_number=2)), Delivered)
            first, second = receiver.received
            assert first.headers["webhook-id"] == second.headers["webhook-id"] == "dlv_01HX"
            assert int(second.headers["webhook-timestamp"]) - int(first.headers["webhook-timestamp"]) == 31
            assert first.body == second.body and first.accepted and second.accepted

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-9")
@pytest.mark.clause("DELIV-17")
def test_without_a_secret_the_webhook_is_unsigned_and_a_receiver_that_wants_one_refuses_it() -> None:
    """DELIV-9: no secret, no ``webhook-signature`` (the id and timestamp still go); DELIV-17:
    a receiver holding a secret answers 401, which the sender records as undeliverable."""
    clock = ManualClock(NOW)

    async def scenario() -> None:
        async with LocalWebhookReceiver(KEY, clock=clock) as receiver, production_client() as client:
            sender = WebhookSender(receiver.url, client=client, clock=clock, timeout=5.0, retry_after_cap=60.0)
            result = await sender.send(delivery())
            assert isinstance(result, Undeliverable) and result.reason.startswith("HTTP 401")
            [got] = receiver.received
            assert "webhook-signature" not in got.headers and got.headers["webhook-id"] == "dlv_01HX"
            assert got.problems == ("missing header webhook-signature",)

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-9")
def test_an_idempotency_key_that_cannot_be_a_webhook_id_is_undeliverable_without_a_request() -> None:
    """DELIV-9: a ``.`` in the key would make the signed content ambiguous: nothing is sent."""
    async def scenario() -> None:
        async with LocalWebhookReceiver(KEY) as receiver, production_client() as client:
            sender = WebhookSender(receiver.url, client=client, clock=ManualClock(NOW), timeout=5.0,
                                   retry_after_cap=60.0, secret=KEY)
            result = await sender.send(delivery(key="dlv.1"))
            assert isinstance(result, Undeliverable) and "webhook-id" in result.reason
            assert receiver.received == []

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-9")
def test_the_sender_never_shows_its_secret() -> None:
    """DELIV-9: a sender in a log line names its URL and whether it signs, not the key."""
    sender = WebhookSender("https://hooks.example/in", client=production_client(), clock=ManualClock(NOW),
                           timeout=5.0, retry_after_cap=60.0, secret=KEY)
    shown = repr(sender)
    assert "signed=True" in shown and format_secret(KEY)[6:14] not in shown and str(KEY) not in shown


# -- DELIV-6: one POST ---------------------------------------------------------------------


@pytest.mark.clause("DELIV-6")
def test_a_provider_that_never_answers_is_a_retry_after_the_per_send_timeout() -> None:
    """DELIV-6: the timeout bounds the whole exchange: a hanging receiver is a ``Retry``."""
    async def scenario() -> None:
        async with LocalWebhookReceiver() as receiver, production_client() as client:
            receiver.answer(HANG)
            sender = WebhookSender(receiver.url, client=client, clock=ManualClock(NOW), timeout=0.2,
                                   retry_after_cap=60.0)
            assert await sender.send(delivery()) == Retry(reason="timeout: no answer within 0.2 s")

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-6")
def test_a_redirect_is_not_followed() -> None:
    """DELIV-6: a 307 to another URL is answered ``Undeliverable``; no second request is made."""
    async def scenario() -> None:
        async with LocalWebhookReceiver() as receiver, production_client() as client:
            receiver.answer(Reply.of(307, headers={"Location": receiver.url + "/elsewhere"}))
            sender = WebhookSender(receiver.url, client=client, clock=ManualClock(NOW), timeout=5.0,
                                   retry_after_cap=60.0)
            result = await sender.send(delivery())
            assert isinstance(result, Undeliverable) and "/hooks/elsewhere" in result.reason
            assert len(receiver.received) == 1

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.clause("DELIV-6")
@pytest.mark.parametrize("client_of", [production_client, httpx.AsyncClient], ids=["production", "httpx"])
def test_nobody_listening_is_a_retry_naming_the_connection_error(client_of: Any) -> None:
    """DELIV-6: a refused connection is a ``Retry`` (the receiver may be restarting), with the
    production client and with an httpx client alike."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> None:
        async with client_of() as client:
            result = await http.post(client, f"http://127.0.0.1:{port}/hooks", content=b"{}", headers={},
                                     timeout=5.0, clock=ManualClock(NOW), retry_after_cap=60.0)
            assert isinstance(result, Retry) and result.reason.startswith("connection error: ConnectError")

    asyncio.run(asyncio.wait_for(scenario(), 30))


class EndlessBody(httpx.AsyncByteStream):
    """A provider whose answer never ends (a fake at the edge)."""

    def __init__(self) -> None:
        self.chunks = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.chunks += 1
            yield b"a" * 1024


@pytest.mark.clause("DELIV-6")
def test_only_the_start_of_an_answer_is_read_however_long_it_is() -> None:
    """DELIV-6: an endless 200 answer is ``Delivered`` at once, after a few KiB were read, and
    asks for no compression (what is read is what was sent)."""
    stream = EndlessBody()
    seen: list[httpx.Request] = []

    def provider(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=stream)

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as client:
            result = await http.post(client, "https://hooks.example/in", content=b"{}",
                                     headers={"content-type": "application/json"}, timeout=5.0,
                                     clock=ManualClock(NOW), retry_after_cap=60.0)
            assert result == Delivered(status=200, answer="a" * 199 + "\u2026")

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert 1 <= stream.chunks <= http.ANSWER_BYTES // 1024 + 1
    assert seen[0].headers["accept-encoding"] == "identity" and seen[0].content == b"{}"


@pytest.mark.clause("DELIV-9")
def test_the_webhook_body_is_compact_utf8_json_of_exactly_the_listed_fields() -> None:
    """DELIV-9: no space, non-ASCII as UTF-8; a notification without a community says null."""
    plain = OutboundDelivery(delivery_id="d", idempotency_key="k", channel="webhook", notification_id="n",
                             user_id="u", community_id=None, kind="k", title="t\u00e9", body="b",
                             created_at=NOW)
    assert webhook_body(plain) == ('{"type":"notification.sent","id":"n","user_id":"u","community_id":null,'
                                   '"kind":"k","title":"t\u00e9","body":"b","created_at":"2026-05-04T09:30:00+00:00"}'
                                   ).encode()
    assert json.loads(webhook_body(plain))["title"] == "t\u00e9"


# -- DELIV-18: the production client ---------------------------------------------------------


def _post(client: http.HttpClient, url: str, n: int = 0) -> Any:
    return http.post(client, url, content=b'{"n": %d}' % n, headers={"content-type": "application/json"},
                     timeout=5.0, clock=ManualClock(NOW), retry_after_cap=60.0)


@pytest.mark.clause("DELIV-18")
@pytest.mark.clause("DEC-DELIVERY-HTTP")
def test_the_production_client_keeps_its_connections_alive_one_per_send_slot() -> None:
    """DELIV-18: 40 sends, 4 at a time, to a provider that keeps connections alive are all
    delivered over at most 4 connections (one per slot), each asking for no compression."""
    seen: list[Request] = []

    async def provider(request: Request) -> Reply:
        seen.append(request)
        await asyncio.sleep(0.01)  # an answer that takes a moment: the four slots overlap
        return Reply.of(204)

    async def scenario() -> int:
        async with LoopbackServer(provider, keep_alive=True) as server, http.DeliveryHttp(4) as client:
            slots = asyncio.Semaphore(4)

            async def one(n: int) -> Any:
                async with slots:
                    return await _post(client, server.url + "/hooks", n)

            results = await asyncio.gather(*(one(n) for n in range(40)))
            assert results == [Delivered(status=204, answer="")] * 40
            return server.accepted

    accepted = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert 1 <= accepted <= 4
    assert sorted(r.body for r in seen) == sorted(b'{"n": %d}' % n for n in range(40))
    assert {r.headers["accept-encoding"] for r in seen} == {"identity"}


@pytest.mark.clause("DELIV-18")
def test_an_answer_past_the_bound_is_cut_and_its_connection_is_not_used_again() -> None:
    """DELIV-18: an 8 MiB answer is read to its first 4 KiB and its connection closed (the
    rest still on the wire would be read as the next answer); the next send opens another
    connection and is delivered."""
    answers = [Reply.of(200, "a" * (8 << 20)), Reply.of(204)]

    async def provider(request: Request) -> Reply:
        return answers.pop(0)

    async def scenario() -> int:
        async with LoopbackServer(provider, keep_alive=True) as server, http.DeliveryHttp(4) as client:
            assert await _post(client, server.url) == Delivered(status=200, answer="a" * 199 + "\u2026")
            assert await _post(client, server.url) == Delivered(status=204, answer="")
            return server.accepted

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == 2


@pytest.mark.clause("DELIV-18")
def test_one_production_client_sends_from_one_event_loop_after_another() -> None:
    """DELIV-18: the client keeps a session per event loop, so a client that sent from one
    ``asyncio.run`` sends from the next (a service restarted, a test's steps)."""
    client = http.DeliveryHttp(2)

    async def once() -> Any:
        async with LocalWebhookReceiver() as receiver:
            return await _post(client, receiver.url)

    assert asyncio.run(asyncio.wait_for(once(), 30)) == Delivered(status=204, answer="")
    assert asyncio.run(asyncio.wait_for(once(), 30)) == Delivered(status=204, answer="")


@pytest.mark.clause("DELIV-18")
@pytest.mark.parametrize("url", ["ftp://hooks.example/in", "http:///no-host", "hooks.example/in"])
def test_a_url_the_production_client_cannot_use_is_undeliverable_without_a_request(url: str) -> None:
    """DELIV-18: a URL that is not http or https, or has no host, is ``Undeliverable`` naming it."""
    async def scenario() -> Any:
        async with http.DeliveryHttp(1) as client:
            return await _post(client, url)

    result = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert isinstance(result, Undeliverable) and result.reason.startswith("the URL cannot be used")


@pytest.mark.clause("DELIV-18")
def test_the_environments_proxy_carries_a_send_unless_no_proxy_names_the_host(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """DELIV-18: with ``HTTP_PROXY`` set when the client is made, a send to another host goes
    to the proxy (the absolute URL as its target); a host that ``NO_PROXY`` names is sent to
    directly."""
    targets: list[str] = []

    async def proxy(request: Request) -> Reply:
        targets.append(request.target)
        return Reply.of(202)

    async def scenario() -> tuple[Any, Any, list[int]]:
        async with LoopbackServer(proxy) as server, LocalWebhookReceiver() as receiver:
            monkeypatch.setenv("HTTP_PROXY", server.url)
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            for name in ("http_proxy", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
                monkeypatch.delenv(name, raising=False)
            async with http.DeliveryHttp(2) as client:
                proxied = await _post(client, "http://hooks.example/in")
                direct = await _post(client, receiver.url)
            return proxied, direct, [r.status for r in receiver.received]

    proxied, direct, received = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert proxied == Delivered(status=202, answer="") and targets == ["http://hooks.example/in"]
    assert direct == Delivered(status=204, answer="") and received == [204]
