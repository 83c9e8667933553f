"""LIFE — a sender withdraws a scheduled event (cancel).

In our words: ``DELETE /admin/scheduled-events/{id}`` or ``.../by-key/{external_key}``
(ingest permission) puts a pending or failed row in the terminal status ``cancelled`` and
answers the row. The claim never takes a cancelled row. A dispatched row cannot be
cancelled (409, it stays dispatched); cancelling twice answers the same row. Re-posting the
key re-arms the row (REQ-0064). A cancel that races a dispatch of the same row waits for
that batch and then finds it dispatched, or commits first and the row is never claimed:
never both. ``GET /admin/scheduled-events?external_key=`` finds a row by its key.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, PARTICIPANT
from tests.helpers import (
    event_row,
    later,
    post_event,
    reminder_facts,
    rows,
    wait_until_blocked_on_a_lock,
)


@pytest.mark.clause("LIFE-1")
def test_cancelling_a_pending_row_by_id_answers_it_cancelled(client: TestClient, engine: Engine) -> None:
    """LIFE-1: 200 with the row, status cancelled, by id."""
    stored = post_event(client)
    response = client.delete(f"/admin/scheduled-events/{stored['id']}", headers=INGEST)
    assert response.status_code == 200, response.text
    assert (response.json()["id"], response.json()["status"]) == (stored["id"], "cancelled")
    assert event_row(engine, stored["id"])["status"] == "cancelled"


@pytest.mark.clause("LIFE-1")
def test_cancelling_a_failed_row_by_its_key_keeps_its_error_for_the_record(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-1: a failed row is cancelled by its key; its last_error stays as the record."""
    stored = post_event(client, external_key="commitment-9", facts=reminder_facts(day="soon"))
    clock.advance(later())
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "failed"
    response = client.delete("/admin/scheduled-events/by-key/commitment-9", headers=INGEST)
    assert response.status_code == 200, response.text
    row = response.json()
    assert (row["id"], row["status"], row["dispatched_at"]) == (stored["id"], "cancelled", None)
    assert "missing_or_invalid_time_scope" in row["last_error"]


@pytest.mark.clause("LIFE-1")
def test_cancel_needs_the_ingest_permission_and_an_unknown_row_is_404(client: TestClient) -> None:
    """LIFE-1: a participant's token is 403; an unknown id or key is 404 with a detail."""
    stored = post_event(client, external_key="k-perm")
    assert client.delete(f"/admin/scheduled-events/{stored['id']}", headers=PARTICIPANT).status_code == 403
    for path in ("/admin/scheduled-events/no-such-id", "/admin/scheduled-events/by-key/no-such-key"):
        response = client.delete(path, headers=ADMIN)
        assert response.status_code == 404
        assert response.json()["detail"] == "no scheduled event with that id or key"


