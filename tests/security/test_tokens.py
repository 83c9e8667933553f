"""SEC-2, SEC-4 to SEC-8 (SEC-7.1 included): which tokens the service accepts, against a real database."""

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
from scheduler.service import SchedulerService
from tests.conftest import TEST_SECRET
from tests.helpers import event_body, post_event, rows
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
    # past the verifier's leeway (SCHEDULER_JWT_LEEWAY_SECONDS, 60 s): SEC-5.1 pins the boundary
    token = hs256(claims(exp=claims()["iat"] - 61, iat=claims()["iat"] - 3600, nbf=claims()["iat"] - 3600))
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
    future is not yet valid; a time claim that is not a number is refused as invalid."""
    from datetime import UTC, datetime, timedelta

    import jwt as pyjwt

    from scheduler.web.http.auth import TokenVerifier, mint_token

    far = ManualClock(datetime(2031, 5, 1, 12, 0, tzinfo=UTC))  # years from the host's now
    # no leeway, so that the times are exact here (SEC-5.1 proves the leeway)
    verifier = TokenVerifier(Settings(jwt_secret=TEST_SECRET, jwt_leeway_seconds=0), clock=far)
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
        with pytest.raises(pyjwt.InvalidTokenError, match="must be a NumericDate"):
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


# Subjects no column can hold (SEC-7.1): the columns that store a subject are 200 characters of
# PostgreSQL text (no NUL, valid Unicode); an empty one names no one.
UNSTORABLE_SUBJECTS = {"lone-surrogate": "\ud800", "low-surrogate": "op-\udfff", "nul": "op\x00erator",
                       "201-characters": "s" * 201, "empty": ""}


def _refused_everywhere_it_is_recorded(client: TestClient, engine: Engine, subject: str) -> dict[str, Any]:
    """Each route that records (or reads by) the subject, sent an otherwise valid request with a
    token for ``subject``: its status and detail, by route."""
    event = post_event(client, external_key="k-subject")
    admin, participant = hs256(claims(sub=subject)), hs256(claims(sub=subject, scope=None))
    answers = {
        "POST /admin/scheduled-events": client.post("/admin/scheduled-events", headers=auth(admin),
                                                    json=event_body(user_id="another")),
        "POST /admin/scheduled-events/bulk": client.post("/admin/scheduled-events/bulk", headers=auth(admin),
                                                          json=[event_body(user_id="batched")]),
        "POST /admin/scheduled-events/{id}/reset": client.post(f"/admin/scheduled-events/{event['id']}/reset",
                                                               headers=auth(admin)),
        "DELETE /admin/scheduled-events/{id}": client.delete(f"/admin/scheduled-events/{event['id']}",
                                                             headers=auth(admin)),
        "DELETE /admin/scheduled-events/by-key/{key}": client.delete("/admin/scheduled-events/by-key/k-subject",
                                                                     headers=auth(admin)),
        "GET /me/notifications": client.get("/me/notifications", headers=auth(participant)),
        "POST /inbox/session": client.post("/inbox/session", json={"token": participant}),
    }
    found: dict[str, Any] = {}
    for route, response in answers.items():
        assert response.status_code == 401, (route, response.status_code, response.text)
        detail = response.json()["detail"]
        assert detail.startswith("invalid token: the subject claim (sub)"), (route, detail)
        found[route] = detail
        if route != "POST /inbox/session":
            assert response.headers["www-authenticate"].startswith("Bearer"), route
    page = client.get("/console/sign-in")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce, page.text
    console = client.post("/console/sign-in", data={"nonce": nonce[1], "token": admin, "next": "/console"},
                          follow_redirects=False)
    assert console.status_code == 401 and "the subject claim (sub)" in console.text, console.text
    # nothing was stored or changed under that subject
    assert [r["status"] for r in rows(engine, "SELECT status FROM scheduled_events")] == ["pending"]
    assert rows(engine, "SELECT id FROM operator_actions") == []
    assert rows(engine, "SELECT id FROM web_sessions") == []
    return found


@pytest.mark.clause("SEC-7.1")
@pytest.mark.parametrize("subject", UNSTORABLE_SUBJECTS.values(), ids=UNSTORABLE_SUBJECTS.keys())
def test_a_subject_that_cannot_be_stored_makes_the_token_invalid_on_every_route_that_records_it(
    service: SchedulerService, engine: Engine, subject: str
) -> None:
    """SEC-7.1: a signed token whose sub is an unpaired surrogate, holds a NUL, is longer than
    200 characters or is empty is a 401 naming the claim, in the shape of every other refused
    token, on each route that records the subject (POST, batch, reset, both cancels,
    /me/notifications, the inbox's and the console's sign-in): never a 500, never a 422 that
    blames the body, and nothing is stored under it."""
    with TestClient(service.app, raise_server_exceptions=False) as client:
        details = _refused_everywhere_it_is_recorded(client, engine, subject)
    assert len(set(details.values())) == 1, details  # one verifier, one sentence


@pytest.mark.clause("SEC-7.1")
@pytest.mark.parametrize("subject", UNSTORABLE_SUBJECTS.values(), ids=UNSTORABLE_SUBJECTS.keys())
def test_a_token_with_an_unstorable_subject_is_401_on_every_bearer_route(
    service: SchedulerService, subject: str
) -> None:
    """SEC-7.1: the subject is checked where the token is verified, so every bearer-protected
    route of the table refuses such a token alike, before its body is read."""
    from tests.security.support import spec_table

    protected = [e for e in spec_table() if e.permission in {"ingest", "admin", "participant"}]
    token = hs256(claims(sub=subject, scope="nudging.admin"))
    with TestClient(service.app, raise_server_exceptions=False) as client:
        for entry in protected:
            kwargs: dict[str, Any] = {"json": {}} if entry.method in {"POST", "PUT"} else {}
            response = client.request(entry.method, entry.concrete_path(), headers=auth(token), **kwargs)
            assert response.status_code == 401, (entry, response.text)
            assert "subject claim (sub)" in response.json()["detail"], entry


@pytest.mark.clause("SEC-7.1")
@pytest.mark.parametrize("subject", ["s" * 201, "", "op\x00erator"], ids=["201-characters", "empty", "nul"])
def test_scheduler_token_refuses_to_mint_a_subject_the_service_would_refuse(
    subject: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SEC-7.1: ``scheduler token --sub`` with a subject that cannot be stored mints nothing:
    one sentence naming --sub and the claim on stderr, exit 2."""
    from scheduler.cli import main

    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["token", "--sub", subject]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("scheduler token: --sub: the subject claim (sub) "), captured.err


