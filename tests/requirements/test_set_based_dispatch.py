"""DEC-1, REQ-0066 — a batch decided set-based writes exactly what the per-event path writes.

The production dispatcher decides a claimed batch at once: one statement reads the keys,
preferences and today's counts, one writes every notification, delivery, key and outcome
(``core.strategies``, ``nudging.decision``). These tests run one scenario twice on the
same database state, once per event (the dispatcher wrapped so that it cannot decide a
batch) and once set-based, and compare every row and every ``DispatchResult``: within-batch
and earlier duplicates, the cap counted across the batch, a disabled kind, a refusal, a rule
that raises. Then the fallback: a set statement that fails leaves the batch to the per-event
path, with the same rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from scheduler.core.store import set_preferences, store_event
from scheduler.database.queries import load_queries
from scheduler.nudging import decision
from scheduler.nudging.decision import BatchDecisions, NudgingPlatform
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.types import DigitalTwinEvent, DispatchResult
from tests.conftest import T0
from tests.helpers import catalogue_with_a_second_rule, reminder_facts, rows


class RuleBlewUp(Exception):
    """The error the test's evaluator raises for facts that ask for it."""


def explode_on_request(event: DigitalTwinEvent) -> bool:
    """An evaluator (named by the test catalogue) that raises when the facts say ``explode``."""
    if event.facts.get("explode"):
        raise RuleBlewUp(f"evaluator blew up for {event.user_id}")
    return True


@pytest.fixture
def platform(tmp_path: Path) -> NudgingPlatform:
    """The shipped rules plus a second rule on commitment reminders (another kind, an evaluator)."""
    return NudgingPlatform(catalogue_with_a_second_rule(tmp_path, f"{__name__}:explode_on_request"))


class PerEvent:
    """The platform behind a plain ``Dispatcher``: the scheduler can only call it per event."""

    def __init__(self, inner: NudgingPlatform) -> None:
        self.inner = inner
        self.results: dict[str, DispatchResult | Exception] = {}  # the last call's, by event

    def __call__(self, session: Session, event: DigitalTwinEvent, now: Any) -> DispatchResult:
        try:
            result = self.inner(session, event, now)
        except Exception as exc:
            self.results[str(event.scheduled_event_id)] = exc
            raise
        # a replay after a failure calls an event again: its last result is the one that commits
        self.results[str(event.scheduled_event_id)] = result
        return result


class SetBased(NudgingPlatform):
    """The platform itself, recording the results of the batches it decided set-based."""

    def __init__(self, inner: NudgingPlatform) -> None:
        super().__init__(inner.catalogue, inner.orchestrator)
        self.results: dict[str, DispatchResult | Exception] = {}

    def decide_batch(self, session: Session, events: Any, now: Any, stop: Any = None, check: Any = None
                     ) -> BatchDecisions:
        decisions = super().decide_batch(session, events, now, stop, check)
        for event, result in zip(events, decisions.results, strict=True):
            self.results[str(event.scheduled_event_id)] = result
        return decisions


def store(service: SchedulerService, event_id: str, user: str, minutes: int, **facts: Any) -> None:
    store_event(service.database, event_type="commitment_reminder", user_id=user, community_id="c-1",
                external_key=None, trigger_at=T0 - timedelta(minutes=minutes), facts=reminder_facts(**facts),
                now=T0 - timedelta(hours=1), event_id=event_id)