@pytest.mark.clause("LIFE-2")
def test_the_claim_never_takes_a_cancelled_row(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-2: a cancelled due row stays cancelled through polls; the others dispatch."""
    kept = post_event(client, user_id="participant-1")
    withdrawn = post_event(client, user_id="participant-2")
    assert client.delete(f"/admin/scheduled-events/{withdrawn['id']}", headers=INGEST).status_code == 200
    clock.advance(later())
    report = service.scheduler.poll_once()
    assert [o.id for o in report.outcomes] == [kept["id"]]
    assert service.scheduler.poll_once().claimed == 0
    assert event_row(engine, withdrawn["id"])["status"] == "cancelled"
    assert rows(engine, "SELECT id FROM notifications WHERE user_id = 'participant-2'") == []


@pytest.mark.clause("LIFE-3")
def test_cancelling_a_dispatched_row_is_409_and_it_stays_dispatched(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-3: 409 naming the reason, with the row; nothing changes."""
    stored = post_event(client, external_key="k-sent")
    clock.advance(later())
    service.scheduler.poll_once()
    before = event_row(engine, stored["id"])
    for path in (f"/admin/scheduled-events/{stored['id']}", "/admin/scheduled-events/by-key/k-sent"):
        response = client.delete(path, headers=INGEST)
        assert response.status_code == 409
        assert response.json()["detail"].startswith("already dispatched")
        assert response.json()["event"]["status"] == "dispatched"
    assert event_row(engine, stored["id"]) == before


@pytest.mark.clause("LIFE-4")
def test_cancelling_twice_answers_the_same_row_and_writes_nothing_more(
    client: TestClient, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-4: the second cancel is a 200 with the same row (same updated_at); one history entry."""
    stored = post_event(client)
    first = client.delete(f"/admin/scheduled-events/{stored['id']}", headers=INGEST).json()
    clock.advance(later())
    second = client.delete(f"/admin/scheduled-events/{stored['id']}", headers=INGEST)
    assert second.status_code == 200
    assert second.json() == first
    changes = [r["change"] for r in rows(engine, "SELECT change FROM scheduled_event_history ORDER BY id")]
    assert changes == ["stored", "cancelled"]


@pytest.mark.clause("LIFE-5")
def test_a_repost_of_the_key_rearms_a_cancelled_row(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-5: the same row is pending again with the new content and goes out."""
    stored = post_event(client, external_key="k-again")
    client.delete("/admin/scheduled-events/by-key/k-again", headers=INGEST)
    again = post_event(client, external_key="k-again", facts=reminder_facts(commitment="the new plan"))
    assert (again["id"], again["status"]) == (stored["id"], "pending")
    clock.advance(later())
    assert [o.status for o in service.scheduler.poll_once().outcomes] == ["dispatched"]


@pytest.mark.clause("LIFE-6")
def test_a_cancel_racing_a_dispatch_waits_for_the_batch_then_finds_it_dispatched(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-6: the cancel blocks on the batch's row lock, then answers 409; the row is dispatched only."""
    stored = post_event(client, external_key="k-race")
    clock.advance(later())
    scheduler = service.scheduler
    batch = scheduler.claim()
    scheduler.dispatch_next(batch)
    answer: dict[str, int] = {}

    def cancel() -> None:
        answer["status"] = client.delete("/admin/scheduled-events/by-key/k-race", headers=INGEST).status_code

    thread = threading.Thread(target=cancel)
    thread.start()
    wait_until_blocked_on_a_lock(engine)
    assert answer == {}
    scheduler.finish(batch)
    thread.join(timeout=30)
    assert answer == {"status": 409}
    assert event_row(engine, stored["id"])["status"] == "dispatched"


@pytest.mark.clause("LIFE-6")
def test_a_cancel_racing_a_batch_that_rolls_back_cancels_the_row_and_no_claim_takes_it(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """LIFE-6: the batch aborts (a crash): the waiting cancel then wins and the row never goes out."""
    stored = post_event(client)
    clock.advance(later())
    scheduler = service.scheduler
    batch = scheduler.claim()
    scheduler.dispatch_next(batch)
    answer: dict[str, int] = {}

    def cancel() -> None:
        answer["status"] = client.delete(f"/admin/scheduled-events/{stored['id']}", headers=INGEST).status_code

    thread = threading.Thread(target=cancel)
    thread.start()
    wait_until_blocked_on_a_lock(engine)
    scheduler.abort(batch)
    thread.join(timeout=30)
    assert answer == {"status": 200}
    assert scheduler.poll_once().claimed == 0
    assert event_row(engine, stored["id"])["status"] == "cancelled"
    assert rows(engine, "SELECT id FROM notifications") == []


@pytest.mark.clause("LIFE-7")
def test_an_operator_finds_a_row_by_its_external_key(client: TestClient) -> None:
    """LIFE-7: ?external_key= gives exactly that row; an unknown key gives none."""
    wanted = post_event(client, external_key="commitment-42")
    post_event(client, external_key="commitment-43")
    found = client.get("/admin/scheduled-events?external_key=commitment-42", headers=ADMIN).json()
    assert [r["id"] for r in found] == [wanted["id"]]
    assert client.get("/admin/scheduled-events?external_key=nope", headers=ADMIN).json() == []
    cancelled = client.get("/admin/scheduled-events?status=cancelled", headers=ADMIN)
    assert cancelled.status_code == 200


# Keys a sender may choose (any non-empty string without NUL): a slash, percent signs and
# LIKE wildcards, quotes and markup, non-ASCII, spaces, query and fragment characters. Each
# has a decoy beside it that a pattern match, a prefix match or a decoding slip would take.
HARD_KEYS = {
    "orders/42": "orders",
    "50%_off": "50xxoff",
    "rappel-été ☀ 7": "rappel-ete 7",
    "a'b\"c<d>": "a'b",
    "k?x=1#frag": "k",
    "x%2Fy": "x/y",
}


@pytest.mark.clause("LIFE-1")
@pytest.mark.clause("LIFE-7")
def test_a_key_with_slashes_wildcards_quotes_or_non_ascii_cancels_and_finds_exactly_its_row(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """LIFE-1, LIFE-7: the key is the sender's own string. Whatever it holds (a slash, `%` and
    `_`, quotes, markup, non-ASCII, `?` and `#`, an encoded slash), `?external_key=` finds exactly
    its row and `DELETE .../by-key/{key}` (the key percent-encoded in the path, sent to a real
    server: Starlette's TestClient decodes a path twice) cancels exactly that row: never a 404
    for a stored key, never the decoy beside it."""
    from urllib.parse import quote

    import httpx

    from tests.servers import serve

    stored = {key: post_event(client, user_id=f"p-{n}", external_key=key)["id"] for n, key in enumerate(HARD_KEYS)}
    decoys = {key: post_event(client, user_id=f"d-{n}", external_key=decoy)["id"]
              for n, (key, decoy) in enumerate(HARD_KEYS.items())}
    with serve(service) as base, httpx.Client(base_url=base, timeout=10) as http:
        for key, event_id in stored.items():
            found = http.get("/admin/scheduled-events", params={"external_key": key}, headers=dict(ADMIN))
            assert [r["id"] for r in found.json()] == [event_id], key
            response = http.delete(f"/admin/scheduled-events/by-key/{quote(key, safe='')}", headers=dict(INGEST))
            assert response.status_code == 200, (key, response.status_code, response.text)
            assert (response.json()["id"], response.json()["external_key"]) == (event_id, key)
    assert {event_row(engine, i)["status"] for i in stored.values()} == {"cancelled"}
    assert {event_row(engine, i)["status"] for i in decoys.values()} == {"pending"}


@pytest.mark.clause("LIFE-4")
def test_two_cancels_racing_on_one_row_both_answer_it_and_it_is_cancelled_once(
    client: TestClient, engine: Engine
) -> None:
    """LIFE-4: two senders cancel the same row at the same moment (both wait on a third session
    holding the row, then go at once): both answer 200 with the same cancelled row, and the row
    is cancelled once: one `cancelled` history entry, one operator action that changed it."""
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import text

    stored = post_event(client, external_key="k-twice")
    paths = [f"/admin/scheduled-events/{stored['id']}", "/admin/scheduled-events/by-key/k-twice"]
    with engine.connect() as holder, ThreadPoolExecutor(max_workers=2) as pool:
        holder.execute(text("SELECT 1 FROM scheduled_events WHERE id = :id FOR UPDATE"), {"id": stored["id"]})
        answers = [pool.submit(client.delete, path, headers=INGEST) for path in paths]
        wait_until_blocked_on_a_lock(engine, count=2)  # both cancels wait on the row
        holder.rollback()
        results = [answer.result(timeout=30) for answer in answers]
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    assert results[0].json() == results[1].json()
    assert results[0].json()["status"] == "cancelled"
    changes = [r["change"] for r in rows(engine, "SELECT change FROM scheduled_event_history "
                                                 "WHERE event_id = :id ORDER BY id", id=stored["id"])]
    assert changes == ["stored", "cancelled"]
    counts = [r["count"] for r in rows(engine, "SELECT count FROM operator_actions WHERE action = 'cancel'")]
    assert sorted(counts) == [0, 1]
