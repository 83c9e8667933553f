"""Cancel in the console, over HTTP; test_console_browser.py drives it in Chromium.

In our words: an event's page cancels a pending or failed row with a required reason
(CSRF-protected, audited, the row's history naming who); a dispatched row stays dispatched
(409). Cancel by filter works as bulk reset does: a dry-run count of the pending and failed
rows that match, a required reason, at most what was counted, in chunks that skip rows a
poll holds, a row changed since the count left alone, all in the audit trail.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.application import commands, events
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from scheduler.types import EventStatus
from tests.conftest import ADMIN, T0
from tests.helpers import drain, event_row, post_event, rows
from tests.operations.support import loop_step, sign_in

BAD_FACTS = {"facts_version": "1", "scenario": "commitment_reminder", "date": "someday"}
LATER = T0 + timedelta(hours=1)


@pytest.mark.clause("CON-14")
@pytest.mark.clause("DEC-CANCEL-1")
def test_an_events_page_cancels_it_with_a_reason_and_the_cancel_is_audited(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-14: no CSRF token 403, no reason 422 (nothing changes); then cancelled, audited, in its history;
    a second cancel changes nothing (recorded with count 0, as every command records what it found)."""
    row = post_event(client, user_id="anna", trigger_at=LATER)
    csrf = sign_in(client)
    page = client.get(f"/console/events/{row['id']}").text
    assert 'id="cancel-form"' in page
    url = f"/console/events/{row['id']}/cancel"
    assert client.post(url, data={"reason": "x"}).status_code == 403
    assert client.post(url, data={"csrf": csrf, "reason": "  "}).status_code == 422
    assert event_row(engine, row["id"])["status"] == "pending"
    done = client.post(url, data={"csrf": csrf, "reason": "participant left the programme"}, follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, f"/console/events/{row['id']}?done=cancelled")
    assert event_row(engine, row["id"])["status"] == "cancelled"
    page = client.get(done.headers["location"]).text
    assert 'id="done"' in page and "participant left the programme" in page and 'id="cancel-form"' not in page
    [action] = client.get("/admin/audit", headers=ADMIN).json()
    assert (action["actor"], action["source"], action["action"], action["event_id"], action["count"]) == (
        "operator-ann", "console", "cancel", row["id"], 1)
    [history] = [h for h in client.get(f"/admin/scheduled-events/{row['id']}/history", headers=ADMIN).json()
                 if h["change"] == "cancelled"]
    assert history["actor"] == "operator-ann"
    again = client.post(url, data={"csrf": csrf, "reason": "twice"}, follow_redirects=False)
    assert again.headers["location"].endswith("?done=already-cancelled")
    second, first = client.get("/admin/audit", headers=ADMIN).json()  # the attempt is recorded, changing nothing
    assert (second["action"], second["count"], first["id"]) == ("cancel", 0, action["id"])
    assert client.post("/console/events/no-such-row/cancel", data={"csrf": csrf, "reason": "x"}).status_code == 404


