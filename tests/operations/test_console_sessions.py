"""The console's sessions over HTTP; tests/operations/test_console_browser.py drives them in Chromium.

In our words: a token pasted once opens a session stored in the database; the cookie holds
only a random session id (the table keeps its hash, the API refuses it); sign-out deletes
the session, so the old cookie is refused by every replica at once; a session ends at its
absolute expiry and after its idle timeout, on the service's clock; the CSRF token belongs to
the session; an admin lists and ends sessions by API and on a console page.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, token
from tests.helpers import rows
from tests.operations.support import csrf_of, sign_in


def _cookie(client: TestClient) -> str:
    value = client.cookies.get("scheduler_console")
    assert isinstance(value, str) and value, "no session cookie"
    return value


def _open(client: TestClient, path: str = "/console") -> int:
    status: int = client.get(path, follow_redirects=False).status_code
    return status


@pytest.mark.clause("CON-17")
@pytest.mark.clause("DEC-SESS-1")
def test_the_cookie_is_an_opaque_session_id_whose_hash_alone_is_stored(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-17: the cookie is neither the token nor a JWT; the table holds its SHA-256 only; the API refuses it."""
    admin = token("nudging.admin", subject="operator-ann")
    sign_in(client)
    cookie = _cookie(client)
    assert cookie.count(".") == 0 and cookie != admin and len(cookie) >= 40
    [stored] = rows(engine, "SELECT * FROM web_sessions")
    assert stored["secret_hash"] == hashlib.sha256(cookie.encode()).hexdigest()
    assert (stored["subject"], stored["kind"]) == ("operator-ann", "admin")
    assert cookie not in str(stored.values()) and admin not in str(stored.values())
    assert client.get("/admin/scheduled-events", headers={"Authorization": f"Bearer {cookie}"}).status_code == 401
    with TestClient(service.app) as other:  # a second browser: another session, another CSRF token
        other_csrf = sign_in(other, subject="operator-bob")
        assert _cookie(other) != cookie and other_csrf != csrf_of(client.get("/console").text)
    assert len(rows(engine, "SELECT id FROM web_sessions")) == 2


