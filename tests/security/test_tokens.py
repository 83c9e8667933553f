"""SEC-2, SEC-4 to SEC-8: which tokens the service accepts, against a real database."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.web.app import SchedulerService
from tests.conftest import TEST_SECRET
from tests.security.support import (
    auth,
    claims,
    hs256,
    other_rsa_private_key,
    public_pem,
    rs256,
    unsigned,
)

ADMIN_ROUTE = "/admin/notifications"


def _status(client: TestClient, token: str) -> int:
    status: int = client.get(ADMIN_ROUTE, headers=auth(token)).status_code
    return status


def _refused(client: TestClient, token: str) -> str:
    """Assert a 401 with a Bearer challenge; return the detail."""
    response = client.get(ADMIN_ROUTE, headers=auth(token))
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    detail: str = response.json()["detail"]
    return detail


@pytest.fixture
def rsa_client(engine: Engine, clock: ManualClock) -> Iterator[TestClient]:
    """A service that verifies RS256 tokens with a public key (no shared secret)."""
    settings = Settings(jwt_public_key=public_pem(), jwt_secret=None)
    service = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    with TestClient(service.app) as client:
        yield client


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hmac_token(payload: dict[str, Any], key: bytes) -> str:
    """An HS256 token made by hand, as an attacker would (PyJWT refuses a PEM as an HMAC key)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(payload).encode())
    signature = hmac.new(key, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64(signature)}"


