"""INBOX-12, INBOX-13 — the inbox page's session; tests/browser/test_inbox_page.py drives it in Chromium.

In our words: the page posts the token once; the service opens a participant session in the
database and sets an HttpOnly cookie holding only its random id; that cookie reads the
participant's own notifications under /me and nothing else, with a participant's powers
whatever the token was; sign-out (with the session's CSRF token) deletes the session, so the
cookie is refused by every replica; an idle session ends by the service's clock; an admin
sees and ends participant sessions like console ones.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.engine import make_engine
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, token
from tests.helpers import rows
from tests.requirements.test_inbox import deliver, open_stream
from tests.servers import serve

SESSION = "/inbox/session"
ME = "/me/notifications"


def _sign_in(client: TestClient, scope: str | None = None, subject: str = "participant-1") -> dict[str, Any]:
    response = client.post(SESSION, json={"token": token(scope, subject=subject)})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.clause("INBOX-12")
def test_a_token_posted_once_opens_a_session_whose_cookie_reads_the_participants_own_inbox(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """INBOX-12: 201 and an HttpOnly, SameSite=Strict cookie that is not the token; /me answers to it alone."""
    deliver(client, service, "participant-1")
    deliver(client, service, "someone-else")
    participant = token(None, subject="participant-1")
    response = client.post(SESSION, json={"token": participant})
    assert response.status_code == 201
    assert set(response.json()) == {"subject", "expires_at", "idle_seconds", "csrf"}
    assert response.json()["subject"] == "participant-1"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("scheduler_inbox=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/;" in cookie or cookie.endswith("Path=/")
    secret = client.cookies["scheduler_inbox"]
    assert secret != participant and "." not in secret
    [stored] = rows(engine, "SELECT subject, kind, secret_hash FROM web_sessions")
    assert stored == {"subject": "participant-1", "kind": "participant",
                      "secret_hash": hashlib.sha256(secret.encode()).hexdigest()}
    page = client.get(ME)
    assert page.status_code == 200
    assert [n["user_id"] for n in page.json()["items"]] == ["participant-1"]
    assert client.get(SESSION).json()["csrf"] == response.json()["csrf"]


@pytest.mark.clause("INBOX-12")
@pytest.mark.clause("DEC-SESS-1")
def test_the_inbox_cookie_holds_a_participants_powers_only_and_only_under_me(
    client: TestClient, service: SchedulerService
) -> None:
    """INBOX-12: even an admin's token signed in here gives a cookie that reads only its own inbox:
    no admin route, no other participant's inbox, no console page. Bad sign-ins open nothing."""
    _sign_in(client, scope="nudging.admin", subject="ops-admin")
    assert client.get(ME).status_code == 200
    assert client.get(ME + "?user_id=participant-1").status_code == 403
    assert client.get("/admin/scheduled-events").status_code == 401
    assert client.get("/console", follow_redirects=False).status_code == 303
    client.cookies.clear()
    assert client.post(SESSION, data={"token": token(None)}).status_code == 415  # a form cannot sign in
    assert client.post(SESSION, json={"token": "not-a-jwt"}).status_code == 401
    assert client.post(SESSION, json={}).status_code == 422
    assert client.get(SESSION).status_code == 401
    assert client.get(ME).status_code == 401


