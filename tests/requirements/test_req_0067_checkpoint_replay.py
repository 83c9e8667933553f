"""REQ-0067 — one failing event does not take the batch with it, at the price of one savepoint per batch.

In our words: whatever one event raises, only its own work is undone, its row ends
``failed`` with the error, and every other event of the batch ends exactly as if each had
run inside a savepoint of its own. The loop gets there without a savepoint per event
(DEC-1): the batch runs under one checkpoint savepoint taken after the claim; a failure
rolls back to it and replays the events since it, one savepoint each. These tests pin
what that must not change: each earlier event's effects exist once (never twice, never
lost), nothing the failing event wrote survives, and the claim's row and participant
locks stay held through the rollback and the replay, even for rows updated inside the
rolled-back part (so no other replica can claim them in that window).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.core.loop import Scheduler
from scheduler.database.database import Database
from scheduler.database.events import participant_lock_key
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.types import DeclaredDispatcher, DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.conftest import T0
from tests.helpers import FakeDispatcher, event_row, post_event, rows


def batch_of_five(client: TestClient) -> list[dict[str, Any]]:
    """Five due rows for five participants, in trigger order (``user-0`` first)."""
    return [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=10 - i)) for i in range(5)]


def effects(engine: Engine) -> dict[str, list[str]]:
    """Every committed effect of the dispatch path, per table, as sorted user ids."""
    return {
        "sent": sorted(r["user_id"] for r in rows(engine, "SELECT user_id FROM notifications WHERE status = 'sent'")),
        "other_notifications": sorted(
            f"{r['user_id']}:{r['reason']}" for r in rows(engine, "SELECT user_id, reason FROM notifications "
                                                                  "WHERE status <> 'sent'")),
        "deliveries": sorted(r["user_id"] for r in rows(engine, "SELECT user_id FROM deliveries")),
        "dedup_keys": [str(r["n"]) for r in rows(engine, "SELECT count(*) AS n FROM dedup_keys")],
    }


@pytest.mark.clause("DEC-1")
@pytest.mark.clause("REQ-0067.2")
def test_a_failure_mid_batch_replays_the_events_before_it_and_each_takes_effect_exactly_once(
    client: TestClient, service: SchedulerService, engine: Engine, publisher: RecordingPublisher
) -> None:
    """REQ-0067.2, DEC-1: the third event raises; the two before it are rolled back to the checkpoint
    and replayed, the failing one runs again alone, the two after it run optimistically; every
    other participant ends with one notification, one delivery, one key and one push."""
    posted = batch_of_five(client)
    fake = FakeDispatcher(service.dispatcher, {"user-2": ValueError("evaluator blew up")})
    scheduler = service.scheduler
    scheduler.dispatcher = fake
    batch = scheduler.claim()
    outcomes = [scheduler.dispatch_next(batch) for _ in range(5)]
    assert batch.replayed == 3  # user-0 and user-1 again, then user-2 in a savepoint of its own
    report = scheduler.finish(batch)
    assert [o.status if o else None for o in outcomes] == [
        "dispatched", "dispatched", "failed", "dispatched", "dispatched"]
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "failed", "dispatched", "dispatched"]
    assert [e.user_id for e in fake.seen] == [
        "user-0", "user-1", "user-2", "user-0", "user-1", "user-2", "user-3", "user-4"]
    others = ["user-0", "user-1", "user-3", "user-4"]
    assert effects(engine) == {"sent": others, "other_notifications": [], "deliveries": others, "dedup_keys": ["4"]}
    assert sorted(m.user_id for m in publisher.messages) == others  # the rolled-back attempts' pushes are gone
    failed = event_row(engine, posted[2]["id"])
    assert (failed["status"], failed["dispatched_at"], failed["last_error"]) == (
        "failed", None, "ValueError: evaluator blew up")
    for stored in posted[:2] + posted[3:]:
        row = event_row(engine, stored["id"])
        assert (row["status"], row["dispatched_at"], row["last_error"]) == ("dispatched", T0, None)


class UpdatingProbingDispatcher(DeclaredDispatcher):
    """A fake dispatcher that rewrites its own row inside the batch (so the claimed rows are
    updated in the part a failure rolls back), fails for one participant, and, on the first
    call after that failure (the replay), probes the batch's locks from another connection."""

    # declared safe to repeat, so that its batches replay (DEC-1.4)
    safe_to_repeat = True

    def __init__(self, real: Any, victim: str, probe_engine: Engine, ids: list[str], users: list[str]) -> None:
        self.real, self.victim, self.probe_engine, self.ids, self.users = real, victim, probe_engine, ids, users
        self.failed = False
        self.probes: dict[str, Any] = {}

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if self.failed and not self.probes:
            self.probes = self.probe()
        session.execute(text("UPDATE scheduled_events SET updated_at = :now WHERE id = :id"),
                        {"now": now, "id": event.scheduled_event_id})
        result: DispatchResult = self.real(session, event, now)
        if event.user_id == self.victim:
            self.failed = True
            session.execute(text("SELECT 1 / 0"))  # a database error: the transaction is aborted
        return result

    def probe(self) -> dict[str, Any]:
        """What another replica's connection can take of the batch's rows and participants now."""
        found: dict[str, Any] = {}
        with self.probe_engine.connect() as conn:
            found["skip_locked"] = conn.execute(
                text("SELECT id FROM scheduled_events WHERE id = ANY(:ids) FOR UPDATE SKIP LOCKED"),
                {"ids": self.ids}).scalars().all()
            conn.rollback()
            try:
                conn.execute(text("SELECT id FROM scheduled_events WHERE id = ANY(:ids) FOR UPDATE NOWAIT"),
                             {"ids": self.ids})
                found["nowait"] = "acquired"
            except OperationalError as exc:
                found["nowait"] = type(exc.orig).__name__
            conn.rollback()
            found["advisory"] = [
                conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": participant_lock_key(u)}).scalar_one()
                for u in self.users
            ]
            conn.rollback()
        return found


