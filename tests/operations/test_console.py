"""The console at /console, over HTTP (the browser tests drive the same pages in Chromium).

In our words: only an admin signs in, by pasting a token that becomes an HttpOnly,
SameSite=Strict cookie expiring with the token; without it every page redirects to the
sign-in page; every state-changing form needs its CSRF token; events are filtered and
paginated by keyset; reset and bulk reset (dry run first, a reason, rows that changed
since the count untouched) are recorded in the audit trail, listed on a page and by API.
"""

from __future__ import annotations

import html
import json
import re
import time
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from sqlalchemy import Engine
from sqlalchemy import text as sql_text
from starlette.testclient import TestClient

from scheduler.application import commands
from scheduler.application.events import EventQuery
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from scheduler.types import EventStatus
from tests.conftest import ADMIN, INGEST, T0, token
from tests.helpers import drain, event_row, post_event, rows
from tests.operations.support import loop_step, sign_in

BAD_FACTS = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}


def _failed(client: TestClient, service: SchedulerService, users: list[str], **kwargs: object) -> list[str]:
    ids = [post_event(client, user_id=u, facts=BAD_FACTS, **kwargs)["id"] for u in users]
    drain(service)
    loop_step(service)  # and one poll as the loop runs it: heartbeat and metrics
    return ids


