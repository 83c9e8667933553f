"""Decisions: what the seed leaves open, decided and pinned (see specs/decisions.md)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import dispatch_all, post_event, reminder_facts, rows, statuses


@pytest.mark.clause("DEC-2")
@pytest.mark.clause("BUSY-1")
def test_replicas_whose_batches_share_participants_in_opposite_order_never_deadlock(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """DEC-2: a claim only try-locks participants, so a batch whose participants another batch
    holds neither waits nor deadlocks: it leaves their rows pending, and a later poll takes them."""
    # Replica A's batch: u1 then u2; replica B would take u2 then u1 (later triggers).
    for minute, user in enumerate(["u1", "u2", "u2", "u1"]):
        post_event(client, user_id=user, trigger_at=T0 - timedelta(minutes=10 - minute),
                   facts=reminder_facts(f"2026-11-{20 + minute}"))
    a = Scheduler(service.database, service.dispatcher, clock, batch_size=2, name="A")
    b = Scheduler(service.database, service.dispatcher, clock, batch_size=2, name="B")
    batch_a = a.claim()
    assert [e.user_id for e in batch_a.events] == ["u1", "u2"]
    report_b = b.poll_once()  # returns at once: both participants are busy in A's batch
    assert (report_b.claimed, report_b.skipped) == (0, 2)
    assert sorted(statuses(engine).values()) == ["pending"] * 4
    dispatch_all(a, batch_a)
    a.finish(batch_a)
    report_b = b.poll_once()
    assert [o.status for o in report_b.outcomes] == ["dispatched", "dispatched"]
    assert set(statuses(engine).values()) == {"dispatched"}
    assert len(rows(engine, "SELECT id FROM notifications WHERE status = 'sent'")) == 4


@pytest.mark.clause("DEC-3")
def test_a_dedup_key_belongs_to_the_first_notification_whatever_became_of_it(client: TestClient) -> None:
    """DEC-3: a suppressed notification (kind disabled) still claims its key, so re-enabling the
    kind does not resend that period: one notification per key, ever."""
    body = {"event_type": "t", "user_id": "p1", "facts": reminder_facts()}
    client.put("/admin/participants/p1/preferences", headers=ADMIN, json={"enabled_kinds": []})
    assert client.post("/admin/ingest-event", headers=INGEST, json=body).status_code == 202
    client.put("/admin/participants/p1/preferences", headers=ADMIN, json={"enabled_kinds": None})
    assert client.post("/admin/ingest-event", headers=INGEST, json=body).status_code == 409


@pytest.mark.clause("DEC-7")
def test_a_stop_mid_batch_commits_what_was_dispatched_and_releases_the_rest_pending(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-7: stopping between events finishes the batch early: done rows commit, untouched rows
    stay pending, unlocked, for the next poll (of any replica)."""
    posted = [post_event(client, user_id=f"u{i}", trigger_at=T0 - timedelta(minutes=5 - i)) for i in range(5)]
    stop = threading.Event()
    scheduler = service.scheduler
    real = scheduler.dispatcher

    def dispatch_then_stop(session, event, now):  # type: ignore[no-untyped-def]
        result = real(session, event, now)
        stop.set()
        return result

    scheduler.dispatcher = dispatch_then_stop
    report = scheduler.poll_once(stop.is_set)
    assert (report.claimed, report.dispatched) == (5, 1)
    assert statuses(engine) == {r["id"]: ("dispatched" if i == 0 else "pending") for i, r in enumerate(posted)}
    scheduler.dispatcher = real
    assert scheduler.poll_once().dispatched == 4
    assert len(rows(engine, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")) == 0
