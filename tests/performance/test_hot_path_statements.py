"""The statements a poll sends, pinned: the queue's own cost per batch does not grow with the batch.

The benchmarks measure time; this counts round trips, which is what the time follows (PERF-2). When
no event fails, a batch sends the claim (its participants' try-locks in the same statement) and one
statement recording every outcome, sent with the COMMIT, whatever its size: no savepoint and no
status update per event (the checkpoint's savepoint goes ahead of the dispatcher's first statement,
so a dispatcher that writes nothing never sends it). The real dispatch path decides a batch
set-based: one read (its savepoint sent with it) and one write for the whole batch, the outcomes in
the write, and no RELEASE (the COMMIT ends the savepoint). The per-event path (a dispatcher that
cannot decide a batch, or the fallback) decides each event as a batch of one through the same code,
so it adds two statements per event (the same read and the same write, for one event) and no lock
for a participant the claim holds. A change that puts a per-event statement back into the hot path
fails here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event
from starlette.testclient import TestClient

from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import Orchestrator, RecordingPublisher, WebChannel
from scheduler.service import SchedulerService
from scheduler.types import DeclaredDispatcher, DigitalTwinEvent, DispatchOutcome, DispatchResult
from tests.conftest import INGEST, T0
from tests.helpers import FakeWebPush, post_event, reminder_facts, rows


def noop(session: Any, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
    """A dispatcher that does nothing: what is left is the queue's own statements."""
    return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)