@pytest.mark.clause("CON-1")
def test_without_a_session_every_console_page_redirects_to_sign_in(client: TestClient) -> None:
    """CON-1: no cookie: 303 to the sign-in page, remembering where the operator was going."""
    for path in ("/console", "/console/events?status=failed", "/console/events/x", "/console/audit",
                 "/console/bulk-reset"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/console/sign-in?next=%2Fconsole")
    assert client.post("/console/events/x/reset", data={"csrf": "x"}, follow_redirects=False).status_code == 303
    # a bearer header is not a session
    assert client.get("/console", headers=ADMIN, follow_redirects=False).status_code == 303


@pytest.mark.clause("CON-1")
def test_a_live_stream_without_a_session_is_told_to_stop_and_leaves_an_open_sign_in_form_valid(
    client: TestClient,
) -> None:
    """CON-1: the overview's EventSource reconnecting after a sign-out (Accept: text/event-stream)
    gets 204, which ends an EventSource, not the sign-in page: rendering that page would set a
    new sign-in nonce and make the form open in another tab fail as "expired"."""
    page = client.get("/console/sign-in")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce
    stream = client.get("/console/stream", headers={"Accept": "text/event-stream"}, follow_redirects=False)
    assert stream.status_code == 204 and "set-cookie" not in stream.headers
    signed_in = client.post("/console/sign-in", data={"nonce": nonce[1], "token": token("nudging.admin")},
                            follow_redirects=False)
    assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/console")


@pytest.mark.clause("CON-1")
def test_an_admin_token_signs_in_with_a_strict_httponly_cookie_that_expires_with_it(client: TestClient) -> None:
    """CON-1: the cookie is HttpOnly, SameSite=Strict, scoped to /console, Max-Age = the token's remaining life."""
    page = client.get("/console/sign-in?next=%2Fconsole%2Faudit")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce
    admin = token("nudging.admin", subject="operator-ann", ttl_seconds=1200)
    response = client.post("/console/sign-in", data={"nonce": nonce[1], "token": admin, "next": "/console/audit"},
                           follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/console/audit")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("scheduler_console=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    max_age = int(re.search(r"Max-Age=(\d+)", cookie)[1])  # type: ignore[index]
    assert 1190 <= max_age <= 1200
    assert "Secure" not in cookie  # plain http here; https sets Secure
    overview = client.get("/console")
    assert overview.status_code == 200 and "operator-ann" in overview.text
    assert overview.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")


@pytest.mark.clause("CON-1")
@pytest.mark.parametrize("scope", ["nudging.ingest", None], ids=["ingest", "participant"])
def test_an_ingest_or_participant_token_is_refused_at_sign_in(client: TestClient, scope: str | None) -> None:
    """CON-1: a valid token without nudging.admin gets 403 and no cookie; a forged one 401."""
    nonce = re.search(r'name="nonce" value="([^"]+)"', client.get("/console/sign-in").text)[1]  # type: ignore[index]
    response = client.post("/console/sign-in", data={"nonce": nonce, "token": token(scope)}, follow_redirects=False)
    assert response.status_code == 403
    assert "lacks the admin permission" in response.text
    assert "scheduler_console=" not in response.headers.get("set-cookie", "")
    forged = jwt.encode({"sub": "x", "aud": "svc-nudging", "exp": int(time.time()) + 60, "scope": "nudging.admin"},
                        "another-secret-entirely-0123456789abcdef", algorithm="HS256")
    nonce = re.search(r'name="nonce" value="([^"]+)"', response.text)[1]  # type: ignore[index]
    assert client.post("/console/sign-in", data={"nonce": nonce, "token": forged}).status_code == 401
    # A token put in the cookie by hand is not a session (the cookie holds a session id): sign-in again.
    client.cookies.set("scheduler_console", token(scope), path="/console")
    assert client.get("/console", follow_redirects=False).status_code == 303


@pytest.mark.clause("CON-2")
def test_a_form_without_its_csrf_token_is_403_and_changes_nothing(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-2: reset, bulk reset and sign-out without (or with a wrong) CSRF token are 403."""
    [bad] = _failed(client, service, ["anna"])
    csrf = sign_in(client)
    assert client.post(f"/console/events/{bad}/reset", data={}).status_code == 403
    assert client.post(f"/console/events/{bad}/reset", data={"csrf": "0" * 64}).status_code == 403
    assert client.post("/console/bulk-reset", data={"status": "failed", "reason": "x", "expected": "1",
                                                    "as_of": T0.isoformat()}).status_code == 403
    assert client.post("/console/sign-out", data={}).status_code == 403
    assert event_row(engine, bad)["status"] == "failed"
    assert rows(engine, "SELECT * FROM operator_actions") == []
    signin_without_nonce = client.post("/console/sign-in", data={"token": token("nudging.admin")})
    assert signin_without_nonce.status_code == 403
    assert client.post("/console/sign-out", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    assert client.get("/console", follow_redirects=False).status_code == 303


@pytest.mark.clause("CON-4")
def test_the_events_page_filters_and_pages_by_keyset(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """CON-4: the filter narrows by status, type, participant, key, community, window and error text;
    60 rows come as 50 and then 10, with no row twice."""
    _failed(client, service, ["odd-one"], community_id="other-community")
    later = T0 + timedelta(hours=1)
    for n in range(60):
        post_event(client, user_id=f"user-{n:02d}", external_key=f"key-{n:02d}", trigger_at=later)
        clock.advance(timedelta(seconds=1))
    sign_in(client)

    def listed(query: str) -> list[str]:
        page = client.get("/console/events?" + query)
        assert page.status_code == 200, page.text
        return re.findall(r'<tr class="status-\w+" data-id="([^"]+)"', page.text)

    assert len(listed("status=failed")) == 1
    assert len(listed("status=failed&error_contains=TIME_SCOPE")) == 1  # case-insensitive
    assert listed("status=failed&error_contains=50%25") == []  # % is literal text, not a wildcard
    assert len(listed("community_id=other-community")) == 1
    assert len(listed("user_id=user-07")) == 1 and len(listed("external_key=key-08")) == 1
    assert len(listed("event_type=commitment_reminder&status=pending")) == 50  # one page
    window = f"trigger_from={later.isoformat()}&trigger_to={(later + timedelta(minutes=1)).isoformat()}"
    assert len(listed(window.replace("+", "%2B") + "&status=pending&user_id=user-01")) == 1
    assert len(listed(f"trigger_to={later.isoformat()}".replace("+", "%2B"))) == 1
    first = client.get("/console/events?status=pending")
    more = re.search(r'href="/console/events\?([^"]+)" id="next-page"', first.text)
    assert more
    second = listed(more[1].replace("&amp;", "&"))
    page_one = re.findall(r'data-id="([^"]+)"', first.text)
    assert (len(page_one), len(second)) == (50, 10)
    assert not set(page_one) & set(second)
    assert client.get("/console/events?status=bogus").status_code == 422


@pytest.mark.clause("CON-4")
def test_the_event_page_shows_every_column_the_facts_its_notifications_and_history(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-4: the detail page shows the row, its pretty-printed facts, notifications and action history."""
    ok = post_event(client, user_id="anna", external_key="anna-1")
    loop_step(service)
    csrf = sign_in(client)
    page = client.get(f"/console/events/{ok['id']}").text
    for text in ("dispatched", "anna-1", "community-1", "&#34;commitment&#34;: &#34;run the dishwasher at noon&#34;",
                 "Reminder: run the dishwasher at noon", "no operator action"):
        assert text in page, text
    response = client.post(f"/console/events/{ok['id']}/reset", data={"csrf": csrf, "reason": "send again"},
                           follow_redirects=False)
    assert response.status_code == 303
    page = client.get(response.headers["location"]).text
    assert "the row is pending again" in page and "operator-ann" in page and "send again" in page
    assert event_row(engine, ok["id"])["status"] == "pending"
    assert client.get("/console/events/no-such-row").status_code == 404


@pytest.mark.clause("CON-5")
@pytest.mark.clause("CON-6")
def test_bulk_reset_counts_first_needs_a_reason_and_resets_what_was_counted(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-5: the dry run counts the failed rows; without a reason nothing happens; with one they are
    pending again, and a row that changed after the count is left alone."""
    failed = _failed(client, service, ["a", "b", "c"])
    csrf = sign_in(client)
    dry = client.get("/console/bulk-reset?status=failed&error_contains=time_scope")
    assert re.search(r'id="dry-run-count">3<', dry.text)
    as_of = re.search(r'name="as_of" value="([^"]+)"', dry.text)[1]  # type: ignore[index]
    form = {"csrf": csrf, "status": "failed", "error_contains": "time_scope", "as_of": as_of, "expected": "3"}
    assert client.post("/console/bulk-reset", data={**form, "reason": "  "}).status_code == 422
    assert sorted(r["status"] for r in rows(engine, "SELECT status FROM scheduled_events")) == ["failed"] * 3
    # Between the count and the action: one row is fixed by its sender (rewritten, pending),
    # then fails again later, so it no longer is the row that was counted.
    clock.advance(timedelta(seconds=5))
    with engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE scheduled_events SET updated_at = :now, last_error = 'Other: x' WHERE id = :id"),
                     {"now": clock.now(), "id": failed[2]})
    done = client.post("/console/bulk-reset", data={**form, "reason": "fixed the time scope rule"})
    assert done.status_code == 200
    assert re.search(r'id="bulk-count">2<', done.text)
    assert [event_row(engine, i)["status"] for i in failed] == ["pending", "pending", "failed"]
    [action] = client.get("/admin/audit", headers=ADMIN).json()
    assert (action["actor"], action["source"], action["action"], action["count"]) == (
        "operator-ann", "console", "bulk_reset", 2)
    assert action["filter"] == {"status": "failed", "error_contains": "time_scope"}
    assert action["reason"] == "fixed the time scope rule"
    assert "fixed the time scope rule" in client.get(f"/console/events/{failed[0]}").text


@pytest.mark.clause("CON-5")
def test_bulk_reset_works_in_chunks_up_to_the_cap_and_skips_rows_a_poll_holds(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-5: 25 failed rows in chunks of 10, capped at 20; a row locked by a running poll is
    skipped, not waited for."""
    failed = _failed(client, service, [f"user-{n:02d}" for n in range(25)])
    where = EventQuery(status=EventStatus.FAILED)
    assert commands.count_matching(service.database, where, commands.RESETTABLE, cap=20) == 21  # "more than the cap"
    locked = sorted(failed)[0]
    with engine.connect() as holder:
        from sqlalchemy import text

        holder.execute(text("SELECT 1 FROM scheduled_events WHERE id = :id FOR UPDATE"), {"id": locked})
        result = commands.bulk_reset(service.database, where, now=clock.now(), as_of=clock.now(), expected=25,
                                     actor=commands.Actor("ops", "cli"), reason="retry", cap=20, chunk=10)
        holder.rollback()
    assert (result.changed, result.chunks) == (20, 2)
    assert event_row(engine, locked)["status"] == "failed"
    linked = rows(engine, "SELECT event_id FROM operator_action_events WHERE action_id = :a", a=result.action_id)
    assert len(linked) == 20 and locked not in {r["event_id"] for r in linked}


@pytest.mark.clause("CON-6")
def test_every_reset_is_in_the_audit_trail_from_the_api_and_the_console(
    client: TestClient, service: SchedulerService
) -> None:
    """CON-6: a reset over the API (who: the token's sub) and one in the console both appear, newest first,
    on /admin/audit and the audit page."""
    one, two = _failed(client, service, ["anna", "bob"])
    assert client.post(f"/admin/scheduled-events/{one}/reset", headers={
        "Authorization": f"Bearer {token('nudging.admin', subject='api-operator')}"}).status_code == 200
    csrf = sign_in(client)
    client.post(f"/console/events/{two}/reset", data={"csrf": csrf})
    trail = client.get("/admin/audit", headers=ADMIN).json()
    assert [(a["actor"], a["source"], a["action"], a["event_id"], a["count"]) for a in trail] == [
        ("operator-ann", "console", "reset", two, 1), ("api-operator", "api", "reset", one, 1)]
    older = client.get(f"/admin/audit?limit=1&before_id={trail[0]['id']}", headers=ADMIN).json()
    assert [a["id"] for a in older] == [trail[1]["id"]]
    page = client.get("/console/audit").text
    assert page.index("operator-ann") < page.index("api-operator")
    assert client.get("/admin/audit?limit=0", headers=ADMIN).status_code == 422


@pytest.mark.clause("CON-3")
def test_the_overview_shows_counts_backlog_lateness_replicas_and_failures_and_streams_them(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """CON-3: the overview's figures, and the same figures as a server-sent event."""
    post_event(client, user_id="anna", trigger_at=T0 - timedelta(minutes=2))
    _failed(client, service, ["bob"])
    post_event(client, user_id="carl", trigger_at=T0 - timedelta(minutes=5))
    sign_in(client)
    page = client.get("/console").text
    assert re.search(r'data-field="counts.failed" id="failed-count">1<', page)
    assert re.search(r'data-field="counts.dispatched">1<', page)
    assert re.search(r'data-field="backlog">1<', page)
    assert re.search(r'data-field="oldest_overdue_seconds" data-format="duration">5 min 0 s<', page)
    assert re.search(r'data-field="lateness.p50" data-format="duration">2 min 0 s<', page)
    assert "missing_or_invalid_time_scope" in page and "state-ok" in page
    # The test client reads a response to its end: a stream that ignored ?once=1 would end only
    # after stream_seconds; cut that to seconds, so such a bug fails here quickly (two events).
    service.console.stream_seconds = 3.0
    with client.stream("GET", "/console/stream?once=1") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = "".join(stream.iter_text())
    assert body.startswith("event: overview\ndata: {") and body.count("event: overview") == 1
    assert '"failed": 1' in body and '"backlog": 1' in body


@pytest.mark.clause("CON-8")
def test_the_console_serves_its_own_script_and_style_and_nothing_from_elsewhere(client: TestClient) -> None:
    """CON-8: the script and style come from the package; pages reference no other host."""
    js = client.get("/console/static/console.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert client.get("/console/static/console.css").status_code == 200
    assert client.get("/console/static/..%2Fconsole.py").status_code == 404
    sign_in(client)
    for path in ("/console", "/console/events", "/console/audit", "/console/sign-in"):
        html = client.get(path).text
        assert re.findall(r'(?:src|href)="(https?:)?//', html) == [], path


@pytest.mark.clause("CON-1")
def test_the_console_works_mounted_under_a_prefix_of_a_host_app(service: SchedulerService) -> None:
    """CON-1: embedded at /nudging, sign-in redirects, links, assets and the cookie's path carry the prefix."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/nudging", app=service.app)])
    with TestClient(host) as client:
        first = client.get("/nudging/console", follow_redirects=False)
        assert first.headers["location"] == "/nudging/console/sign-in?next=%2Fnudging%2Fconsole"
        page = client.get(first.headers["location"])
        assert 'action="/nudging/console/sign-in"' in page.text
        assert 'src="/nudging/console/static/console.js"' in page.text
        nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)[1]  # type: ignore[index]
        response = client.post("/nudging/console/sign-in", follow_redirects=False, data={
            "nonce": nonce, "token": token("nudging.admin"), "next": "/nudging/console"})
        assert response.headers["location"] == "/nudging/console"
        assert "Path=/nudging/console" in response.headers["set-cookie"]
        overview = client.get("/nudging/console")
        assert overview.status_code == 200 and 'href="/nudging/console/events"' in overview.text
        assert client.get("/nudging/console/static/console.css").status_code == 200


@pytest.mark.clause("CON-16")
def test_the_overview_counts_every_status_and_past_the_exact_limit_estimates_finished_rows_by_status(
    client: TestClient, service: SchedulerService, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CON-16: every status is counted, cancelled included, exactly in a small table; in a big one
    pending and failed stay exact and dispatched and cancelled are the planner's estimate of each
    status (never the table's estimate minus the others), named as estimates on the page."""
    from scheduler.operations import overview

    for n in range(6):
        post_event(client, user_id=f"user-{n}")
    _failed(client, service, ["bad"])
    post_event(client, user_id="later", trigger_at=T0 + timedelta(hours=1))
    withdrawn = post_event(client, user_id="withdrawn", trigger_at=T0 + timedelta(hours=1))
    assert client.delete(f"/admin/scheduled-events/{withdrawn['id']}", headers=INGEST).status_code == 200
    exact = overview.overview(service.database, service.clock.now())
    assert exact["counts"] == {"pending": 1, "dispatched": 6, "failed": 1, "cancelled": 1, "expired": 0}
    assert exact["estimated"] == []
    sign_in(client)
    page = client.get("/console").text
    assert re.search(r'data-field="counts.cancelled">1<', page) and "estimated" not in page
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        from sqlalchemy import text

        conn.execute(text("ANALYZE scheduled_events"))
        # The planner's figures now lag the truth, as they do between two ANALYZEs: the
        # estimates follow the planner, the exact counts the table.
        conn.execute(text("UPDATE scheduled_events SET status = 'failed', last_error = 'x' WHERE id = :id"),
                     {"id": withdrawn["id"]})
    monkeypatch.setattr(overview, "EXACT_LIMIT", 5)
    figures = overview.overview(service.database, service.clock.now())
    assert figures["estimated"] == ["dispatched", "cancelled", "expired"]
    # no row is expired: the planner's estimate of a value absent from its statistics is at most a row
    assert figures["counts"].pop("expired") <= 1
    assert figures["counts"] == {"pending": 1, "dispatched": 6, "failed": 2, "cancelled": 1}
    page = client.get("/console").text
    assert "dispatched (≈, estimated)" in page and "cancelled (≈, estimated)" in page
    monkeypatch.setattr(overview, "EXACT_LIMIT", 200_000)
    assert overview.overview(service.database, service.clock.now())["counts"]["cancelled"] == 0


# Where a `next` could send an operator after sign-in, other than a page of this console:
# other hosts in every spelling browsers accept, encodings, control characters, paths beside
# or above the console. Each must land on the console itself.
HOSTILE_NEXT = [
    "//evil.example/console", "//evil.example", "///evil.example/console", "////evil.example",
    "/\\evil.example/console", "\\\\evil.example", "/\\/evil.example", "\\/evil.example",
    "https://evil.example/console", "HTTPS://evil.example", "http:evil.example", "https:/evil.example",
    "javascript:alert(document.cookie)", "data:text/html,<script>alert(1)</script>",
    "%2F%2Fevil.example", "%2f%2fevil.example/console", "/%2F%2Fevil.example", "%5C%5Cevil.example",
    " //evil.example", "\t//evil.example", "/\t/evil.example", "/console\r\nSet-Cookie: x=1",
    "/admin/scheduled-events", "/inbox", "/", "/consolex", "/console.evil.example", "/console@evil.example",
    "/console/../inbox", "/console/./../admin", "/console/%2e%2e/inbox", "/console/%2E%2e%2Finbox",
    "/console/..%2f..%2finbox", "/console/.%2e/admin",
]


def sign_in_with_next(client: TestClient, next_value: str, prefix: str = "") -> str:
    """Follow a link to the sign-in page carrying ``next``, sign in; the redirect's target."""
    page = client.get(f"{prefix}/console/sign-in", params={"next": next_value})
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    carried = re.search(r'name="next" value="([^"]*)"', page.text)
    assert nonce and carried, page.text
    response = client.post(f"{prefix}/console/sign-in", follow_redirects=False, data={
        "nonce": nonce[1], "token": token("nudging.admin"), "next": html.unescape(carried[1])})
    assert response.status_code == 303, response.text
    return str(response.headers["location"])


def on_this_site(location: str, console: str) -> bool:
    parts = urlsplit(location)
    return not parts.scheme and not parts.netloc and "\\" not in location and (
        parts.path == console or parts.path.startswith(console + "/"))


@pytest.mark.clause("CON-10")
def test_sign_in_follows_only_a_next_inside_this_console_and_otherwise_lands_on_the_console(
    client: TestClient,
) -> None:
    """CON-10: every hostile `next` (another host in any spelling, an encoding, a control
    character, a path beside or above the console), sent through the sign-in page's link or
    posted directly, lands on /console; a page of the console is followed."""
    for hostile in HOSTILE_NEXT:
        assert sign_in_with_next(client, hostile) == "/console", hostile
        nonce = re.search(r'name="nonce" value="([^"]+)"', client.get("/console/sign-in").text)[1]  # type: ignore[index]
        direct = client.post("/console/sign-in", follow_redirects=False,
                             data={"nonce": nonce, "token": token("nudging.admin"), "next": hostile})
        assert direct.headers["location"] == "/console", hostile
    for good in ("/console", "/console/audit", "/console/events?status=failed&after_id=x", "/console/events/abc"):
        assert sign_in_with_next(client, good) == good


@pytest.mark.clause("CON-10")
def test_mounted_under_a_prefix_sign_in_follows_only_a_next_inside_the_mounted_console(
    service: SchedulerService,
) -> None:
    """CON-10: embedded at /nudging, the console is /nudging/console: a `next` to the host
    app's own /console, or beside the mount, lands on /nudging/console."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/nudging", app=service.app)])
    with TestClient(host) as client:
        for hostile in [*HOSTILE_NEXT, "/console/audit", "/nudging/consolex", "/nudging/console/../admin"]:
            assert sign_in_with_next(client, hostile, prefix="/nudging") == "/nudging/console", hostile
        assert sign_in_with_next(client, "/nudging/console/audit", prefix="/nudging") == "/nudging/console/audit"


@pytest.mark.clause("CON-10")
def test_every_other_console_redirect_stays_on_this_site_inside_the_console(
    client: TestClient, service: SchedulerService
) -> None:
    """CON-10: the other redirects that carry something of the request (the sign-in redirect
    remembering the page asked for, the reset's return to its event page, sign-out) point at
    a page of this console, and the `next` they carry is itself one the sign-in follows."""
    for path in ("/console/events/x%5Cevil.example", "/console/events?q=//evil.example",
                 "/console/events/%2e%2e", "/console/audit?before_id=//evil.example"):
        client.cookies.clear()  # signed out
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        location = response.headers["location"]
        assert on_this_site(location, "/console") and location.startswith("/console/sign-in?next="), location
        carried = sign_in_with_next(client, parse_qs(urlsplit(location).query)["next"][0])
        assert on_this_site(carried, "/console"), (path, carried)
    client.cookies.clear()
    csrf = sign_in(client)
    row = post_event(client, user_id="anna")
    reset = client.post(f"/console/events/{row['id']}/reset", data={"csrf": csrf}, follow_redirects=False)
    assert on_this_site(reset.headers["location"], "/console") and reset.headers["location"].startswith(
        f"/console/events/{row['id']}")
    out = client.post("/console/sign-out", data={"csrf": csrf}, follow_redirects=False)
    assert out.headers["location"] == "/console/sign-in"


@pytest.mark.clause("CON-2")
def test_another_sessions_csrf_token_or_sign_in_nonce_is_403_and_changes_nothing(
    service: SchedulerService, engine: Engine
) -> None:
    """CON-2: two operators in two browsers: Bob's reset, bulk reset and sign-out carrying Ann's
    (valid, but not his) CSRF token are 403 and change nothing; a sign-in posting the nonce
    another browser was given is 403."""
    with TestClient(service.app) as ann, TestClient(service.app) as bob:
        [bad] = _failed(ann, service, ["anna"])
        ann_csrf = sign_in(ann, subject="operator-ann")
        bob_csrf = sign_in(bob, subject="operator-bob")
        assert ann_csrf != bob_csrf
        assert bob.post(f"/console/events/{bad}/reset", data={"csrf": ann_csrf}).status_code == 403
        assert bob.post("/console/bulk-reset", data={"csrf": ann_csrf, "status": "failed", "reason": "x",
                                                     "expected": "1", "as_of": T0.isoformat()}).status_code == 403
        assert bob.post("/console/sign-out", data={"csrf": ann_csrf}, follow_redirects=False).status_code == 403
        assert event_row(engine, bad)["status"] == "failed"
        assert rows(engine, "SELECT * FROM operator_actions") == []
        assert bob.get("/console", follow_redirects=False).status_code == 200  # still signed in
        ann.cookies.clear()
        bob.cookies.clear()
        ann_nonce = re.search(r'name="nonce" value="([^"]+)"', ann.get("/console/sign-in").text)
        assert ann_nonce and bob.get("/console/sign-in").status_code == 200  # bob has a nonce of his own
        stolen = bob.post("/console/sign-in", data={"nonce": ann_nonce[1], "token": token("nudging.admin")},
                          follow_redirects=False)
        assert stolen.status_code == 403 and "set-cookie" not in {k.lower() for k in stolen.headers}


@pytest.mark.clause("CON-2")
def test_two_sessions_of_one_operator_never_take_each_others_csrf_token_or_sign_in_nonce(
    service: SchedulerService, engine: Engine
) -> None:
    """CON-2: operator-ann signs in from two browsers with the same token, the closest two
    sessions can be (a second browser, or a copy of her session someone else holds). Each
    has its own CSRF token; each browser's reset, bulk reset, cancel, bulk cancel, ending of a
    session and sign-out carrying the other's token is 403 and changes nothing. A sign-in in
    one browser posting the nonce the other was given is 403, with the same operator's token
    (a token keyed by the operator instead of the session would pass all of these)."""
    ann_token = token("nudging.admin", subject="operator-ann")
    with TestClient(service.app) as first, TestClient(service.app) as second:
        bad = _failed(first, service, ["anna", "bert"])
        csrf = {"first": sign_in(first, subject="operator-ann"), "second": sign_in(second, subject="operator-ann")}
        assert csrf["first"] != csrf["second"]
        browsers = {"first": first, "second": second}
        ids = [str(s["id"]) for s in first.get("/admin/sessions", headers=ADMIN).json()]
        assert len(ids) == 2
        for me, other in (("first", "second"), ("second", "first")):
            browser, theirs = browsers[me], csrf[other]
            forms = {
                f"/console/events/{bad[0]}/reset": {"reason": "x"},
                "/console/bulk-reset": {"status": "failed", "reason": "x", "expected": "2", "as_of": T0.isoformat()},
                f"/console/events/{bad[1]}/cancel": {"reason": "x"},
                "/console/bulk-cancel": {"status": "failed", "reason": "x", "expected": "2", "as_of": T0.isoformat()},
                **{f"/console/sessions/{sid}/end": {} for sid in ids},
                "/console/sign-out": {},
            }
            for path, fields in forms.items():
                refused = browser.post(path, data={"csrf": theirs, **fields}, follow_redirects=False)
                assert refused.status_code == 403, (me, path)
            statuses = sorted(r["status"] for r in rows(engine, "SELECT status FROM scheduled_events"))
            assert statuses == ["failed", "failed"]
            assert rows(engine, "SELECT * FROM operator_actions") == []
            assert len(rows(engine, "SELECT id FROM web_sessions")) == 2
            assert all(b.get("/console", follow_redirects=False).status_code == 200 for b in browsers.values())
        for browser in browsers.values():
            browser.cookies.clear()
        first_nonce = re.search(r'name="nonce" value="([^"]+)"', first.get("/console/sign-in").text)
        assert first_nonce and second.get("/console/sign-in").status_code == 200  # second has a nonce of its own
        stolen = second.post("/console/sign-in", data={"nonce": first_nonce[1], "token": ann_token},
                             follow_redirects=False)
        assert stolen.status_code == 403 and "set-cookie" not in {k.lower() for k in stolen.headers}
        own = re.search(r'name="nonce" value="([^"]+)"', second.get("/console/sign-in").text)
        assert own and second.post("/console/sign-in", data={"nonce": own[1], "token": ann_token},
                                   follow_redirects=False).status_code == 303  # its own nonce signs in


@pytest.mark.clause("CON-4")
def test_rows_changed_at_one_instant_page_by_keyset_without_losing_or_repeating_one(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-4: 60 rows dispatched by polls at one frozen instant share their updated_at; the
    dispatched page and the unfiltered one still come as 50 and 10 with every row once (the
    keyset breaks the tie by id). And `_` in the error text is literal, like `%`."""
    for n in range(60):
        post_event(client, user_id=f"user-{n:02d}")
    drain(service)
    assert len({r["updated_at"] for r in rows(engine, "SELECT updated_at FROM scheduled_events")}) == 1
    sign_in(client)

    def pages(query: str) -> list[list[str]]:
        found: list[list[str]] = []
        link: str | None = query
        while link is not None and len(found) < 5:
            page = client.get("/console/events?" + link).text
            found.append(re.findall(r'<tr class="status-\w+" data-id="([^"]+)"', page))
            more = re.search(r'href="/console/events\?([^"]+)" id="next-page"', page)
            link = more[1].replace("&amp;", "&") if more else None
        return found

    everything = {r["id"] for r in rows(engine, "SELECT id FROM scheduled_events")}
    for query in ("status=dispatched", ""):
        got = pages(query)
        assert [len(p) for p in got] == [50, 10], query
        assert sorted(i for p in got for i in p) == sorted(everything), query
    with engine.begin() as conn:
        conn.execute(sql_text("UPDATE scheduled_events SET status = 'failed', last_error = 'timeXscope: x' "
                              "WHERE user_id = 'user-00'"))
    assert pages("status=failed&error_contains=time_scope") == [[]]  # `_` is not a wildcard
    assert len(pages("status=failed&error_contains=TIMEXSCOPE")[0]) == 1


@pytest.mark.clause("CON-1")
def test_a_forged_or_garbage_session_cookie_is_no_session(client: TestClient) -> None:
    """CON-1: a cookie that is not a session this service gave (garbage, an admin token signed
    with another secret, an expired admin token) leads to sign-in like no cookie at all."""
    forged = token("nudging.admin", secret="another-secret-entirely-0123456789abcdef0123")
    expired = token("nudging.admin", ttl_seconds=-60)
    for value in ("garbage", forged, expired, ""):
        client.cookies.clear()
        client.cookies.set("scheduler_console", value, path="/console")
        for path in ("/console", "/console/audit"):
            response = client.get(path, follow_redirects=False)
            assert response.status_code == 303 and response.headers["location"].startswith("/console/sign-in"), value


@pytest.mark.clause("CON-7")
def test_an_operators_hostile_reason_shows_as_text_on_the_audit_and_event_pages(
    client: TestClient, service: SchedulerService
) -> None:
    """CON-7: the reason an operator types is stored text too: markup in it is escaped on the
    event page and the audit page, never a tag."""
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    [bad] = _failed(client, service, ["anna"])
    csrf = sign_in(client)
    client.post(f"/console/events/{bad}/reset", data={"csrf": csrf, "reason": hostile})
    for path in (f"/console/events/{bad}", "/console/audit"):
        page = client.get(path).text
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page, path
        assert "<script>alert" not in page and "<img src=x" not in page, path


@pytest.mark.clause("CON-3")
def test_the_overviews_windows_follow_the_clock_and_failures_group_by_kind(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """CON-3: figures over windows of the clock, at several instants. Lateness is over the last
    hour's dispatches only: one dispatched 2 min late an hour and a minute ago no longer counts
    beside one 10 s late now. Failures are the last 24 hours', grouped by the text before the
    first colon of `last_error` (a whole text without a colon, non-ASCII, is its own kind):
    two failures of one kind 25 hours ago have left the window, the two kinds of the last day
    stay, each with its count."""
    from tests.helpers import reminder_facts

    def dispatch(user: str, late: timedelta) -> None:
        when = clock.now() - late
        post_event(client, user_id=user, trigger_at=when, facts=reminder_facts(when.date().isoformat()))
        assert service.scheduler.poll_once().dispatched == 1

    def figures() -> dict[str, Any]:
        sign_in(client)  # a fresh session: the clock moves on by hours, past an idle session's end (CON-12)
        with client.stream("GET", "/console/stream?once=1") as stream:
            body = "".join(stream.iter_text())
        figures: dict[str, Any] = json.loads(body.split("data: ", 1)[1].split("\n", 1)[0])
        return figures

    service.console.stream_seconds = 3.0  # a stream that ignores once=1 fails in seconds
    _failed(client, service, ["old-1", "old-2"])  # missing_or_invalid_time_scope, at T0
    dispatch("early", timedelta(minutes=2))  # at T0, 2 min late
    clock.advance(timedelta(hours=1, minutes=1))
    dispatch("now", timedelta(seconds=10))
    now = figures()
    assert (now["lateness"]["p50"], now["lateness"]["dispatched"]) == (10, 1)
    clock.advance(timedelta(hours=22))  # T0 + 23 h 1 min: two more failures, one of another kind
    recent = _failed(client, service, ["new-1", "new-2"])
    with engine.begin() as conn:
        conn.execute(sql_text("UPDATE scheduled_events SET last_error = :e WHERE id = :id"),
                     {"e": "Zeitüberschreitung beim Versand — ohne Doppelpunkt", "id": recent[1]})
    assert {(f["kind"], f["count"]) for f in figures()["failures"]} == {
        ("missing_or_invalid_time_scope", 3), ("Zeitüberschreitung beim Versand — ohne Doppelpunkt", 1)}
    clock.advance(timedelta(hours=2))  # T0 + 25 h 1 min: the two failures of T0 are a day old
    later = figures()
    assert {(f["kind"], f["count"]) for f in later["failures"]} == {
        ("missing_or_invalid_time_scope", 1), ("Zeitüberschreitung beim Versand — ohne Doppelpunkt", 1)}
    assert later["failures_total"] == 2
    assert later["lateness"]["dispatched"] == 0


@pytest.mark.clause("CON-4")
def test_pending_rows_due_at_one_instant_page_next_due_first_without_losing_or_repeating_one(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-4: the pending list pages by `(trigger_at, id)`, next due first. Five rows due at
    five earlier instants and fifty-five due at one later instant: the first page opens with
    the five in trigger order, and the two pages (50 and 10) hold every row once (the tie at
    one trigger_at is broken by id)."""
    early = [post_event(client, user_id=f"early-{n}", trigger_at=T0 + timedelta(minutes=n + 1))["id"] for n in range(5)]
    for n in range(55):
        post_event(client, user_id=f"tied-{n:02d}", trigger_at=T0 + timedelta(hours=2))
    sign_in(client)
    found: list[list[str]] = []
    link: str | None = "status=pending"
    while link is not None and len(found) < 5:
        page = client.get("/console/events?" + link).text
        found.append(re.findall(r'<tr class="status-\w+" data-id="([^"]+)"', page))
        more = re.search(r'href="/console/events\?([^"]+)" id="next-page"', page)
        link = more[1].replace("&amp;", "&") if more else None
    assert [len(p) for p in found] == [50, 10]
    assert found[0][:5] == early
    every_id = sorted(r["id"] for r in rows(engine, "SELECT id FROM scheduled_events"))
    assert sorted(i for p in found for i in p) == every_id