@pytest.mark.clause("SEC-2")
@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer    ", "Token abc", "bearer not-a-jwt"])
def test_a_malformed_authorization_header_is_401(client: TestClient, header: str) -> None:
    """SEC-2: anything but ``Bearer <valid token>`` is a 401 with a JSON detail."""
    response = client.get(ADMIN_ROUTE, headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["detail"]


@pytest.mark.clause("SEC-2")
@pytest.mark.parametrize("garbage", ["not-a-jwt", "a.b.c", "_-8.x.y", "eyJhbGciOiJIUzI1NiJ9.%%%.x"])
def test_a_garbage_token_is_called_malformed_without_decoder_internals(client: TestClient, garbage: str) -> None:
    """SEC-2: a bearer value that is not a JWT at all is a 401 "malformed token", not a codec
    error (``_-8`` decodes to bytes that are not UTF-8)."""
    detail = _refused(client, garbage)
    assert detail.startswith("malformed token"), detail
    assert "codec" not in detail and "padding" not in detail


@pytest.mark.clause("SEC-2")
def test_the_console_sign_in_also_calls_a_garbage_token_malformed(client: TestClient) -> None:
    """SEC-2: the console's sign-in form gives the same answer as the API for a non-JWT."""
    page = client.get("/console/sign-in")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce, page.text
    answer = client.post("/console/sign-in", data={"nonce": nonce[1], "token": "_-8.x.y", "next": "/console"},
                         follow_redirects=False)
    assert answer.status_code == 401
    assert "malformed token" in answer.text and "codec" not in answer.text


@pytest.mark.clause("SEC-4")
def test_a_valid_admin_token_gets_in(client: TestClient) -> None:
    """SEC-4: the control for every refusal below: the same claims, properly signed, pass."""
    assert _status(client, hs256(claims())) == 200


@pytest.mark.clause("SEC-4")
def test_a_token_with_alg_none_is_401(client: TestClient) -> None:
    """SEC-4: an unsigned token is never accepted, whatever its claims."""
    assert "invalid token" in _refused(client, unsigned(claims()))


@pytest.mark.clause("SEC-4")
def test_a_token_signed_with_another_secret_is_401(client: TestClient) -> None:
    """SEC-4: the signature must verify with the configured secret."""
    assert "Signature verification failed" in _refused(client, hs256(claims(), secret=TEST_SECRET + "-other"))


@pytest.mark.clause("SEC-4")
def test_an_hs256_token_made_with_the_rsa_public_key_is_401(rsa_client: TestClient) -> None:
    """SEC-4: the classic confusion: HMAC keyed with the (public) RSA key is not an RS256 signature."""
    assert rsa_client.get(ADMIN_ROUTE, headers=auth(rs256(claims()))).status_code == 200  # control
    forged = _hmac_token(claims(), public_pem().encode())
    assert "alg value is not allowed" in _refused(rsa_client, forged)


@pytest.mark.clause("SEC-4")
def test_an_rs256_token_is_401_on_an_hs256_service(client: TestClient) -> None:
    """SEC-4: a service configured with a secret accepts HS256 only."""
    assert "alg value is not allowed" in _refused(client, rs256(claims()))


@pytest.mark.clause("SEC-4")
def test_an_rs256_service_accepts_its_key_and_refuses_another(rsa_client: TestClient) -> None:
    """SEC-4: another RSA key's signature, an HS256 token and alg none all fail on an RS256 service."""
    assert rsa_client.get(ADMIN_ROUTE, headers=auth(rs256(claims()))).status_code == 200
    _refused(rsa_client, rs256(claims(), key=other_rsa_private_key()))
    _refused(rsa_client, hs256(claims()))
    _refused(rsa_client, unsigned(claims()))


@pytest.mark.clause("SEC-5")
def test_an_expired_token_is_401(client: TestClient) -> None:
    """SEC-5: ``exp`` in the past."""
    token = hs256(claims(exp=claims()["iat"] - 1, iat=claims()["iat"] - 3600, nbf=claims()["iat"] - 3600))
    assert "expired" in _refused(client, token)


@pytest.mark.clause("SEC-5")
def test_a_token_not_yet_valid_is_401(client: TestClient) -> None:
    """SEC-5: ``nbf`` in the future."""
    assert "not yet valid" in _refused(client, hs256(claims(nbf=claims()["iat"] + 600)))


@pytest.mark.clause("SEC-5")
def test_a_token_without_exp_is_401(client: TestClient) -> None:
    """SEC-5: a token that never expires is not accepted."""
    assert "exp" in _refused(client, hs256(claims(exp=None)))


@pytest.mark.clause("SEC-5")
def test_token_times_are_judged_by_the_verifiers_clock_and_malformed_times_are_refused() -> None:
    """SEC-5: exp, nbf and iat are checked against the verifier's injected clock (production's is
    the database's), never the host's: a token minted by that clock is valid until its exp and
    expired at it, its remaining life is read from the same clock; a token from that clock's
    future is not yet valid; a time claim that is not a whole number is refused as invalid."""
    from datetime import UTC, datetime, timedelta

    import jwt as pyjwt

    from scheduler.web.auth import TokenVerifier, mint_token

    far = ManualClock(datetime(2031, 5, 1, 12, 0, tzinfo=UTC))  # years from the host's now
    verifier = TokenVerifier(Settings(jwt_secret=TEST_SECRET), clock=far)
    token = mint_token(TEST_SECRET, scope="nudging.admin", ttl_seconds=60, clock=far)
    verified = verifier.verify(token)
    assert verified["iat"] == int(far.now().timestamp()) and verifier.seconds_left(verified) == 60
    far.advance(timedelta(seconds=59))
    assert verifier.seconds_left(verifier.verify(token)) == 1
    far.advance(timedelta(seconds=1))
    with pytest.raises(pyjwt.ExpiredSignatureError):
        verifier.verify(token)
    early = TokenVerifier(Settings(jwt_secret=TEST_SECRET), clock=ManualClock(datetime(2031, 5, 1, tzinfo=UTC)))
    with pytest.raises(pyjwt.ImmatureSignatureError, match=r"not yet valid \((iat|nbf)\)"):
        early.verify(token)
    wall = TokenVerifier(Settings(jwt_secret=TEST_SECRET))  # the claims below are valid for the host's now
    wall.verify(hs256(claims()))
    for name in ("exp", "nbf", "iat"):
        with pytest.raises(pyjwt.InvalidTokenError, match="must be an integer"):
            wall.verify(hs256(claims(**{name: "soon"})))


@pytest.mark.clause("SEC-6")
@pytest.mark.parametrize("audience", ["another-service", ["another-service"], None])
def test_a_token_for_another_audience_is_401(client: TestClient, audience: Any) -> None:
    """SEC-6: the audience must be svc-nudging (SCHEDULER_JWT_AUDIENCE); none at all is refused too."""
    token = hs256(claims(aud=audience)) if audience is not None else hs256(claims(aud=None))
    assert "aud" in _refused(client, token).lower()


@pytest.mark.clause("SEC-6")
def test_a_configured_issuer_is_required_and_checked(engine: Engine, clock: ManualClock) -> None:
    """SEC-6: with SCHEDULER_JWT_ISSUER set, only tokens from that issuer pass."""
    settings = Settings(jwt_secret=TEST_SECRET, jwt_issuer="https://idp.example/realm")
    service = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    with TestClient(service.app) as client:
        assert _status(client, hs256(claims(iss="https://idp.example/realm"))) == 200
        assert "iss" in _refused(client, hs256(claims(iss="https://evil.example/realm"))).lower()
        assert "iss" in _refused(client, hs256(claims())).lower()


@pytest.mark.clause("SEC-7")
def test_a_token_without_sub_is_401(client: TestClient) -> None:
    """SEC-7: who is calling must be named."""
    assert "sub" in _refused(client, hs256(claims(sub=None)))


@pytest.mark.clause("SEC-8")
@pytest.mark.parametrize(
    "scope", ["nudging.admin", "nudging.ingest nudging.admin", ["nudging.admin"], ["other", "nudging.admin"]]
)
def test_scopes_as_a_space_separated_string_and_as_a_list_both_work(client: TestClient, scope: Any) -> None:
    """SEC-8: ``scope`` may be a space-separated string or a list of strings."""
    assert _status(client, hs256(claims(scope=scope))) == 200


@pytest.mark.clause("SEC-8")
@pytest.mark.parametrize(
    "scope", ["nudging", "nudging.admin.extra", "NUDGING.ADMIN", "nudging.admin,nudging.ingest", 42, {"a": 1}, [1, 2], ""]
)
def test_unknown_or_malformed_scopes_grant_nothing(client: TestClient, scope: Any) -> None:
    """SEC-8: a valid token whose scopes name no permission is 403 (authenticated, not allowed)."""
    response = client.get(ADMIN_ROUTE, headers=auth(hs256(claims(scope=scope))))
    assert response.status_code == 403
    assert response.json()["detail"] == "missing permission: nudging.admin (admin)"