class StatementLog:
    """Every statement the engine sends, by its first words (BEGIN/COMMIT are not statements here)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.kinds: Counter[str] = Counter()

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = " ".join(line.split("--", 1)[0] for line in statement.splitlines()).split()
        if words[0].upper() == "COMMIT":
            return  # the set-based write's COMMIT travels as a statement; psycopg's own is not seen either
        if words[0].upper() in ("WITH", "SELECT", "INSERT", "UPDATE"):
            # the statement's target: the table it writes, or the function it calls
            body = " ".join(words)
            for marker in ("INSERT INTO scheduler.dedup_keys", "FROM scheduler.participant_preferences",
                           "FOR UPDATE SKIP LOCKED", "advisory_xact_lock", "UPDATE scheduler.scheduled_events",
                           "INSERT INTO scheduler.notifications", "INSERT INTO scheduler.deliveries"):
                if marker in body:
                    self.kinds[marker] += 1
                    return
        # SAVEPOINT name, RELEASE SAVEPOINT name, ROLLBACK TO SAVEPOINT name: without the name
        kind = " ".join(words[:3]).upper()
        for command in ("ROLLBACK TO SAVEPOINT", "RELEASE SAVEPOINT", "SAVEPOINT"):
            if kind.startswith(command):
                kind = command
                break
        self.kinds[kind] += 1

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


@pytest.fixture
def log(engine: Engine) -> Iterator[StatementLog]:
    recorded = StatementLog(engine)
    event.listen(engine, "before_cursor_execute", recorded)
    yield recorded
    event.remove(engine, "before_cursor_execute", recorded)


def post_due(client: TestClient, count: int, prefix: str) -> None:
    for i in range(count):
        post_event(client, user_id=f"{prefix}-{i}", trigger_at=T0 - timedelta(minutes=count - i))


def poll_statements(service: SchedulerService, log: StatementLog) -> Counter[str]:
    log.kinds.clear()
    report = service.scheduler.poll_once()
    assert report.failed == 0
    return Counter(log.kinds)


@pytest.mark.clause("PERF-2")
def test_a_batch_without_failures_sends_the_same_queue_statements_for_two_events_as_for_twenty(
    client: TestClient, service: SchedulerService, log: StatementLog
) -> None:
    """PERF-2: with a no-op dispatcher, a batch of 2 and a batch of 20 send the same statements:
    the claim with its participants' try-locks and one update of every outcome (sent with the
    COMMIT); no savepoint, since the dispatcher wrote nothing, and no release."""
    service.scheduler.dispatcher = noop
    post_due(client, 2, "small")
    small = poll_statements(service, log)
    post_due(client, 20, "large")
    large = poll_statements(service, log)
    assert small == large == Counter({"FOR UPDATE SKIP LOCKED": 1, "UPDATE scheduler.scheduled_events": 1})


@pytest.mark.clause("PERF-2")
def test_the_real_dispatch_path_decides_a_batch_of_twenty_in_the_statements_of_a_batch_of_one(
    client: TestClient, service: SchedulerService, log: StatementLog
) -> None:
    """PERF-2: through the real platform a batch is decided set-based: one statement reads every key,
    preference and count, one writes every key, notification, delivery and outcome. A batch of
    one and a batch of twenty send the same four statements (the claim with its try-locks, the
    savepoint sent with the read, the write sent with the COMMIT; no release): 0.2 per event at
    batch 20."""
    # After the commit the inbox numbers the batch's notifications for the stream:
    # one short transaction per batch, measured by `python -m bench history`; not the batch's own.
    service.scheduler.publisher = None
    post_due(client, 1, "one")
    one = poll_statements(service, log)
    post_due(client, 20, "many")
    many = poll_statements(service, log)
    assert one == many == Counter({"FOR UPDATE SKIP LOCKED": 1, "SAVEPOINT": 1,
                                   "FROM scheduler.participant_preferences": 1, "INSERT INTO scheduler.dedup_keys": 1})
    assert sum(many.values()) / 20 <= 0.2


@pytest.mark.clause("PERF-2")
def test_the_per_event_dispatch_path_adds_two_statements_per_event_and_no_second_participant_lock(
    client: TestClient, service: SchedulerService, log: StatementLog
) -> None:
    """PERF-2: a dispatcher that cannot decide a batch at once (here the platform behind a plain
    object, safe to repeat) takes the per-event path: nineteen more events cost thirty-eight more statements,
    each event's read (keys, preferences, today's count) and its write (key, notification,
    delivery), the batch's own two statements for one event; the checkpoint's savepoint goes
    once ahead of the first event's first statement, and is not released (the COMMIT ends it)."""
    service.scheduler.publisher = None
    platform = service.scheduler.dispatcher

    class PerEvent(DeclaredDispatcher):
        """The platform without its batch decision; safe to repeat like it (DEC-1.4)."""

        safe_to_repeat = True

        def __call__(self, session: Any, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
            return platform(session, event, now)

    service.scheduler.dispatcher = PerEvent()
    post_due(client, 1, "one")
    one = poll_statements(service, log)
    post_due(client, 20, "many")
    many = poll_statements(service, log)
    assert sum(many.values()) - sum(one.values()) == 2 * 19
    assert many["advisory_xact_lock"] == 0  # the claim try-locked all twenty participants in its statement
    # Re-pinned for the one decision (DEC-1.5): the count is unchanged (two per event), but an
    # event is now a batch of one, so its two statements are the batch's read (counted by its
    # "FROM scheduler.participant_preferences") and the batch's write (counted by its first target, the
    # keys), where they were a key claim with the limits and a notification with its delivery.
    assert many["FROM scheduler.participant_preferences"] == many["INSERT INTO scheduler.dedup_keys"] == 20
    # parts of the write
    assert many["INSERT INTO scheduler.notifications"] == many["INSERT INTO scheduler.deliveries"] == 0
    assert one["SAVEPOINT"] == many["SAVEPOINT"] == 1 and many["RELEASE SAVEPOINT"] == 0


@pytest.mark.clause("DEC-1.5")
def test_an_orchestrator_with_a_second_channel_decides_a_batch_in_the_same_four_statements(
    client: TestClient, service: SchedulerService, engine: Engine, log: StatementLog
) -> None:
    """DEC-1.5: every channel takes part in the batch's one write: with a (fake) web-push channel
    beside the in-app one, a batch of twenty is still the claim, the savepoint, the read and the
    write, and each sent notification has both delivery rows, in batch order."""
    service.scheduler.publisher = None
    platform = service.scheduler.dispatcher
    assert isinstance(platform, NudgingPlatform)
    service.scheduler.dispatcher = NudgingPlatform(platform.catalogue, Orchestrator([WebChannel(), FakeWebPush()]))
    post_due(client, 20, "many")
    many = poll_statements(service, log)
    assert many == Counter({"FOR UPDATE SKIP LOCKED": 1, "SAVEPOINT": 1,
                            "FROM scheduler.participant_preferences": 1, "INSERT INTO scheduler.dedup_keys": 1})
    deliveries = rows(engine, "SELECT d.channel, d.status, n.user_id FROM deliveries AS d "
                              "JOIN notifications AS n ON n.id = d.notification_id ORDER BY d.id")
    assert [(d["channel"], d["status"]) for d in deliveries] == [("web", "sent"), ("web-push", "sent")] * 20
    assert [d["user_id"] for d in deliveries] == [f"many-{i}" for i in range(20) for _ in range(2)]


@pytest.mark.clause("DEC-1.5")
def test_a_live_event_is_a_batch_of_one_its_lock_its_read_and_its_write(
    client: TestClient, service: SchedulerService, publisher: RecordingPublisher, log: StatementLog
) -> None:
    """DEC-1.5: live ingest decides through the batch's code: the participant's lock (it holds no
    claim), the batch's read and the batch's write, three statements (the lock travels with the
    read); a repeat of the same period, a duplicate, costs the same three."""
    # After the commit the inbox numbers the notification for the stream: not the decision's.
    service.publisher = publisher
    body = {"event_type": "commitment_reminder", "user_id": "live-1", "community_id": "c-1", "facts": reminder_facts()}
    for expected in (200, 409):
        log.kinds.clear()
        assert client.post("/admin/ingest-event", headers=INGEST, json=body).status_code == expected
        assert log.kinds == Counter({"advisory_xact_lock": 1, "FROM scheduler.participant_preferences": 1,
                                     "INSERT INTO scheduler.dedup_keys": 1}), expected