def run_scenario(service: SchedulerService, dispatcher: Any) -> list[list[str]]:
    """Two polls over a fresh state: the first leaves keys behind, the second mixes every case."""
    service.scheduler.dispatcher = dispatcher
    set_preferences(service.database, "capped", enabled_kinds=None, max_per_day=3, now=T0)
    set_preferences(service.database, "quiet", enabled_kinds=["nudge"], max_per_day=3, now=T0)
    # poll 1: keys for "seen" (then duplicated once) and "fresh"
    store(service, "a1", "seen", 100)
    store(service, "a2", "seen", 99)
    store(service, "a3", "fresh", 98)
    outcomes = [[f"{o.id}:{o.status}:{o.error}" for o in service.scheduler.poll_once().outcomes]]
    # poll 2, in trigger order
    store(service, "b01", "capped", 50, day="2026-11-28")
    store(service, "b02", "capped", 49, day="2026-11-29")  # the cap (3) is reached inside the batch
    store(service, "b03", "twin", 48)
    store(service, "b04", "twin", 47)  # a duplicate of b03 in the same batch: suppressed_dedup rows
    store(service, "b05", "twin", 46)  # again: only the counter moves
    store(service, "b06", "seen", 45)  # its keys have a suppressed_dedup row from poll 1
    store(service, "b07", "fresh", 44)  # its keys have none yet
    store(service, "b08", "quiet", 43)  # the reminder kind is disabled
    store(service, "b09", "scope", 42, day="30/11/2026")  # refused: no usable time scope
    store(service, "b10", "boom", 41, explode=True)  # a rule raises
    store(service, "b11", "capped", 40, day="2026-11-27")  # rate limited by the batch's own sends
    outcomes.append([f"{o.id}:{o.status}:{o.error}" for o in service.scheduler.poll_once().outcomes])
    return outcomes


def snapshot(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row the dispatch path wrote, notification ids replaced by (event, rule)."""
    names = {r["id"]: f"{r['scheduled_event_id']}/{r['rule_id']}"
             for r in rows(engine, "SELECT id, scheduled_event_id, rule_id FROM notifications")}

    def named(row: dict[str, Any]) -> dict[str, Any]:
        return {k: (names.get(v, v) if k in ("id", "notification_id", "duplicate_notification_id") else v)
                for k, v in row.items()}

    return {
        # stream_seq is numbered after the commit by the inbox (the publisher), not by the dispatch path
        "notifications": sorted((named({k: v for k, v in r.items() if k != "stream_seq"})
                                 for r in rows(engine, "SELECT * FROM notifications")), key=str),
        # in id order; the values themselves differ where a replay's rolled-back inserts used some up
        "deliveries": [named({k: v for k, v in r.items() if k != "id"})
                       for r in rows(engine, "SELECT * FROM deliveries ORDER BY id")],
        "dedup_keys": [named(r) for r in rows(engine, "SELECT * FROM dedup_keys ORDER BY key")],
        "events": rows(engine, "SELECT id, status, last_error, dispatched_at, updated_at FROM scheduled_events "
                               "ORDER BY id"),
        "history": rows(engine, "SELECT event_id, at, change, status, changes FROM scheduled_event_history "
                                "ORDER BY event_id, id"),
    }


def results_of(results: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Results by event as comparable values, notification ids replaced as in ``snapshot``."""
    shown: dict[str, Any] = {}
    for event_id, result in results.items():
        if isinstance(result, Exception):
            shown[event_id] = repr(result)
            continue
        shown[event_id] = (result.outcome, result.refusal, result.detail,
                           [{**n, "id": names[n["id"]]} for n in result.notifications],
                           [(names[m.notification_id], m.user_id, m.channel, m.kind, m.title, m.body)
                            for m in result.outbound])
    return shown


def reset(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE scheduled_events, scheduled_event_history, notifications, deliveries, "
                          "dedup_keys, participant_preferences RESTART IDENTITY CASCADE"))


@pytest.fixture
def both_paths(service: SchedulerService, engine: Engine, platform: NudgingPlatform,
               publisher: RecordingPublisher) -> Iterator[tuple[Any, Any]]:
    """The scenario per event, then set-based on the same fresh state: (per-event, set-based)."""

    def run(dispatcher: PerEvent | SetBased) -> tuple[Any, Any, Any, Any]:
        ran = run_scenario(service, dispatcher)
        pushes = sorted((m.user_id, m.kind, m.title) for m in publisher.messages)
        names = {r["id"]: f"{r['scheduled_event_id']}/{r['rule_id']}"
                 for r in rows(engine, "SELECT id, scheduled_event_id, rule_id FROM notifications")}
        return ran, snapshot(engine), pushes, results_of(dispatcher.results, names)

    per_event = run(PerEvent(platform))
    reset(engine)
    publisher.messages.clear()
    yield per_event, run(SetBased(platform))


