"""REQ-0066 as a property — one decision, however the events arrive.

The requirement: a scheduled reminder is deduplicated, rate-limited and preference-filtered
exactly like a live event. Hypothesis draws sequences of live and scheduled events
(participants, periods, preferences and caps, a rule that raises, a refused event, a second
channel that sometimes fails to deliver), and each sequence runs three ways on the same
fresh state: every event one by one as a live event; the scheduled ones as batches of a
drawn split, the live ones sent between the polls in their place; and those batches again
with their write made to fail, so that the scheduler falls back to batches of one (DEC-1.2).
The notifications, deliveries, keys and every event's outcome and result must be the same
(ids normalised: a notification is named by its key and whether it is the key's one
``suppressed_dedup`` row); a failure shrinks to a short sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from scheduler.core.store import set_preferences, store_event
from scheduler.nudging.decision import BatchDecisions, Check, NudgingPlatform
from scheduler.nudging.orchestrator import Orchestrator, WebChannel
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, error_text
from tests.conftest import T0
from tests.helpers import FakeWebPush, catalogue_with_a_second_rule, reminder_facts, rows

USERS = ("p0", "p1", "p2")
DAYS = ("2026-11-28", "2026-11-29", "2026-11-30")
KINDS = ("reminder", "nudge")
MAX_EVENTS = 12


class RuleBlewUp(Exception):
    """The error the test's evaluator raises for facts that ask for it."""


def explode_on_request(event: DigitalTwinEvent) -> bool:
    """An evaluator (named by the test catalogue) that raises when the facts say ``explode``."""
    if event.facts.get("explode"):
        raise RuleBlewUp(f"evaluator blew up for {event.user_id}")
    return True


@dataclass(frozen=True)
class Step:
    """One event of a drawn sequence."""

    live: bool
    user: int
    day: int
    shape: str  # "ok", "explode" (a rule raises) or "refuse" (no usable time scope)

    def facts(self) -> dict[str, Any]:
        if self.shape == "refuse":
            return reminder_facts("30/11/2026")
        return reminder_facts(DAYS[self.day], **({"explode": True} if self.shape == "explode" else {}))


Program = tuple[list[Step], list[bool], dict[str, tuple[list[str] | None, int]]]

steps = st.builds(Step, live=st.booleans(), user=st.integers(0, len(USERS) - 1), day=st.integers(0, len(DAYS) - 1),
                  shape=st.sampled_from(["ok"] * 6 + ["explode", "refuse"]))
programs = st.tuples(
    st.lists(steps, min_size=1, max_size=MAX_EVENTS),
    st.lists(st.booleans(), min_size=MAX_EVENTS, max_size=MAX_EVENTS),  # cut a batch after event i
    st.dictionaries(st.sampled_from(USERS),
                    st.tuples(st.one_of(st.none(), st.lists(st.sampled_from(KINDS), unique=True)), st.integers(0, 4))),
)


class Recording(NudgingPlatform):
    """The platform, recording each event's last result (a replay's is the one that commits)."""

    def __init__(self, platform: NudgingPlatform, fail_batch_writes: bool = False) -> None:
        super().__init__(platform.catalogue, platform.orchestrator)
        self.fail_batch_writes = fail_batch_writes
        self.results: dict[str, Any] = {}

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> Any:
        try:
            result = super().__call__(session, event, now)
        except Exception as exc:
            self.results[label(event)] = exc
            raise
        self.results[label(event)] = result
        return result

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Any = None, check: Check | None = None) -> BatchDecisions:
        decisions = super().decide_batch(session, events, now, stop, check)
        for event, result in zip(events, decisions.results, strict=False):
            self.results[label(event)] = result
        if self.fail_batch_writes:
            return FailingWrite(decisions.results, decisions.state)
        return decisions


class FailingWrite(BatchDecisions):
    """A batch's write that fails inside the database (a time PostgreSQL cannot read), with
    the COMMIT after it: the scheduler falls back to batches of one (DEC-1.2)."""

    def write_statement(self, outcomes: dict[str, list[Any]] | None = None) -> tuple[str, dict[str, Any]]:
        name, params = super().write_statement(outcomes)
        return name, {**params, "times": ["not a time" for _ in params["times"]]}


def label(event: DigitalTwinEvent) -> str:
    return event.scheduled_event_id or str(event.facts["sim_label"])


def event_of(index: int, step: Step) -> DigitalTwinEvent:
    facts = {**step.facts(), "sim_label": f"live-{index:02d}"}
    return DigitalTwinEvent("commitment_reminder", USERS[step.user], "c-1", facts,
                            None if step.live else f"e{index:02d}")


def send_live(service: SchedulerService, platform: Recording, event: DigitalTwinEvent) -> None:
    """What live ingest does with an event: dispatch it in its own transaction, commit unless
    it was refused or raised."""
    with service.sessions() as session:
        try:
            result = platform(session, event, service.clock.now())
        except Exception:  # noqa: BLE001 - recorded by the platform; live ingest answers a 500
            session.rollback()
            return
        if result.refusal is not None:
            session.rollback()
        else:
            session.commit()


