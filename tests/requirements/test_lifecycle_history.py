"""HIST — every change of a scheduled event, kept in order (history).

In our words: each change of a row (stored, rewritten by key with what changed, dispatched,
failed, reset, cancelled) is appended to ``scheduled_event_history`` in the same transaction
as the change, with the token's subject when a token made it. A change that rolls back
leaves no entry; a change made outside the service (any SQL writer) still leaves one.
``GET /admin/scheduled-events/{id}/history`` and ``scheduler events history ID`` show it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, T0, bearer
from tests.helpers import later, post_event, reminder_facts
from tests.operations.support import sign_in


def history(client: TestClient, event_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/admin/scheduled-events/{event_id}/history", headers=ADMIN)
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    return entries


@pytest.mark.clause("HIST-1")
def test_the_whole_life_of_a_reminder_is_in_its_history_in_order(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """HIST-1: stored, rewritten (trigger_at before and after), failed, reset, dispatched,
    cancelled after a re-post: each with its status, time and actor."""
    sender = bearer("nudging.ingest", subject="sender-app")
    operator = bearer("nudging.admin", subject="operator-ann")
    body = {"event_type": "commitment_reminder", "user_id": "participant-1", "external_key": "k-life",
            "trigger_at": T0.isoformat(), "facts": reminder_facts(day="soon")}
    stored = client.post("/admin/scheduled-events", headers=sender, json=body).json()
    clock.advance(timedelta(minutes=5))
    moved = {**body, "trigger_at": (T0 + timedelta(minutes=30)).isoformat()}
    client.post("/admin/scheduled-events", headers=sender, json=moved)
    clock.advance(later())
    service.scheduler.poll_once()  # the facts' day is unusable: failed
    fixed = {**moved, "facts": reminder_facts()}
    client.post("/admin/scheduled-events", headers=sender, json=fixed)
    client.post(f"/admin/scheduled-events/{stored['id']}/reset", headers=operator)
    service.scheduler.poll_once()  # dispatched
    client.post("/admin/scheduled-events", headers=sender, json=fixed)  # re-armed
    client.delete("/admin/scheduled-events/by-key/k-life", headers=operator)

    entries = history(client, stored["id"])
    assert [(e["change"], e["status"], e["actor"]) for e in entries] == [
        ("stored", "pending", "sender-app"),
        ("rewritten", "pending", "sender-app"),
        ("failed", "failed", None),
        ("rewritten", "pending", "sender-app"),
        ("reset", "pending", "operator-ann"),
        ("dispatched", "dispatched", None),
        ("rewritten", "pending", "sender-app"),
        ("cancelled", "cancelled", "operator-ann"),
    ]
    assert entries[0]["at"] == T0.isoformat()
    assert entries[1]["changes"] == {"trigger_at": [T0.isoformat(), (T0 + timedelta(minutes=30)).isoformat()]}
    assert entries[1]["at"] == (T0 + timedelta(minutes=5)).isoformat()
    assert entries[2]["changes"]["status"] == ["pending", "failed"]
    assert entries[2]["changes"]["last_error"][1].startswith("missing_or_invalid_time_scope")
    assert entries[3]["changes"]["facts"][1]["date"] == "2026-11-30"
    assert entries[3]["changes"]["status"] == ["failed", "pending"]
    assert entries[5]["changes"] == {"status": ["pending", "dispatched"]}


@pytest.mark.clause("HIST-2")
@pytest.mark.clause("DEC-LIFE-1")
def test_a_batch_that_rolls_back_leaves_no_history_and_any_sql_writer_leaves_some(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """HIST-2, DEC-LIFE-1: history shares the change's transaction: an aborted batch adds nothing; a raw
    UPDATE from outside the service is recorded all the same (the trigger cannot be skipped)."""
    stored = post_event(client)
    clock.advance(later())
    scheduler = service.scheduler
    batch = scheduler.claim()
    scheduler.dispatch_next(batch)
    scheduler.abort(batch)
    assert [e["change"] for e in history(client, stored["id"])] == ["stored"]
    with engine.begin() as conn:
        conn.execute(text("UPDATE scheduled_events SET trigger_at = trigger_at + interval '1 day', "
                          "updated_at = :now WHERE id = :id"), {"now": clock.now(), "id": stored["id"]})
    last = history(client, stored["id"])[-1]
    assert (last["change"], last["actor"], list(last["changes"])) == ("updated", None, ["trigger_at"])


@pytest.mark.clause("HIST-3")
def test_history_needs_admin_and_an_unknown_id_is_404(client: TestClient) -> None:
    """HIST-3: an ingest token is 403; an id that never existed is 404."""
    stored = post_event(client)
    assert client.get(f"/admin/scheduled-events/{stored['id']}/history", headers=INGEST).status_code == 403
    response = client.get("/admin/scheduled-events/no-such-id/history", headers=ADMIN)
    assert (response.status_code, response.json()["detail"]) == (404, "no scheduled event with that id")


@pytest.mark.clause("HIST-3")
@pytest.mark.clause("LIFE-8")
def test_the_cli_cancels_by_key_and_prints_the_history(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: TestClient,
    service: SchedulerService, clock: ManualClock, database_url: str,
) -> None:
    """HIST-3, LIFE-8: ``scheduler events cancel --key`` then ``events history`` (text and JSON);
    a dispatched row and an unknown id exit 1."""
    stored = post_event(client, external_key="k-cli")
    sent = post_event(client, user_id="participant-2")
    clock.advance(later())
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["events", "list", "--external-key", "k-cli", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [stored["id"]]
    assert main(["events", "cancel", "--key", "k-cli"]) == 0
    assert "is cancelled" in capsys.readouterr().out
    assert main(["events", "cancel", stored["id"]]) == 0
    assert "already was" in capsys.readouterr().out
    service.scheduler.poll_once()
    assert main(["events", "cancel", sent["id"]]) == 1
    assert "stays dispatched" in capsys.readouterr().err
    assert main(["events", "history", stored["id"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["stored", "cancelled"]
    assert "by cli:" in lines[1]
    assert main(["events", "history", stored["id"], "--json"]) == 0
    assert [e["status"] for e in json.loads(capsys.readouterr().out)] == ["pending", "cancelled"]
    assert main(["events", "history", "no-such-id"]) == 1


@pytest.mark.clause("HIST-3")
def test_the_consoles_event_page_shows_the_rows_changes(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """HIST-3: the console's detail page lists each change with who made it and what changed."""
    stored = post_event(client, external_key="k-console")
    clock.advance(timedelta(minutes=5))
    moved = client.post("/admin/scheduled-events", headers=bearer("nudging.ingest", subject="sender-app"),
                        json={"event_type": "commitment_reminder", "user_id": "participant-1",
                              "external_key": "k-console", "trigger_at": (T0 + later()).isoformat(),
                              "facts": reminder_facts()})
    assert moved.status_code == 201
    sign_in(client)
    page = client.get(f"/console/events/{stored['id']}")
    assert page.status_code == 200, page.text
    changes = page.text.split('<table id="changes">', 1)[1].split("</table>", 1)[0]
    assert changes.count("<tr><td>") == 2
    assert "rewritten" in changes and "sender-app" in changes and "trigger_at" in changes


HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> "quoted" \'single\''


@pytest.mark.clause("HIST-3")
def test_the_consoles_history_of_a_hostile_rewrite_shows_it_as_text(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """HIST-3: a re-post by key whose facts hold script and markup, by a sender whose token's
    subject does too: the event page's history shows both changes and the actor escaped, as
    text; no tag of them reaches the page."""
    stored = post_event(client, external_key="k-hostile")
    clock.advance(timedelta(minutes=5))
    sender = bearer("nudging.ingest", subject=HOSTILE)
    moved = client.post("/admin/scheduled-events", headers=sender, json={
        "event_type": "commitment_reminder", "user_id": "participant-1", "external_key": "k-hostile",
        "trigger_at": T0.isoformat(), "facts": reminder_facts(commitment=HOSTILE)})
    assert moved.status_code == 201, moved.text
    sign_in(client)
    page = client.get(f"/console/events/{stored['id']}")
    assert page.status_code == 200, page.text
    changes = page.text.split('<table id="changes">', 1)[1].split("</table>", 1)[0]
    assert "rewritten" in changes and "facts" in changes
    assert "<script" not in changes and "<img" not in changes
    assert changes.count("&lt;script&gt;window.__pwned = 1&lt;/script&gt;") == 2  # the new facts, and the actor
    assert "<script" not in page.text.split("</main>")[0].split("<main")[-1]


@pytest.mark.clause("HIST-1")
@pytest.mark.clause("HIST-3")
def test_each_rows_history_holds_its_own_changes_only_among_rows_changed_at_the_same_instants(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """HIST-1, HIST-3: three rows of two participants change in turn, several at one instant of
    the clock and by different actors (stored, rewritten, dispatched, failed, reset, cancelled).
    The history of each, from the API and on the console's event page, lists that row's changes
    only, in the order they happened, with their own actors: none of its neighbours'."""
    sender, operator = bearer("nudging.ingest", subject="sender-app"), bearer("nudging.admin", subject="op-ann")

    def post(user: str, key: str, **facts: Any) -> str:
        body = {"event_type": "commitment_reminder", "user_id": user, "external_key": key,
                "trigger_at": T0.isoformat(), "facts": reminder_facts(**facts)}
        answer = client.post("/admin/scheduled-events", headers=sender, json=body)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    a = post("participant-1", "k-a")
    b = post("participant-2", "k-b", day="soon")  # fails: an unusable day
    c = post("participant-1", "k-c", day="2026-12-01")
    post("participant-1", "k-a", commitment="water the plants")  # a's rewrite, same instant as the stores
    clock.advance(timedelta(minutes=1))
    assert service.scheduler.poll_once().claimed == 3  # a and c dispatched, b failed: one instant
    assert client.post(f"/admin/scheduled-events/{b}/reset", headers=operator).status_code == 200
    assert client.delete("/admin/scheduled-events/by-key/k-b", headers=sender).status_code == 200
    expected = {
        a: [("stored", "sender-app"), ("rewritten", "sender-app"), ("dispatched", None)],
        b: [("stored", "sender-app"), ("failed", None), ("reset", "op-ann"), ("cancelled", "sender-app")],
        c: [("stored", "sender-app"), ("dispatched", None)],
    }
    sign_in(client)
    for event_id, changes in expected.items():
        entries = history(client, event_id)
        assert [(e["change"], e["actor"]) for e in entries] == changes, event_id
        assert {e["event_id"] for e in entries} == {event_id}
        page = client.get(f"/console/events/{event_id}")
        assert page.status_code == 200, page.text
        table = page.text.split('<table id="changes">', 1)[1].split("</table>", 1)[0]
        assert table.count("<tr><td>") == len(changes), (event_id, table)


@pytest.mark.clause("HIST-1")
def test_a_bulk_action_in_several_chunks_names_its_change_and_operator_in_every_rows_history(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """HIST-1: a bulk cancel of five pending rows and a bulk reset of five failed rows, each
    in chunks of two (three transactions each): every row's newest entry is `reset` or
    `cancelled` by the operator, whichever chunk's transaction changed it (not an anonymous
    `updated` for the chunks after the first)."""
    from scheduler.application import commands
    from scheduler.application.events import EventQuery
    from scheduler.types import EventStatus

    failing = [post_event(client, user_id=f"f-{n}", facts=reminder_facts(day="soon"))["id"] for n in range(5)]
    waiting = [post_event(client, user_id=f"w-{n}", trigger_at=T0 + later(24))["id"] for n in range(5)]
    clock.advance(later())
    assert service.scheduler.poll_once().failed == 5
    operator = commands.Actor("op-zoë", "cli")
    for command, status in ((commands.bulk_cancel, EventStatus.PENDING), (commands.bulk_reset, EventStatus.FAILED)):
        result = command(service.database, EventQuery(status=status), now=clock.now(), as_of=clock.now(),
                         expected=5, actor=operator, reason="audit", chunk=2)
        assert (result.changed, result.chunks) == (5, 3)
    for ids, change in ((failing, "reset"), (waiting, "cancelled")):
        for event_id in ids:
            last = history(client, event_id)[-1]
            assert (last["change"], last["actor"], last["at"]) == (change, "op-zoë", clock.now().isoformat()), event_id