@pytest.mark.clause("CON-14")
def test_a_dispatched_event_cannot_be_cancelled_from_its_page(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CON-14: a dispatched row offers no cancel, and a cancel posted anyway is 409 and changes
    nothing (the attempt recorded with count 0)."""
    row = post_event(client, user_id="anna")
    drain(service)
    csrf = sign_in(client)
    assert 'id="cancel-form"' not in client.get(f"/console/events/{row['id']}").text
    refused = client.post(f"/console/events/{row['id']}/cancel", data={"csrf": csrf, "reason": "too late"})
    assert refused.status_code == 409 and "already dispatched" in refused.text
    assert event_row(engine, row["id"])["status"] == "dispatched"
    assert rows(engine, "SELECT action, count FROM operator_actions") == [{"action": "cancel", "count": 0}]


@pytest.mark.clause("CON-15")
def test_cancel_by_filter_counts_first_needs_a_reason_and_cancels_what_was_counted(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-15: the dry run counts the pending and failed rows of the filter (not the dispatched one); without
    a reason nothing happens; with one they are cancelled, but a row stored again after the count is left alone."""
    [failed] = [post_event(client, user_id="mia", facts=BAD_FACTS)["id"]]
    sent = post_event(client, user_id="mia")["id"]
    drain(service)
    loop_step(service)
    waiting = [post_event(client, user_id="mia", external_key=f"mia-{n}", trigger_at=LATER)["id"] for n in range(3)]
    post_event(client, user_id="noah", trigger_at=LATER)  # outside the filter
    csrf = sign_in(client)
    listing = client.get("/console/events?user_id=mia").text
    assert 'href="/console/bulk-cancel?user_id=mia" id="bulk-cancel"' in listing
    dry = client.get("/console/bulk-cancel?user_id=mia")
    assert re.search(r'id="dry-run-count">4<', dry.text)
    as_of = re.search(r'name="as_of" value="([^"]+)"', dry.text)[1]  # type: ignore[index]
    form = {"csrf": csrf, "user_id": "mia", "as_of": as_of, "expected": "4"}
    assert client.post("/console/bulk-cancel", data={**form, "reason": " "}).status_code == 422
    assert client.post("/console/bulk-cancel", data={k: v for k, v in form.items() if k != "csrf"} | {
        "reason": "x"}).status_code == 403
    assert all(event_row(engine, i)["status"] == "pending" for i in waiting)
    clock.advance(timedelta(seconds=5))  # the sender posts one key again after the count
    post_event(client, user_id="mia", external_key="mia-2", trigger_at=LATER + timedelta(hours=1))
    done = client.post("/console/bulk-cancel", data={**form, "reason": "participant withdrew consent"})
    assert done.status_code == 200
    assert re.search(r'id="bulk-cancel-count">3<', done.text)
    assert [event_row(engine, i)["status"] for i in [failed, *waiting]] == ["cancelled"] * 3 + ["pending"]
    assert event_row(engine, sent)["status"] == "dispatched"
    [action] = client.get("/admin/audit", headers=ADMIN).json()
    assert (action["actor"], action["source"], action["action"], action["count"]) == (
        "operator-ann", "console", "bulk_cancel", 3)
    assert action["filter"] == {"user_id": "mia"} and action["reason"] == "participant withdrew consent"
    assert "participant withdrew consent" in client.get(f"/console/events/{waiting[0]}").text
    assert re.search(r'id="dry-run-count">0<', client.get("/console/bulk-cancel?user_id=mia&status=failed").text)


@pytest.mark.clause("CON-15")
@pytest.mark.clause("DEC-CANCEL-1")
def test_cancel_by_filter_works_in_chunks_up_to_the_cap_and_skips_rows_a_poll_holds(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CON-15: 25 pending rows in chunks of 10, capped at 20; a row locked by a running poll is
    skipped, not waited for."""
    ids = [post_event(client, user_id=f"user-{n:02d}", trigger_at=LATER)["id"] for n in range(25)]
    where = events.EventQuery(status=EventStatus.PENDING)
    assert commands.count_matching(service.database, where, commands.CANCELLABLE, cap=20) == 21  # "more than the cap"
    locked = sorted(ids)[0]
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM scheduled_events WHERE id = :id FOR UPDATE"), {"id": locked})
        result = commands.bulk_cancel(service.database, where, now=clock.now(), as_of=clock.now(), expected=25,
                                      actor=commands.Actor("ops", "cli"), reason="programme closed", cap=20, chunk=10)
        holder.rollback()
    assert (result.changed, result.chunks) == (20, 2)
    assert event_row(engine, locked)["status"] == "pending"
    linked = rows(engine, "SELECT event_id FROM operator_action_events WHERE action_id = :a", a=result.action_id)
    assert len(linked) == 20 and locked not in {r["event_id"] for r in linked}
    with pytest.raises(events.QueryError, match="reason"):
        commands.bulk_cancel(service.database, where, now=clock.now(), as_of=clock.now(), expected=5,
                             actor=commands.Actor("ops", "cli"), reason="  ")
