"""PUSH-10: whatever a stranger sends ``PUT``/``DELETE /me/push-subscriptions`` is a 4xx (or,
for a real subscription on an allowed host, stored), never a 500: any JSON, non-ASCII and huge
values, endpoints shaped to reach an internal address (``127.0.0.1``, ``[::1]``,
``169.254.169.254``, the decimal and hex spellings of an address, user-info tricks, look-alike
hosts), bytes that are no JSON or no UTF-8, bodies past the limit. Only ``push.example.test``
is allowed here, so any answer that stores something stored an endpoint on that host, at 443,
without credentials."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.delivery.vapid import VapidKey
from scheduler.service import SchedulerService
from tests.conftest import TEST_SECRET, bearer
from tests.helpers import rows

ROUTE = "/me/push-subscriptions"
HOST = "push.example.test"
CALLER = bearer(None, subject="participant-1")
FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MAX_BODY = 64 * 1024
# RFC 8291 Appendix A's browser key (published test data) and a 16-byte secret
P256DH = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
AUTH = base64.urlsafe_b64encode(b"0123456789abcdef").decode().rstrip("=")


@pytest.fixture
def fuzz_client(engine: Engine, clock: ManualClock) -> Iterator[TestClient]:
    settings_ = Settings(jwt_secret=TEST_SECRET, push_allowed_hosts=HOST, max_body_bytes=MAX_BODY,
                         vapid_private_key=VapidKey.generate().private_key_b64url,
                         vapid_subject="mailto:ops@example.org")
    service = SchedulerService(settings_, engine=engine, clock=clock, run_scheduler=False)
    with TestClient(service.app, raise_server_exceptions=False) as client:
        yield client


def stored_endpoints(engine: Engine) -> list[str]:
    return [r["endpoint"] for r in rows(engine, "SELECT endpoint FROM push_subscriptions")]


def assert_only_allowed_stored(engine: Engine) -> None:
    for endpoint in stored_endpoints(engine):
        parts = urlsplit(endpoint)
        assert (parts.scheme, parts.hostname, parts.port or 443, parts.username) == ("https", HOST, 443, None), endpoint


def put(client: TestClient, body: bytes, content_type: str = "application/json") -> int:
    status: int = client.put(ROUTE, headers=CALLER | {"Content-Type": content_type}, content=body).status_code
    return status


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
HOSTS = st.sampled_from([
    HOST, "127.0.0.1", "[::1]", "169.254.169.254", "[::ffff:169.254.169.254]", "2130706433", "0x7f.0.0.1", "127.1",
    "localhost", "metadata.google.internal", f"{HOST}.evil.example", f"evil.{HOST}", f"{HOST}.", "PUSH.EXAMPLE.TEST",
    "push.ex\u0430mple.test",  # a Cyrillic a
    "xn--push-9ja.example.test", f"{HOST}%2f@127.0.0.1", f"{HOST}\\@127.0.0.1", f"{HOST}#@127.0.0.1",
    f"{HOST}?@127.0.0.1",
])
USERINFO = st.sampled_from(["", "user@", "user:pw@", f"{HOST}@", f"{HOST}:443@", "@", "%40@"])
PORTS = st.sampled_from(["", ":443", ":80", ":8443", ":0", ":65536", ":-1", ":4\uff143", ": 443"])
SCHEMES = st.sampled_from(["https://", "http://", "HTTPS://", "https:/", "https:\\\\", "//", "wss://", "javascript:"])
PATHS = st.text(max_size=60).map(lambda tail: "/push/" + tail)


def subscription_body(endpoint: Any) -> bytes:
    return json.dumps({"endpoint": endpoint, "expirationTime": None, "keys": {"p256dh": P256DH, "auth": AUTH}},
                      ensure_ascii=False).encode()


@pytest.mark.clause("PUSH-10")
@FUZZ
@given(body=JSON)
@example(body={"endpoint": f"https://{HOST}/push/x", "keys": {"p256dh": P256DH, "auth": AUTH},
               "expirationTime": 2**70})
@example(body={"endpoint": f"https://{HOST}/push/" + "é" * 3000, "keys": {"p256dh": P256DH, "auth": AUTH}})
@example(body={"endpoint": f"https://{HOST}/push/x", "keys": {"p256dh": "=" * 88, "auth": "\u0000" * 22}})
@example(body={"endpoint": f"https://{HOST}/push/x", "keys": [P256DH, AUTH]})
def test_any_json_put_is_stored_on_an_allowed_host_or_refused_never_a_500(
    fuzz_client: TestClient, engine: Engine, body: Any
) -> None:
    """PUSH-10: any JSON value as the body: 200/201 only for a subscription on the allowed
    host, else a 4xx naming fields; never a 500."""
    status = put(fuzz_client, json.dumps(body, ensure_ascii=False).encode())
    assert status in {200, 201, 422}, status
    assert_only_allowed_stored(engine)


@pytest.mark.clause("PUSH-10")
@FUZZ
@given(scheme=SCHEMES, userinfo=USERINFO, host=HOSTS, port=PORTS, path=PATHS)
@example(scheme="https://", userinfo="", host="169.254.169.254", port="", path="/latest/meta-data/")
@example(scheme="https://", userinfo=f"{HOST}@", host="127.0.0.1", port=":443", path="/push/x")
@example(scheme="https://", userinfo="", host="[::1]", port="", path="/push/x")
@example(scheme="https://", userinfo="", host="PUSH.EXAMPLE.TEST", port=":443", path="/push/x")
@example(scheme="https://", userinfo="", host="push.ex\u0430mple.test", port="", path="/push/x")
def test_an_endpoint_shaped_to_reach_an_internal_address_is_refused_never_stored(
    fuzz_client: TestClient, engine: Engine, scheme: str, userinfo: str, host: str, port: str, path: str
) -> None:
    """PUSH-10: endpoints built of every scheme, user-info trick, host (internal, look-alike,
    an IP in any spelling), port and a non-ASCII path: stored only when the client that sends
    would reach ``push.example.test`` at 443 over https (a real endpoint of it always is), else
    a 422 naming ``endpoint``."""
    endpoint = f"{scheme}{userinfo}{host}{port}{path}"
    answer = fuzz_client.put(ROUTE, headers=CALLER | {"Content-Type": "application/json"},
                             content=subscription_body(endpoint))
    if answer.status_code in {200, 201}:
        # stored: the client that sends (httpx) and the standard library both read the host
        # as the allowed one, at 443, over https, without credentials
        sent_to = httpx.URL(endpoint)
        assert (sent_to.scheme, sent_to.host, sent_to.port or 443, sent_to.userinfo) == ("https", HOST, 443, b"")
        assert userinfo == "" and host.lower().startswith(HOST)
    else:
        assert answer.status_code == 422, (endpoint, answer.status_code)
        assert [e["field"] for e in answer.json()["errors"]] == ["endpoint"]
    if (scheme, userinfo, host.lower(), port) in {("https://", "", HOST, ""), ("https://", "", HOST, ":443")} and (
            path.isascii() and path.isprintable() and not set(path) & set(" \\#")):
        assert answer.status_code in {200, 201}, answer.text  # a real endpoint of the allowed host is stored
    assert_only_allowed_stored(engine)


@pytest.mark.clause("PUSH-10")
@FUZZ
@given(raw=st.binary(max_size=300),
       content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"]),
       method=st.sampled_from(["PUT", "DELETE"]))
@example(raw=b"\xff\xfe{\x00", content_type="application/json", method="PUT")
@example(raw=b"[" * 5000 + b"]" * 5000, content_type="application/json", method="PUT")
@example(raw=b"[" * 5000 + b"]" * 5000, content_type="application/json", method="DELETE")
@example(raw=b'{"endpoint": 1e999}', content_type="application/json", method="DELETE")
@example(raw=b'{"endpoint": "' + b"a" * 5000 + b'"}', content_type="application/json", method="DELETE")
def test_any_bytes_under_any_content_type_are_a_4xx_or_a_removal_never_a_500(
    fuzz_client: TestClient, engine: Engine, raw: bytes, content_type: str, method: str
) -> None:
    """PUSH-10: bytes that are no JSON, no UTF-8, nested too deeply or of another type: a 4xx
    (415, 422); a DELETE of well-formed JSON naming an endpoint removes at most the caller's."""
    headers = CALLER | ({"Content-Type": content_type} if content_type else {})
    answer = fuzz_client.request(method, ROUTE, headers=headers, content=raw)
    assert answer.status_code < 500, answer.text
    assert answer.status_code in ({200, 201, 415, 422} if method == "PUT" else {200, 415, 422}), answer.status_code
    assert_only_allowed_stored(engine)


@pytest.mark.clause("PUSH-10")
def test_a_body_past_the_limit_is_a_413_before_it_is_parsed(fuzz_client: TestClient, engine: Engine) -> None:
    """PUSH-10: a megabyte of endpoint (past ``SCHEDULER_MAX_BODY_BYTES``) is a 413 for both routes."""
    huge = subscription_body(f"https://{HOST}/push/" + "x" * (1024 * 1024))
    assert put(fuzz_client, huge) == 413
    assert fuzz_client.request("DELETE", ROUTE, headers=CALLER | {"Content-Type": "application/json"},
                               content=huge).status_code == 413
    assert stored_endpoints(engine) == []