@pytest.mark.clause("DEC-1")
@pytest.mark.clause("REQ-0067.3")
def test_the_claims_row_and_participant_locks_hold_through_the_rollback_to_the_checkpoint(
    client: TestClient, service: SchedulerService, engine: Engine, database_url: str
) -> None:
    """REQ-0067.3, DEC-1: every event updates its own claimed row under the checkpoint; the fourth
    raises a database error and the batch rolls back to the checkpoint. During the replay another
    connection can lock none of the five rows (SKIP LOCKED finds none, NOWAIT fails) and none of
    the five participants, and a second replica's claim gets nothing: the rollback released none of
    the claim's locks, not even on the rows updated in the rolled-back part."""
    posted = batch_of_five(client)
    ids = [p["id"] for p in posted]
    other = Database(engine)
    probing = UpdatingProbingDispatcher(service.dispatcher, "user-3", engine, ids, [f"user-{i}" for i in range(5)])
    scheduler = service.scheduler
    scheduler.dispatcher = probing
    rival = Scheduler(other, service.dispatcher, scheduler.clock, name="rival")
    batch = scheduler.claim()
    for _ in range(4):
        scheduler.dispatch_next(batch)
    assert probing.probes == {"skip_locked": [], "nowait": "LockNotAvailable", "advisory": [False] * 5}
    rival_batch = rival.claim()  # in the window between the replay and the commit
    assert rival_batch.events == []
    rival.finish(rival_batch)
    scheduler.dispatch_next(batch)
    report = scheduler.finish(batch)
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "dispatched", "failed", "dispatched"]
    assert event_row(engine, ids[3])["last_error"].startswith("DataError")
    assert effects(engine)["sent"] == ["user-0", "user-1", "user-2", "user-4"]


class WriteThenRefuse:
    """A fake dispatcher that writes a deduplication key, then refuses the victim's event."""

    def __init__(self, real: Any, victim: str) -> None:
        self.real, self.victim = real, victim

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        if event.user_id == self.victim:
            session.execute(text("INSERT INTO dedup_keys (key, notification_id, created_at) "
                                 "VALUES ('refused-write', 'n', :now)"), {"now": now})
            return DispatchResult(outcome=DispatchOutcome.INVALID_EVENT, refusal="invalid_facts: no commitment")
        result: DispatchResult = self.real(session, event, now)
        return result


@pytest.mark.clause("DEC-8")
def test_a_refusal_mid_batch_keeps_nothing_it_wrote_and_every_other_event_once(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-8: a refused event's writes roll back with the checkpoint; the events before it, replayed,
    and after it take effect once each; the refused row is failed with the refusal."""
    posted = batch_of_five(client)
    service.scheduler.dispatcher = WriteThenRefuse(service.dispatcher, "user-1")
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["dispatched", "failed", "dispatched", "dispatched", "dispatched"]
    assert event_row(engine, posted[1]["id"])["last_error"] == "invalid_facts: no commitment"
    others = ["user-0", "user-2", "user-3", "user-4"]
    assert effects(engine) == {"sent": others, "other_notifications": [], "deliveries": others, "dedup_keys": ["4"]}


@pytest.mark.clause("REQ-0067.1")
@pytest.mark.clause("REQ-0067.3")
def test_a_batch_in_which_every_event_fails_records_every_failure_and_no_effect(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.1, REQ-0067.3: alternating Python and database errors in every event: each row is
    failed with its own error, and no write of any of them survives."""
    posted = batch_of_five(client)

    class AlwaysFails:
        def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
            service.dispatcher(session, event, now)
            if int(event.user_id[-1]) % 2:
                session.execute(text("SELECT * FROM no_such_table"))
            raise RuntimeError(f"fails for {event.user_id}")

    service.scheduler.dispatcher = AlwaysFails()
    report = service.scheduler.poll_once()
    assert [o.status for o in report.outcomes] == ["failed"] * 5
    errors = [event_row(engine, p["id"])["last_error"].split(":")[0] for p in posted]
    assert errors == ["RuntimeError", "ProgrammingError", "RuntimeError", "ProgrammingError", "RuntimeError"]
    assert effects(engine) == {"sent": [], "other_notifications": [], "deliveries": [], "dedup_keys": ["0"]}


@pytest.mark.clause("REQ-0067.2")
def test_a_stop_after_a_replay_commits_what_was_dispatched_and_leaves_the_rest_pending(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """REQ-0067.2 with DEC-7: a stop right after the failing event commits the replayed events and
    the failure; the two events never dispatched stay pending, untouched."""
    posted = batch_of_five(client)
    fake = FakeDispatcher(service.dispatcher, {"user-2": KeyError("boom")})
    service.scheduler.dispatcher = fake

    def stop_after_three() -> bool:
        # the stop arrives once the failing event ran again alone (the replay is over): six
        # calls, user-0, user-1 and user-2 under the checkpoint, then the same three isolated
        return len(fake.seen) >= 6

    report = service.scheduler.poll_once(stop_after_three)
    assert [o.status for o in report.outcomes] == ["dispatched", "dispatched", "failed"]
    assert [event_row(engine, p["id"])["status"] for p in posted] == ["dispatched", "dispatched", "failed",
                                                                       "pending", "pending"]
    assert [event_row(engine, p["id"])["updated_at"] for p in posted[3:]] == [p_row for p_row in (
        event_row(engine, p["id"])["created_at"] for p in posted[3:])]
    assert effects(engine)["sent"] == ["user-0", "user-1"]
