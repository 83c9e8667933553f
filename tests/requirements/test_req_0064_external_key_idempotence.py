"""REQ-0064 — ``external_key`` makes scheduling idempotent.

In our words: posting again with a key already stored rewrites that same row (event type,
participant, community, trigger time, facts) and resets it to ``pending`` with no
``dispatched_at`` and no ``last_error``, so a sender that retries, or recomputes a reminder,
owns one row. This holds even after the row was dispatched: it becomes pending and goes out
again, and only deduplication (REQ-0035) stops a second notification for the same period.
Without a key there is no idempotence: two identical posts are two rows.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import (
    event_body,
    event_row,
    later,
    post_event,
    reminder_facts,
    rows,
    wait_until_blocked_on_a_lock,
)


@pytest.mark.clause("REQ-0064.1")
def test_a_second_post_with_the_same_key_rewrites_the_same_row(client: TestClient, engine: Engine) -> None:
    """REQ-0064.1: same id; event type, participant, community, trigger time and facts all rewritten."""
    first = post_event(client, external_key="commitment-77")
    second = post_event(
        client,
        external_key="commitment-77",
        event_type="commitment_changed",
        user_id="participant-2",
        community_id="community-9",
        trigger_at=T0 + timedelta(days=1),
        facts=reminder_facts("2026-12-01", commitment="charge the car at 13:00"),
    )
    assert second["id"] == first["id"]
    stored = rows(engine, "SELECT * FROM scheduled_events")
    assert len(stored) == 1
    row = stored[0]
    assert (row["event_type"], row["user_id"], row["community_id"]) == (
        "commitment_changed", "participant-2", "community-9")
    assert row["trigger_at"] == T0 + timedelta(days=1)
    assert row["facts"]["commitment"] == "charge the car at 13:00"
    assert row["created_at"] == T0


@pytest.mark.clause("REQ-0064.2")
def test_a_repost_resets_a_failed_row_to_pending_without_its_error(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0064.2: a failed row re-posted is pending again, dispatched_at and last_error cleared."""
    stored = post_event(client, external_key="k-failed", facts=reminder_facts(day="soon"))
    clock.advance(later())
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "failed"
    again = post_event(client, external_key="k-failed", trigger_at=clock.now() + later())
    assert (again["status"], again["dispatched_at"], again["last_error"]) == ("pending", None, None)
    assert again["id"] == stored["id"]


@pytest.mark.clause("REQ-0064.2")
@pytest.mark.clause("REQ-0064.3")
def test_a_dispatched_row_reposted_goes_out_again_and_only_dedup_stops_a_second_notification(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0064.2, REQ-0064.3: re-posting a dispatched row makes it pending and it dispatches again;
    the same period is suppressed as a duplicate, a new period is sent."""
    stored = post_event(client, external_key="k-sent")
    clock.advance(later())
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "dispatched"

    same_period = post_event(client, external_key="k-sent", trigger_at=clock.now())
    assert (same_period["status"], same_period["dispatched_at"]) == ("pending", None)
    service.scheduler.poll_once()
    assert event_row(engine, stored["id"])["status"] == "dispatched"

    new_period = post_event(client, external_key="k-sent", trigger_at=clock.now(), facts=reminder_facts("2026-12-01"))
    assert new_period["status"] == "pending"
    service.scheduler.poll_once()

    notes = client.get("/admin/notifications", headers=ADMIN).json()
    assert sorted((n["time_scope"], n["status"], n["reason"]) for n in notes) == [
        ("2026-11-30", "sent", None),
        ("2026-11-30", "suppressed", "suppressed_dedup"),
        ("2026-12-01", "sent", None),
    ]


@pytest.mark.clause("REQ-0064.4")
def test_without_a_key_two_identical_posts_are_two_rows(client: TestClient, engine: Engine) -> None:
    """REQ-0064.4: the idempotence is opt-in."""
    first = post_event(client)
    second = post_event(client)
    assert first["id"] != second["id"]
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 2


@pytest.mark.clause("REQ-0064.5")
def test_twenty_concurrent_posts_with_one_new_key_give_one_row_and_twenty_201s(
    client: TestClient, engine: Engine
) -> None:
    """REQ-0064.5: the rewrite is one atomic statement; concurrent first posts never collide."""
    barrier = threading.Barrier(20, timeout=30)

    def post(i: int) -> tuple[int, str]:
        barrier.wait()
        response = client.post(
            "/admin/scheduled-events",
            headers=INGEST,
            json=event_body(external_key="race-key", facts=reminder_facts(commitment=f"version {i}")),
        )
        return response.status_code, response.json().get("id", response.text)

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(post, range(20)))
    assert [status for status, _ in results] == [201] * 20
    assert len({event_id for _, event_id in results}) == 1
    assert len(rows(engine, "SELECT id FROM scheduled_events WHERE external_key = 'race-key'")) == 1


@pytest.mark.clause("DEC-5")
@pytest.mark.clause("REQ-0064.6")
def test_a_repost_during_a_dispatch_waits_for_it_then_leaves_the_row_pending_with_the_new_content(
    client: TestClient, service: SchedulerService, clock: ManualClock, engine: Engine
) -> None:
    """REQ-0064.6: a row never runs twice at once; the re-post applies after the dispatch ends."""
    stored = post_event(client, external_key="k-busy")
    clock.advance(later())
    scheduler = service.scheduler
    batch = scheduler.claim()
    assert [e.id for e in batch.events] == [stored["id"]]
    scheduler.dispatch_next(batch)

    done = threading.Event()
    answer: dict[str, int] = {}

    def repost() -> None:
        response = client.post(
            "/admin/scheduled-events", headers=INGEST,
            json=event_body(external_key="k-busy", facts=reminder_facts(commitment="the new plan")),
        )
        answer["status"] = response.status_code
        done.set()

    thread = threading.Thread(target=repost)
    thread.start()
    wait_until_blocked_on_a_lock(engine)
    assert not done.is_set()
    scheduler.finish(batch)
    thread.join(timeout=30)
    assert answer == {"status": 201}
    row = event_row(engine, stored["id"])
    assert (row["status"], row["dispatched_at"], row["facts"]["commitment"]) == ("pending", None, "the new plan")
    dispatched_again: list[DigitalTwinEvent] = []
    original = scheduler.dispatcher
    scheduler.dispatcher = lambda s, e, n: dispatched_again.append(e) or original(s, e, n)  # type: ignore[func-returns-value]
    scheduler.poll_once()
    assert [e.facts["commitment"] for e in dispatched_again] == ["the new plan"]