@pytest.mark.clause("DEC-1.1")
def test_a_batch_decided_set_based_writes_row_for_row_what_the_per_event_path_writes(
    both_paths: tuple[Any, Any]
) -> None:
    """DEC-1.1: notifications, deliveries (ids in batch order), keys with their duplicate counts and
    suppressed_dedup links, outcomes and history are identical, and so are the outcomes and pushes."""
    (outcomes, per_rows, per_pushes, _), (set_outcomes, set_rows, set_pushes, _) = both_paths
    assert set_outcomes == outcomes
    for table in per_rows:
        assert set_rows[table] == per_rows[table], table
    assert set_pushes == per_pushes
    # the scenario reached every case it is meant to compare
    reasons = {(n["dedup_key"].split(":")[1], n["reason"]) for n in per_rows["notifications"]}
    assert {("twin", "suppressed_dedup"), ("fresh", "suppressed_dedup"), ("quiet", "kind_disabled"),
            ("capped", "rate_limited")} <= reasons
    assert ("seen", "suppressed_dedup") in reasons  # the one poll 1 wrote; poll 2 only counts
    assert "b09:failed:missing_or_invalid_time_scope" in " ".join(outcomes[1])
    assert "b10:failed:RuleBlewUp: evaluator blew up for boom" in outcomes[1]
    twin = [k for k in per_rows["dedup_keys"] if ":twin:" in k["key"]]
    assert {k["duplicate_count"] for k in twin} == {2}


@pytest.mark.clause("REQ-0066.7")
def test_a_batch_decided_set_based_gives_each_event_the_dispatch_result_of_the_per_event_path(
    both_paths: tuple[Any, Any]
) -> None:
    """REQ-0066.7: the set-based results are the per-event path's, event by event: outcome, refusal,
    recorded notifications and pushes (a rule's own error is that event's error, alone)."""
    (_, _, _, per_results), (_, _, _, set_results) = both_paths
    assert set_results == per_results
    assert set_results["b10"] == "RuleBlewUp('evaluator blew up for boom')"
    assert len(set_results) == 3 + 11


