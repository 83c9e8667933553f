"""REQ-0067, DEC-1.6 — one strategy owns a batch, from its first dispatch to its commit.

In our words: how a batch's events run and how it commits is decided once per batch, by
what its dispatcher declares: decided whole when it can decide a batch at once, the
optimistic checkpoint with its replay when it is safe to call again, a savepoint per event
otherwise. That owner keeps its working state to itself (the batch carries only the claim
and what its events became), and a set-based batch whose write fails hands the batch to its
per-event strategy, which then owns it to the commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from scheduler.core.poll import Batch
from scheduler.core.strategies import OptimisticBatch, SavepointPerEvent, SetBasedBatch
from scheduler.nudging.decision import BatchDecisions, Check, NudgingPlatform
from scheduler.service import SchedulerService
from scheduler.types import DeclaredDispatcher, DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.conftest import T0
from tests.helpers import post_event, rows


class FakeRecordingDispatcher(DeclaredDispatcher):
    """A fake dispatcher that writes nothing and records the events it was called for; it
    declares ``safe_to_repeat`` only when asked to (a ``DeclaredDispatcher``)."""

    def __init__(self, *, safe_to_repeat: bool) -> None:
        self.safe_to_repeat = safe_to_repeat
        self.calls: list[str] = []

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.calls.append(str(event.scheduled_event_id))
        return DispatchResult(outcome=DispatchOutcome.DELIVERED)


def _owners(service: SchedulerService) -> tuple[Batch, list[object]]:
    """Claim a batch and dispatch it whole, noting its owner after each dispatch."""
    batch = service.scheduler.claim()
    owners: list[object] = []
    try:
        while service.scheduler.dispatch_next(batch) is not None:
            owners.append(batch.strategy)
        service.scheduler.finish(batch)
    finally:
        service.scheduler.abort(batch)
    return batch, owners


@pytest.mark.clause("DEC-1.6")
@pytest.mark.parametrize(("kind", "expected"), [
    ("platform", SetBasedBatch), ("safe to repeat", OptimisticBatch), ("host", SavepointPerEvent),
])
def test_each_kind_of_dispatcher_gets_one_owner_for_the_whole_batch(
    client: TestClient, service: SchedulerService, kind: str, expected: type
) -> None:
    """DEC-1.6: the built-in platform's batch is decided whole, a dispatcher that declares itself
    safe to repeat runs under the optimistic checkpoint, a host's runs a savepoint per event;
    the same owner runs every event of the batch and commits it."""
    for i in range(3):
        post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=3 - i))
    if kind != "platform":
        service.scheduler.dispatcher = FakeRecordingDispatcher(safe_to_repeat=kind == "safe to repeat")
    batch, owners = _owners(service)
    assert len(owners) == 3 and all(owner is owners[0] for owner in owners)
    assert type(owners[0]) is expected and batch.strategy is owners[0]
    assert batch.decided_whole is (expected is SetBasedBatch)
    assert [o.status for o in batch.outcomes] == ["dispatched"] * 3


@pytest.mark.clause("DEC-1.6")
@pytest.mark.clause("DEC-1.2")
def test_a_set_based_batch_whose_write_fails_is_handed_to_its_per_event_strategy(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-1.6, DEC-1.2: a write that fails (a row it would insert is already there) rolls the
    batch back to its checkpoint, and the batch's owner becomes the set-based batch's own
    fallback, the optimistic strategy (the platform is safe to repeat), which runs every event
    again and commits them."""
    posted = [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=3 - i)) for i in range(2)]
    batch = service.scheduler.claim()
    try:
        assert service.scheduler.dispatch_next(batch) is not None
        whole = batch.strategy
        assert isinstance(whole, SetBasedBatch) and batch.decided_whole
        # a database error inside the write (a time PostgreSQL cannot read), the COMMIT after it
        name, params = whole.write
        whole.write = (name, {**params, "times": ["not a time" for _ in params["times"]]})
        service.scheduler.finish(batch)
    finally:
        service.scheduler.abort(batch)
    assert batch.strategy is whole.fallback and isinstance(batch.strategy, OptimisticBatch)
    assert not batch.decided_whole
    stored = rows(engine, "SELECT id, status FROM scheduled_events ORDER BY id")
    assert stored == sorted(({"id": p["id"], "status": "dispatched"} for p in posted), key=lambda r: r["id"])