@pytest.mark.clause("INBOX-13")
def test_sign_out_needs_the_csrf_token_and_then_every_replica_refuses_the_cookie(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """INBOX-13: DELETE /inbox/session with X-CSRF-Token deletes the session; the replayed cookie is
    401 here and on replica B."""
    session = _sign_in(client)
    old = client.cookies["scheduler_inbox"]
    replica_b = SchedulerService(service.settings, engine=engine, clock=clock, run_scheduler=False)
    with TestClient(replica_b.app) as b:
        b.cookies.set("scheduler_inbox", old)
        assert b.get(ME).status_code == 200
        assert client.delete(SESSION).status_code == 403
        assert client.delete(SESSION, headers={"X-CSRF-Token": "0" * 64}).status_code == 403
        assert b.get(ME).status_code == 200  # not signed out by a wrong token
        assert client.delete(SESSION, headers={"X-CSRF-Token": session["csrf"]}).status_code == 204
        assert b.get(ME).status_code == 401
        assert b.get(ME + "/stream").status_code == 401
    client.cookies.set("scheduler_inbox", old)
    assert client.get(ME).status_code == 401
    assert client.get(SESSION).status_code == 401
    assert rows(engine, "SELECT id FROM web_sessions") == []


@pytest.mark.clause("INBOX-13")
def test_an_idle_inbox_session_ends_and_an_admin_sees_and_ends_participant_sessions(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """INBOX-13: unused past SCHEDULER_SESSION_IDLE_SECONDS (the service's clock) it is 401; an admin lists
    participant sessions and ends one."""
    _sign_in(client)
    clock.advance(timedelta(seconds=service.settings.session_idle_seconds + 1))
    assert client.get(ME).status_code == 401
    client.cookies.clear()
    _sign_in(client, subject="participant-2")
    [listed] = client.get("/admin/sessions?kind=participant", headers=ADMIN).json()
    assert (listed["subject"], listed["kind"]) == ("participant-2", "participant")
    assert client.delete(f"/admin/sessions/{listed['id']}", headers=ADMIN).status_code == 200
    assert client.get(ME).status_code == 401


@pytest.mark.clause("INBOX-13")
def test_a_stream_opened_by_the_cookie_ends_when_its_session_is_signed_out(
    database_url: str, settings: Settings, clock: ManualClock
) -> None:
    """INBOX-13: the open stream of a session checks it as it runs: after sign-out it ends at the next heartbeat."""
    engine_b = make_engine(database_url, Settings(lock_timeout_ms=0, statement_timeout_ms=60_000))
    replica = SchedulerService(settings, engine=engine_b, clock=clock, run_scheduler=False)
    replica.inbox.heartbeat_seconds = 0.05
    try:
        with serve(replica) as base, httpx.Client(base_url=base, timeout=20) as http:
            signed_in = http.post(SESSION, json={"token": token(None, subject="participant-1")})
            assert signed_in.status_code == 201
            stream = open_stream(base, {}, http)  # the client's cookie jar carries the session
            stream.until_connected()
            assert stream.next_block() == [": heartbeat"]
            assert http.delete(SESSION, headers={"X-CSRF-Token": signed_in.json()["csrf"]}).status_code == 204
            with pytest.raises(AssertionError, match="the stream ended"):
                for _ in range(1000):  # bounded: each block is one heartbeat of 0.05 s
                    stream.next_block()
            stream.close()
            assert http.get(ME).status_code == 401
    finally:
        engine_b.dispose()


@pytest.mark.clause("INBOX-13")
def test_sign_out_ends_only_its_own_session_not_the_participants_others_nor_anyone_elses(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """INBOX-13: participant-1 has the page open in two browsers, participant-2 in a third.
    The first browser signs out: its cookie is refused at once; participant-1's second browser
    and participant-2's still read their own inboxes (a sign-out by participant, or of every
    session, would sign them out too)."""
    session = _sign_in(client)
    old = client.cookies["scheduler_inbox"]
    with TestClient(service.app) as second, TestClient(service.app) as other:
        _sign_in(second)
        _sign_in(other, subject="participant-2")
        assert client.delete(SESSION, headers={"X-CSRF-Token": session["csrf"]}).status_code == 204
        client.cookies.set("scheduler_inbox", old)
        assert client.get(ME).status_code == 401
        assert (second.get(ME).status_code, other.get(ME).status_code) == (200, 200)
        assert second.get(SESSION).status_code == 200
        assert len(rows(engine, "SELECT id FROM web_sessions")) == 2


@pytest.mark.clause("INBOX-13")
def test_two_sessions_of_one_participant_never_take_each_others_csrf_token(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """INBOX-13: participant-1 signs in on the page from two browsers with the same token.
    Each session has its own CSRF token: a sign-out carrying the other's is 403 and both stay
    signed in; each signs out with its own (a token keyed by the participant instead of the
    session would let either browser sign the other out)."""
    participant = token(None, subject="participant-1")
    with TestClient(service.app) as second:
        csrf = {}
        for name, browser in (("first", client), ("second", second)):
            signed_in = browser.post(SESSION, json={"token": participant})
            assert signed_in.status_code == 201
            csrf[name] = signed_in.json()["csrf"]
        assert csrf["first"] != csrf["second"]
        assert client.get(SESSION).json()["csrf"] == csrf["first"]
        assert second.get(SESSION).json()["csrf"] == csrf["second"]
        for browser, theirs in ((client, csrf["second"]), (second, csrf["first"])):
            assert browser.delete(SESSION, headers={"X-CSRF-Token": theirs}).status_code == 403
            assert len(rows(engine, "SELECT id FROM web_sessions")) == 2
            assert (client.get(ME).status_code, second.get(ME).status_code) == (200, 200)
        assert second.delete(SESSION, headers={"X-CSRF-Token": csrf["second"]}).status_code == 204
        assert (client.get(ME).status_code, second.get(ME).status_code) == (200, 401)
        assert client.delete(SESSION, headers={"X-CSRF-Token": csrf["first"]}).status_code == 204
        assert rows(engine, "SELECT id FROM web_sessions") == []