@pytest.mark.clause("DEC-1.2")
def test_a_set_statement_that_fails_leaves_the_batch_to_the_per_event_path_with_the_same_rows(
    service: SchedulerService, engine: Engine, platform: NudgingPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEC-1.2: a database error in the set-based write (sent with the COMMIT, which then does not
    run) rolls back to the checkpoint; every event then runs per event, and the rows are those
    of the per-event path."""
    per_event = PerEvent(platform)
    expected_outcomes = run_scenario(service, per_event)
    expected = snapshot(engine)
    reset(engine)

    original = decision.BatchDecisions.write_statement

    def failing_write(self: BatchDecisions, outcomes: dict[str, list[Any]] | None = None
                      ) -> tuple[str, dict[str, Any]]:
        name, params = original(self, outcomes)
        # a database error inside the set statement (a time PostgreSQL cannot read), with the COMMIT after it
        return name, {**params, "times": ["not a time" for _ in params["times"]]}

    monkeypatch.setattr(decision.BatchDecisions, "write_statement", failing_write)
    calls: list[str] = []

    class Counting(NudgingPlatform):
        def __call__(self, session: Session, event: DigitalTwinEvent, now: Any) -> DispatchResult:
            calls.append(event.user_id)
            return super().__call__(session, event, now)

    outcomes = run_scenario(service, Counting(platform.catalogue, platform.orchestrator))
    assert outcomes == expected_outcomes
    assert snapshot(engine) == expected
    assert len(calls) >= 3 + 11  # every event went the per-event way (the failing one twice)


@pytest.mark.clause("DEC-1.2")
def test_a_write_that_differs_from_the_decisions_falls_back_to_the_per_event_path(
    service: SchedulerService, engine: Engine, platform: NudgingPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEC-1.2: a key taken between the batch's read and its write (here: by the test, in the
    same transaction) makes the write report fewer keys than decided; the batch runs per event
    and the event ends a duplicate, as the per-event path decides."""
    service.scheduler.dispatcher = platform
    store(service, "x1", "solo", 10)
    batch = service.scheduler.claim()
    key = f"commitment-reminder:solo:c-1:{reminder_facts()['date']}"
    batch.session.execute(text("INSERT INTO dedup_keys (key, notification_id, created_at) VALUES (:k, 'n-0', :t)"),
                          {"k": key, "t": T0})
    original = decision.state_of
    reads: list[Mapping[str, Any] | None] = []

    def stale_read(limits: Mapping[str, Any] | None, users: Sequence[str], now: Any) -> decision.BatchState:
        state = original(limits, users, now)
        reads.append(limits)
        if len(reads) == 1:  # the batch's read, as if made before the insert; the fallback reads afresh
            state.keys.pop(key, None)
        return state

    monkeypatch.setattr(decision, "state_of", stale_read)
    outcome = service.scheduler.dispatch_next(batch)
    service.scheduler.finish(batch)
    assert outcome is not None and outcome.status == "dispatched"
    assert not batch.decided_whole  # the set-based run was abandoned for the per-event path
    assert len(reads) == 2  # the batch's read, then the event's own as a batch of one
    reasons = sorted((r["rule_id"], r["reason"]) for r in rows(engine, "SELECT rule_id, reason FROM notifications"))
    assert reasons == [("commitment-nudge", None), ("commitment-reminder", "suppressed_dedup")]


# The statements the batch path sends as one message, their parameters bound on the client.
CLIENT_BOUND = ("claim_due_events", "lock_participant", "read_batch_limits", "write_batch_decisions", "record_outcomes")
HOSTILE_ID = "p-'\";\r\n-- x\u2028) OR true; SELECT 1/0; --\x1b[2J"


@pytest.mark.clause("DEC-1.5")
def test_a_participant_id_that_could_leave_a_comment_or_a_literal_is_decided_like_any_other(
    service: SchedulerService, engine: Engine, platform: NudgingPlatform
) -> None:
    """DEC-1.5: the decision's statements are bound on the client (one message), so a bind
    parameter inside one of their comments would put a participant's id into the text raw:
    none has one, and an id with quotes, a newline and a comment marker is decided set-based,
    live and per event alike, its rows those of any other id."""
    for name in CLIENT_BOUND:
        for line in load_queries()[name].sql.splitlines():
            assert not re.search(r"(?<![:\w]):[A-Za-z_]\w*", line.partition("--")[2]), (name, line)
    service.scheduler.dispatcher = platform
    store(service, "h1", HOSTILE_ID, 10)
    store(service, "h2", HOSTILE_ID, 9, day="2026-11-29")
    report = service.scheduler.poll_once()
    assert [(o.id, o.status, o.error) for o in report.outcomes] == [
        ("h1", "dispatched", None), ("h2", "dispatched", None)]
    with service.sessions() as session:
        live = platform(session, DigitalTwinEvent("commitment_reminder", HOSTILE_ID, "c-1", reminder_facts()), T0)
        session.commit()
    assert live.outcome == "duplicate"
    service.scheduler.dispatcher = PerEvent(platform)
    store(service, "h3", HOSTILE_ID, 8, day="2026-11-28")
    assert [o.status for o in service.scheduler.poll_once().outcomes] == ["dispatched"]
    notes = rows(engine, "SELECT user_id, status, reason FROM notifications ORDER BY created_at, dedup_key")
    assert {n["user_id"] for n in notes} == {HOSTILE_ID}
    # the default cap of three across the batch, the live duplicates and the per-event batch
    assert sorted([(n["status"], n["reason"]) for n in notes], key=str) == sorted(
        [("sent", None)] * 3 + [("suppressed", "rate_limited")] * 3 + [("suppressed", "suppressed_dedup")] * 2, key=str)