# What a strategy keeps to itself (the checkpoint and where it began, the set-based plan, its
# write and its fallback): names the batch once carried, which it no longer has.
STRATEGY_STATE = ("checkpoint", "checkpoint_position", "checkpoint_outbound", "planned", "set_write", "recorded",
                  "per_event")


@pytest.mark.clause("DEC-1.6")
def test_a_batch_carries_the_claim_and_its_record_and_no_strategys_working_state(
    client: TestClient, service: SchedulerService
) -> None:
    """DEC-1.6: the batch's fields are the claim's (with the statements its commit sends, of the
    loop's database) and what its events became, each event's outcome with its outbound (its
    record); a strategy's working state (the checkpoint, the set-based plan) is the strategy's
    own, and the batch has no field for it."""
    fields = {f.name for f in dataclasses.fields(Batch)}
    assert fields == {"session", "events", "claimed_at", "skipped", "expired", "position", "record",
                      "closed", "replayed", "should_stop", "stopped", "strategy", "events_repository"}
    for i in range(2):
        post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=2 - i))
    for kind in ("platform", "safe to repeat"):
        if kind != "platform":
            service.scheduler.dispatcher = FakeRecordingDispatcher(safe_to_repeat=True)
        batch = service.scheduler.claim()
        try:
            assert service.scheduler.dispatch_next(batch) is not None
            assert [o.id for o in batch.outcomes] == [batch.events[0].id] and batch.position == 1
            for former in ("checkpoint", "checkpoint_position", "planned", "set_write", "recorded", "per_event"):
                assert not hasattr(batch, former), former
        finally:
            service.scheduler.abort(batch)
    with service.engine.connect() as conn:
        pending = conn.execute(text("SELECT count(*) FROM scheduler.scheduled_events WHERE status = 'pending'"))
        assert pending.scalar() == 2


class FakePartDecider(NudgingPlatform):
    """The built-in platform, faked to decide only the first event of any batch it is handed (a
    dispatcher that breaks the whole-batch contract without a stop)."""

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None, check: Check | None = None) -> BatchDecisions:
        return super().decide_batch(session, events[:1], now, stop, check)


@pytest.mark.clause("DEC-1.6")
def test_a_batch_decided_in_part_ends_after_its_decided_events_and_leaves_the_rest_pending(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """DEC-1.6: a batch whose dispatcher decided only its first event, with no stop asked, ends
    after that event: the poll returns (it asks its stop a bounded number of times, never
    spinning), the decided event is dispatched with its notification and the other two stay
    pending, untouched, for the next poll."""
    platform = service.scheduler.dispatcher
    assert isinstance(platform, NudgingPlatform)
    service.scheduler.dispatcher = FakePartDecider(platform.catalogue, platform.orchestrator)
    posted = [post_event(client, user_id=f"user-{i}", trigger_at=T0 - timedelta(minutes=3 - i)) for i in range(3)]
    asked = 0

    def guard() -> bool:
        nonlocal asked
        asked += 1
        return asked > 50  # a poll that spins would ask far more: stop it, and fail below

    report = service.scheduler.poll_once(guard)
    assert asked <= 50, "the poll spun on a batch decided in part"
    assert [(o.id, o.status) for o in report.outcomes] == [(posted[0]["id"], "dispatched")]
    stored = {r["id"]: (r["status"], r["last_error"])
              for r in rows(engine, "SELECT id, status, last_error FROM scheduled_events")}
    assert stored == {posted[0]["id"]: ("dispatched", None), posted[1]["id"]: ("pending", None),
                      posted[2]["id"]: ("pending", None)}
    assert [r["scheduled_event_id"] for r in rows(engine, "SELECT scheduled_event_id FROM notifications")] == \
        [posted[0]["id"]]