def prepare(service: SchedulerService, engine: Engine, program: Program) -> list[DigitalTwinEvent]:
    """A fresh state: no rows but the drawn preferences and the scheduled events, due in order."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE scheduled_events, scheduled_event_history, notifications, deliveries, "
                          "dedup_keys, participant_preferences RESTART IDENTITY CASCADE"))
    sequence, _, preferences = program
    for user, (kinds, cap) in sorted(preferences.items()):
        set_preferences(service.database, user, enabled_kinds=kinds, max_per_day=cap, now=T0)
    events = [event_of(i, step) for i, step in enumerate(sequence)]
    for i, event in enumerate(events):
        if event.scheduled_event_id is not None:
            store_event(service.database, event_type=event.event_type, user_id=event.user_id,
                        community_id=event.community_id, external_key=None,
                        trigger_at=T0 - timedelta(minutes=len(events) - i), facts=event.facts,
                        now=T0 - timedelta(hours=1), event_id=event.scheduled_event_id)
    return events


def one_by_one(service: SchedulerService, platform: Recording, events: list[DigitalTwinEvent]) -> None:
    for event in events:
        send_live(service, platform, event)


def in_batches(service: SchedulerService, platform: Recording, events: list[DigitalTwinEvent],
               cuts: list[bool]) -> None:
    """The scheduled events as batches: a batch ends at a drawn cut or at a live event, which
    is sent between the polls in its place."""
    service.scheduler.dispatcher = platform
    batch: list[DigitalTwinEvent] = []

    def poll() -> None:
        if batch:
            service.scheduler.batch_size = len(batch)
            report = service.scheduler.poll_once()
            assert [o.id for o in report.outcomes] == [e.scheduled_event_id for e in batch]
            batch.clear()

    for i, event in enumerate(events):
        if event.scheduled_event_id is None:
            poll()
            send_live(service, platform, event)
            continue
        batch.append(event)
        if cuts[i]:
            poll()
    poll()


def observed(engine: Engine, platform: Recording) -> dict[str, Any]:
    """Every row the decisions wrote and every event's result, ids normalised."""
    names = {r["id"]: f"{r['dedup_key']}/{'duplicate' if r['reason'] == 'suppressed_dedup' else 'claim'}"
             for r in rows(engine, "SELECT id, dedup_key, reason FROM notifications")}

    def named(row: dict[str, Any]) -> dict[str, Any]:
        return {k: (names.get(v, v) if k in ("id", "notification_id", "duplicate_notification_id") else v)
                for k, v in row.items()}

    results: dict[str, Any] = {}
    for event_label, result in sorted(platform.results.items()):
        if isinstance(result, Exception):
            results[event_label] = ("failed", error_text(result))
            continue
        results[event_label] = (
            "failed" if result.refusal is not None else "dispatched", result.refusal, result.outcome, result.detail,
            [named(n) for n in result.notifications],
            [(names[m.notification_id], m.user_id, m.channel, m.kind, m.title, m.body) for m in result.outbound])
    return {
        "notifications": sorted((named({k: v for k, v in r.items() if k != "stream_seq"})
                                 for r in rows(engine, "SELECT * FROM notifications")), key=lambda n: n["id"]),
        # in id order (batch order); the values themselves differ where a replay used some up
        "deliveries": [named({k: v for k, v in r.items() if k != "id"})
                       for r in rows(engine, "SELECT * FROM deliveries ORDER BY id")],
        "dedup_keys": [named(r) for r in rows(engine, "SELECT * FROM dedup_keys ORDER BY key")],
        "results": results,
    }


def scheduled_rows(engine: Engine) -> dict[str, tuple[str, str | None]]:
    return {r["id"]: (r["status"], r["last_error"])
            for r in rows(engine, "SELECT id, status, last_error FROM scheduled_events")}


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[NudgingPlatform]:
    """The shipped rules plus a second rule on commitment reminders (another kind, an evaluator
    that may raise), delivered in-app and through the fake web push (which p2 has no
    subscription for: a failed delivery row)."""
    catalogue = catalogue_with_a_second_rule(tmp_path, f"{__name__}:explode_on_request")
    yield NudgingPlatform(catalogue, Orchestrator([WebChannel(), FakeWebPush(frozenset({"p2"}))]))


@pytest.mark.clause("REQ-0066.8")
@pytest.mark.clause("DEC-1.5")
@settings(max_examples=30, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=programs)
def test_live_events_scheduled_batches_of_any_split_and_the_fallback_decide_alike(
    service: SchedulerService, engine: Engine, platform: NudgingPlatform, program: Program
) -> None:
    """REQ-0066.8, DEC-1.5: a drawn sequence of live and scheduled events gives the same notifications,
    deliveries, keys and per-event outcomes and results one by one as live events, as scheduled
    batches of the drawn split, and through the fallback (every batch's write fails)."""
    _, cuts, _ = program
    live = Recording(platform)
    events = prepare(service, engine, program)
    one_by_one(service, live, events)
    expected = observed(engine, live)

    batched = Recording(platform)
    events = prepare(service, engine, program)
    in_batches(service, batched, events, cuts)
    assert observed(engine, batched) == expected
    outcomes = scheduled_rows(engine)
    # a scheduled row records what its event's result says (REQ-0066.6)
    assert outcomes == {label: expected["results"][label][:2] for label in outcomes}

    fallback = Recording(platform, fail_batch_writes=True)
    events = prepare(service, engine, program)
    in_batches(service, fallback, events, cuts)
    assert observed(engine, fallback) == expected
    assert scheduled_rows(engine) == outcomes


class OldProtocolChannel:
    """A fake channel written for the protocol before the one decision: it wrote its own row."""

    name = "old-push"

    def deliver(self, session: Session, notification: Mapping[str, Any], now: datetime) -> None:
        raise AssertionError("never called: the orchestrator refuses it when built")


@pytest.mark.clause("DEC-1.5")
def test_a_channel_of_the_old_protocol_is_refused_when_the_orchestrator_is_built() -> None:
    """DEC-1.5: a channel whose deliver takes a session (it wrote its own rows) cannot join the
    batch's write; it is refused at start-up with a message naming the new protocol, never
    half-run in a dispatch."""
    with pytest.raises(TypeError, match=r"deliver\(notification, now\) -> Delivery"):
        Orchestrator([WebChannel(), OldProtocolChannel()])  # type: ignore[list-item]