@pytest.mark.clause("SEC-7.1")
def test_a_subject_of_200_characters_of_real_unicode_is_accepted_and_recorded_as_sent(
    client: TestClient, engine: Engine
) -> None:
    """SEC-7.1: the control: the longest storable subject, in letters beyond ASCII and an emoji
    (a surrogate pair in JSON), is accepted and recorded exactly as it was sent."""
    subject = ("opérateur-日本-😀-" * 20)[:200]
    assert len(subject) == 200
    event = post_event(client)
    reset = client.post(f"/admin/scheduled-events/{event['id']}/reset", headers=auth(hs256(claims(sub=subject))))
    assert reset.status_code in {200, 409}, reset.text
    cancel = client.delete(f"/admin/scheduled-events/{event['id']}", headers=auth(hs256(claims(sub=subject))))
    assert cancel.status_code == 200, cancel.text
    assert [r["actor"] for r in rows(engine, "SELECT actor FROM operator_actions WHERE action = 'cancel'")] == [subject]
    signed_in = client.post("/inbox/session", json={"token": hs256(claims(sub=subject, scope=None))})
    assert signed_in.status_code == 201 and signed_in.json()["subject"] == subject


@pytest.mark.clause("SEC-8")
@pytest.mark.parametrize(
    "scope", ["nudging.admin", "nudging.ingest nudging.admin", ["nudging.admin"], ["other", "nudging.admin"]]
)
def test_scopes_as_a_space_separated_string_and_as_a_list_both_work(client: TestClient, scope: Any) -> None:
    """SEC-8: ``scope`` may be a space-separated string or a list of strings."""
    assert _status(client, hs256(claims(scope=scope))) == 200


@pytest.mark.clause("SEC-8")
@pytest.mark.parametrize(
    "scope",
    ["nudging", "nudging.admin.extra", "NUDGING.ADMIN", "nudging.admin,nudging.ingest", 42, {"a": 1}, [1, 2], ""],
)
def test_unknown_or_malformed_scopes_grant_nothing(client: TestClient, scope: Any) -> None:
    """SEC-8: a valid token whose scopes name no permission is 403 (authenticated, not allowed)."""
    response = client.get(ADMIN_ROUTE, headers=auth(hs256(claims(scope=scope))))
    assert response.status_code == 403
    assert response.json()["detail"] == "missing permission: nudging.admin (admin)"