@pytest.mark.clause("CON-11")
def test_sign_out_deletes_the_session_and_every_replica_refuses_the_old_cookie(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-11: after sign-out the old cookie, replayed here and on a second replica, leads to sign-in."""
    replica_b = SchedulerService(service.settings, engine=engine, clock=clock, run_scheduler=False)
    csrf = sign_in(client)
    old = _cookie(client)
    with TestClient(replica_b.app) as b:
        b.cookies.set("scheduler_console", old, path="/console")
        assert _open(b) == 200  # any replica serves the session
        assert client.post("/console/sign-out", data={"csrf": csrf}, follow_redirects=False).status_code == 303
        assert rows(engine, "SELECT id FROM web_sessions") == []
        assert _open(b) == 303  # refused at once on the other replica
    client.cookies.set("scheduler_console", old, path="/console")
    replay = client.get("/console/events", follow_redirects=False)
    assert replay.status_code == 303 and replay.headers["location"].startswith("/console/sign-in")
    assert client.post("/console/sign-out", data={"csrf": csrf}, follow_redirects=False).headers["location"] \
        .startswith("/console/sign-in")  # the old CSRF token died with its session


@pytest.mark.clause("CON-12")
def test_a_session_ends_after_its_idle_timeout_on_the_services_clock(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """CON-12: used within the idle timeout it lives on; left unused past it, sign-in again."""
    idle = service.settings.session_idle_seconds
    sign_in(client, ttl_seconds=86_400)  # a long token: only idleness ends this session
    for _ in range(3):  # each request within the timeout moves its end further
        clock.advance(timedelta(seconds=idle - 5))
        assert _open(client) == 200
    clock.advance(timedelta(seconds=idle))
    response = client.get("/console/audit", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/console/sign-in?next=%2Fconsole%2Faudit"
    assert 'scheduler_console=""' in response.headers["set-cookie"]  # the dead cookie is cleared


@pytest.mark.clause("CON-12")
@pytest.mark.clause("DEC-SESS-1")
def test_a_session_ends_with_its_token_or_at_the_maximum_lifetime_whichever_is_sooner(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """CON-12: a token valid for 10 minutes gives a 10-minute session; a day-long token the 8-hour maximum."""
    sign_in(client, ttl_seconds=600)
    [open_session] = client.get("/admin/sessions", headers=ADMIN).json()
    lifetime = datetime.fromisoformat(open_session["expires_at"]) - clock.now()
    assert timedelta(seconds=590) <= lifetime <= timedelta(seconds=600)  # the token's remaining life
    clock.advance(timedelta(seconds=601))
    assert _open(client) == 303
    client.cookies.clear()
    sign_in(client, ttl_seconds=86_400)
    maximum = service.settings.session_max_seconds
    for _ in range(maximum // 1500):  # kept busy, never idle
        clock.advance(timedelta(seconds=1500))
        assert _open(client) == 200
    clock.advance(timedelta(seconds=maximum % 1500 + 1))
    assert _open(client) == 303


@pytest.mark.clause("CON-13")
def test_an_admin_lists_and_ends_sessions_by_api_and_the_old_cookie_is_refused(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-13: GET /admin/sessions lists open sessions without their secrets; DELETE ends one at once, audited."""
    sign_in(client, subject="operator-ann")
    with TestClient(service.app) as other:
        sign_in(other, subject="operator-bob")
        listed = client.get("/admin/sessions", headers=ADMIN).json()
        assert sorted(s["subject"] for s in listed) == ["operator-ann", "operator-bob"]
        assert all(set(s) == {"id", "subject", "kind", "created_at", "expires_at", "last_seen_at", "idle_seconds",
                              "ends_at", "user_agent"} for s in listed)
        assert _cookie(other) not in str(listed)
        [bob] = [s for s in listed if s["subject"] == "operator-bob"]
        assert [s["id"] for s in client.get("/admin/sessions?kind=admin", headers=ADMIN).json()] != []
        assert client.get("/admin/sessions?kind=participant", headers=ADMIN).json() == []
        assert client.get("/admin/sessions?kind=bogus", headers=ADMIN).status_code == 422
        assert client.get("/admin/sessions", headers=INGEST).status_code == 403
        ended = client.delete(f"/admin/sessions/{bob['id']}", headers=ADMIN)
        assert ended.status_code == 200 and ended.json()["subject"] == "operator-bob"
        assert _open(other) == 303
        assert client.delete(f"/admin/sessions/{bob['id']}", headers=ADMIN).status_code == 404
        [audited] = client.get("/admin/audit", headers=ADMIN).json()
        assert (audited["action"], audited["actor"], audited["source"], audited["count"]) == (
            "end_session", "local-operator", "api", 1)
        assert audited["filter"] == {"session_id": bob["id"], "subject": "operator-bob", "kind": "admin"}
    assert _open(client) == 200
    assert [s["subject"] for s in client.get("/admin/sessions", headers=ADMIN).json()] == ["operator-ann"]


@pytest.mark.clause("CON-13")
def test_the_sessions_page_lists_sessions_and_ends_one_with_its_csrf_token(
    client: TestClient, service: SchedulerService
) -> None:
    """CON-13: the console's sessions page ends another admin's session; ending one's own signs out."""
    csrf = sign_in(client, subject="operator-ann")
    with TestClient(service.app) as other:
        sign_in(other, subject="operator-bob")
        page = client.get("/console/sessions").text
        ids = dict((subject, sid) for sid, subject in re.findall(r'data-id="([^"]+)" data-subject="([^"]+)"', page))
        assert set(ids) == {"operator-ann", "operator-bob"} and "(you)" in page
        assert client.post(f"/console/sessions/{ids['operator-bob']}/end", data={}).status_code == 403
        assert _open(other) == 200
        done = client.post(f"/console/sessions/{ids['operator-bob']}/end", data={"csrf": csrf}, follow_redirects=False)
        assert (done.status_code, done.headers["location"]) == (303, "/console/sessions?done=ended")
        assert _open(other) == 303
        assert client.get("/admin/audit", headers=ADMIN).json()[0]["actor"] == "operator-ann"
    mine = client.post(f"/console/sessions/{ids['operator-ann']}/end", data={"csrf": csrf}, follow_redirects=False)
    assert mine.headers["location"] == "/console/sign-in"
    assert _open(client) == 303


@pytest.mark.clause("CON-11")
def test_sign_out_ends_only_its_own_session_not_the_operators_others_nor_anyone_elses(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-11: operator-ann is signed in from two browsers and operator-bob from a third. Ann
    signs out in the first: that cookie is refused at once, while her second browser and Bob's
    still open the console and their CSRF tokens still work (a sign-out by subject, or of every
    session, would sign them out too)."""
    csrf = sign_in(client, subject="operator-ann")
    old = _cookie(client)
    with TestClient(service.app) as second, TestClient(service.app) as bob:
        csrf_second = sign_in(second, subject="operator-ann")
        sign_in(bob, subject="operator-bob")
        assert len(rows(engine, "SELECT id FROM web_sessions")) == 3
        assert client.post("/console/sign-out", data={"csrf": csrf}, follow_redirects=False).status_code == 303
        client.cookies.set("scheduler_console", old, path="/console")
        assert _open(client) == 303
        assert (_open(second), _open(bob)) == (200, 200)
        assert len(rows(engine, "SELECT id FROM web_sessions")) == 2
        done = second.post("/console/sign-out", data={"csrf": csrf_second}, follow_redirects=False)
        assert done.status_code == 303 and _open(second) == 303
        assert _open(bob) == 200


@pytest.mark.clause("CON-13")
def test_ending_one_of_an_operators_two_sessions_ends_that_one_only_and_signs_out_only_its_browser(
    service: SchedulerService, engine: Engine
) -> None:
    """CON-13: operator-ann is signed in from two browsers. On the sessions page the first ends
    the second's session: the second is refused, the first stays signed in (it ended another
    session, not its own: "own" is the session, not the operator). By the API an admin ends one
    of two sessions of one subject: only that one ends."""
    with TestClient(service.app) as first, TestClient(service.app) as second:
        csrf = sign_in(first, subject="operator-ann")
        sign_in(second, subject="operator-ann")
        page = first.get("/console/sessions").text
        ids = re.findall(r'data-id="([^"]+)" data-subject="operator-ann"', page)
        assert len(ids) == 2 and page.count("(you)") == 1
        theirs = _own_id(second, engine)
        assert theirs in ids and _own_id(first, engine) in ids
        done = first.post(f"/console/sessions/{theirs}/end", data={"csrf": csrf}, follow_redirects=False)
        assert (done.status_code, done.headers["location"]) == (303, "/console/sessions?done=ended")
        assert "set-cookie" not in {k.lower() for k in done.headers}
        assert (_open(first), _open(second)) == (200, 303)
    with TestClient(service.app) as third, TestClient(service.app) as fourth:
        sign_in(third, subject="operator-bob")
        sign_in(fourth, subject="operator-bob")
        bobs = [str(r["id"]) for r in rows(engine, "SELECT id FROM web_sessions WHERE subject = 'operator-bob'")]
        assert len(bobs) == 2
        assert third.delete(f"/admin/sessions/{_own_id(fourth, engine)}", headers=ADMIN).status_code == 200
        assert (_open(third), _open(fourth)) == (200, 303)
        assert [r["id"] for r in rows(engine, "SELECT id FROM web_sessions WHERE subject = 'operator-bob'")] == [
            _own_id(third, engine)]


def _own_id(client: TestClient, engine: Engine) -> str:
    """The public id of the session whose cookie ``client`` holds (found by its hash)."""
    digest = hashlib.sha256(_cookie(client).encode()).hexdigest()
    [row] = rows(engine, "SELECT id FROM web_sessions WHERE secret_hash = :h", h=digest)
    return str(row["id"])
