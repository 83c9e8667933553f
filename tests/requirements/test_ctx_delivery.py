"""Context: delivery, and the live route's answers.

In our words: the web channel writes the participant's notification and a delivery-log
row in the same transaction as the dispatch, and anything that leaves the process (a
push to a browser, through a publisher) happens only after that transaction commits. The
live route answers 200 (delivered on at least one channel), 202 (created but every
delivery suppressed), 204 (no rule triggered), 409 (every rule that would have fired was
a duplicate), 400 (no enabled rule claims the scenario at that frequency) or 422
(unusable facts, the time scope included).
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST
from tests.helpers import dispatch_all, post_event, reminder_facts, rows


def counts(engine: Engine) -> tuple[int, int]:
    notes = rows(engine, "SELECT id FROM notifications")
    deliveries = rows(engine, "SELECT id FROM deliveries")
    return len(notes), len(deliveries)


@pytest.mark.clause("CTX-DELIVERY.1")
def test_a_notification_and_its_delivery_log_commit_with_the_dispatch_or_not_at_all(
    client: TestClient, service: SchedulerService, engine: Engine, publisher: RecordingPublisher
) -> None:
    """CTX-DELIVERY.1: an aborted batch leaves no notification, no delivery row, and pushes nothing."""
    post_event(client)
    scheduler = service.scheduler
    batch = scheduler.claim()
    scheduler.dispatch_next(batch)
    assert counts(engine) == (0, 0)  # invisible to others until the batch commits
    scheduler.abort(batch)
    assert counts(engine) == (0, 0)
    assert publisher.messages == []
    report = scheduler.poll_once()
    assert report.dispatched == 1
    assert counts(engine) == (1, 1)
    [delivery] = rows(engine, "SELECT channel, status FROM deliveries")
    assert (delivery["channel"], delivery["status"]) == ("web", "sent")


@pytest.mark.clause("CTX-DELIVERY.2")
def test_the_push_leaves_the_process_only_after_commit(
    client: TestClient, service: SchedulerService, publisher: RecordingPublisher
) -> None:
    """CTX-DELIVERY.2: during the batch the publisher has seen nothing; after finish it has the message."""
    post_event(client, user_id="a")
    post_event(client, user_id="b")
    scheduler = service.scheduler
    batch = scheduler.claim()

    def nothing_pushed_yet() -> None:
        assert publisher.messages == []

    dispatch_all(scheduler, batch, each=nothing_pushed_yet)
    scheduler.finish(batch)
    assert sorted(m.user_id for m in publisher.messages) == ["a", "b"]


class ExplodingPublisher:
    """A fake publisher whose push always fails."""

    def publish(self, message: object) -> None:
        raise ConnectionError("browser gone")


@pytest.mark.clause("CTX-DELIVERY.2")
def test_a_failing_push_does_not_undo_a_committed_dispatch(
    client: TestClient, service: SchedulerService, engine: Engine
) -> None:
    """CTX-DELIVERY.2: the push happens after commit, so its failure is logged and the row stays dispatched."""
    stored = post_event(client)
    service.scheduler.publisher = ExplodingPublisher()
    assert service.scheduler.poll_once().dispatched == 1
    [row] = rows(engine, "SELECT status FROM scheduled_events WHERE id = :id", id=stored["id"])
    assert row["status"] == "dispatched"


@pytest.mark.clause("CTX-DELIVERY.3")
def test_a_failing_push_is_logged_by_the_publish_path_not_the_inbox_on_the_loop_and_the_live_path(
    settings: Settings, engine: Engine, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """CTX-DELIVERY.3: a service mounted without the inbox, whose publisher always fails: the
    loop's push and the live route's are each logged once, under ``scheduler.core.poll``
    with the name of who published, and nothing under the inbox's logger."""
    service = SchedulerService(settings, engine=engine, clock=clock, publisher=ExplodingPublisher(),
                               run_scheduler=False)
    with TestClient(service.app_for("api", "health")) as client:
        post_event(client, user_id="anna")
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert service.scheduler.poll_once().dispatched == 1
            body = {"event_type": "t", "user_id": "bob", "facts": reminder_facts()}
            assert client.post("/admin/ingest-event", headers=INGEST, json=body).status_code == 200
    pushes = [(r.name, r.getMessage().split(":")[0]) for r in caplog.records if "publishing" in r.getMessage()]
    assert pushes == [("scheduler.core.poll", "scheduler"), ("scheduler.core.poll", "live")]
    assert all(r.exc_info is not None for r in caplog.records if "publishing" in r.getMessage())
    assert [r for r in caplog.records if r.name.startswith("scheduler.web.inbox")] == []


@pytest.mark.clause("CTX-LIVE.1")
def test_live_ingest_answers_each_documented_status(client: TestClient, publisher: RecordingPublisher) -> None:
    """CTX-LIVE.1: 200 delivered, 409 duplicate, 202 suppressed, 204 no rule fired, 400 no rule, 422 bad facts."""

    def send(facts: dict[str, object], user_id: str = "p1") -> int:
        body = {"event_type": "t", "user_id": user_id, "facts": facts}
        return int(client.post("/admin/ingest-event", headers=INGEST, json=body).status_code)

    assert send(reminder_facts()) == 200
    assert len(publisher.messages) == 1
    assert send(reminder_facts()) == 409
    client.put("/admin/participants/p2/preferences", headers=ADMIN, json={"enabled_kinds": ["summary"]})
    assert send(reminder_facts(), user_id="p2") == 202
    week = {"facts_version": "1", "scenario": "self_consumption", "week": "2026-W48"}
    assert send({**week, "self_consumption_pct": 90}) == 204
    assert send({**week, "scenario": "unheard_of"}) == 400
    assert send({**week, "week": "W48"}) == 422
    assert len(publisher.messages) == 1