@pytest.mark.clause("SEC-5.1")
def test_token_times_are_judged_with_the_configured_leeway() -> None:
    """SEC-5.1: clocks differ by seconds (an identity provider's, the database's): with the default
    60 s leeway a token is valid until 60 s past its exp and from 60 s before its nbf and iat, and
    not a moment beyond; SCHEDULER_JWT_LEEWAY_SECONDS=0 judges them exactly."""
    from datetime import UTC, datetime, timedelta

    import jwt as pyjwt

    from scheduler.web.http.auth import TokenVerifier

    start = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
    at = int(start.timestamp())
    clock = ManualClock(start)
    lenient = TokenVerifier(Settings(jwt_secret=TEST_SECRET), clock=clock)
    exact = TokenVerifier(Settings(jwt_secret=TEST_SECRET, jwt_leeway_seconds=0), clock=clock)
    assert lenient.leeway_seconds == 60
    expiring = hs256(claims(iat=at - 600, nbf=at - 600, exp=at))
    clock.set(start + timedelta(seconds=59))
    lenient.verify(expiring)
    with pytest.raises(pyjwt.ExpiredSignatureError):
        exact.verify(expiring)
    clock.set(start + timedelta(seconds=60))
    with pytest.raises(pyjwt.ExpiredSignatureError):
        lenient.verify(expiring)
    for name in ("nbf", "iat"):
        clock.set(start)
        early = hs256(claims(**{"iat": at, "nbf": at, "exp": at + 600, name: at + 60}))
        lenient.verify(early)  # 60 s in this clock's future: within the leeway
        with pytest.raises(pyjwt.ImmatureSignatureError, match=name):
            exact.verify(early)
        clock.set(start - timedelta(microseconds=1))
        with pytest.raises(pyjwt.ImmatureSignatureError, match=name):
            lenient.verify(early)


def _console_sign_in(client: TestClient, token: str) -> int:
    page = client.get("/console/sign-in")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce, page.text
    answer = client.post("/console/sign-in", data={"nonce": nonce[1], "token": token, "next": "/console"},
                         follow_redirects=False)
    status: int = answer.status_code
    return status


def _inbox_sign_in(client: TestClient, token: str) -> int:
    status: int = client.post("/inbox/session", json={"token": token}).status_code
    return status


NOT_NUMERIC_DATES = ["1799999999", "\uff11\uff17\uff19\uff19\uff19\uff19\uff19\uff19\uff19\uff19", True, False,
                     None, [1799999999], {"t": 1799999999}, 10**30, -(10**30)]


@pytest.mark.clause("SEC-5.2")
@pytest.mark.parametrize("name", ["exp", "nbf", "iat"])
@pytest.mark.parametrize("value", NOT_NUMERIC_DATES,
                         ids=["string", "fullwidth-digits", "true", "false", "null", "list", "object", "huge",
                              "huge-negative"])
def test_a_time_claim_that_is_not_a_json_number_is_401_everywhere(
    client: TestClient, name: str, value: Any
) -> None:
    """SEC-5.2: RFC 7519's NumericDate is a JSON number: exp, nbf or iat as a string (even of
    fullwidth digits), a boolean, null, a list, an object or a number past year 9999 is a 401 on
    the API, the console's sign-in and the inbox's sign-in alike."""
    now = claims()["iat"]
    times = {"iat": now, "nbf": now, "exp": now + 600}
    if name != "exp" and isinstance(value, bool | str):
        times["exp"] = now + 600
    token = hs256({**claims(), **times, name: value})
    detail = _refused(client, token)
    assert name in detail
    assert _console_sign_in(client, token) == 401
    participant = hs256({**claims(scope=None, sub="participant-1"), **times, name: value})
    assert _inbox_sign_in(client, participant) == 401


@pytest.mark.clause("SEC-5.2")
def test_time_claims_may_be_fractions(client: TestClient) -> None:
    """SEC-5.2: a NumericDate may carry a fraction of a second: accepted on every sign-in path."""
    now = claims()["iat"]
    times = {"iat": now - 0.5, "nbf": now - 0.25, "exp": now + 600.5}
    assert _status(client, hs256(claims(**times))) == 200
    assert _console_sign_in(client, hs256(claims(**times))) == 303
    assert _inbox_sign_in(client, hs256(claims(scope=None, sub="participant-1", **times))) == 201


@pytest.mark.clause("SEC-5.3")
def test_the_cli_mints_tokens_with_the_database_clock_whatever_the_host_clock_says(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """SEC-5.3: ``scheduler token`` stamps iat, nbf and exp with the clock the service judges them
    by, the configured database's: on a host an hour ahead of the database, the token's iat is the
    database's now, so the service does not find it "not yet valid"."""
    from datetime import timedelta

    import jwt as pyjwt
    from freezegun import freeze_time

    from scheduler.cli import main
    from scheduler.database.engine import database_time
    from scheduler.web.http.auth import TokenVerifier

    before = database_time(engine)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    host = freeze_time(before + timedelta(hours=1))
    host.start()
    try:
        assert main(["token", "--scope", "nudging.admin", "--ttl", "600"]) == 0
    finally:
        host.stop()
    after = database_time(engine)
    minted = capsys.readouterr().out.strip()
    stamped = pyjwt.decode(minted, TEST_SECRET, algorithms=["HS256"], audience="svc-nudging")
    assert int(before.timestamp()) <= stamped["iat"] <= after.timestamp(), (stamped, before, after)
    assert stamped["nbf"] == stamped["iat"] and stamped["exp"] == stamped["iat"] + 600
    judged_by_the_database = TokenVerifier(Settings(jwt_secret=TEST_SECRET, jwt_leeway_seconds=0),
                                           clock=ManualClock(after))
    judged_by_the_database.verify(minted)
