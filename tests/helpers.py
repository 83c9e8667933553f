"""Small builders shared by the requirement tests (no fakes of the database here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, text
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from scheduler.core.loop import Batch, EventOutcome, PollReport, Scheduler
from scheduler.nudging.orchestrator import Delivery, DeliveryRow
from scheduler.nudging.rules import Catalogue, load_catalogue
from scheduler.service import SchedulerService
from scheduler.types import (
    DeclaredDispatcher,
    DigitalTwinEvent,
    DispatchResult,
    NotificationStatus,
    OutboundMessage,
)
from tests.conftest import INGEST, T0


def reminder_facts(day: str = "2026-11-30", **extra: Any) -> dict[str, Any]:
    """Facts that the shipped commitment-reminder rule turns into a notification."""
    return {
        "facts_version": "1.0",
        "scenario": "commitment_reminder",
        "date": day,
        "commitment": "run the dishwasher at noon",
        **extra,
    }


def event_body(
    *,
    user_id: str = "participant-1",
    trigger_at: datetime | str = T0,
    facts: Any = None,
    external_key: str | None = None,
    event_type: str = "commitment_reminder",
    community_id: str | None = "community-1",
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event_type": event_type,
        "user_id": user_id,
        "community_id": community_id,
        "trigger_at": trigger_at.isoformat() if isinstance(trigger_at, datetime) else trigger_at,
        "facts": reminder_facts() if facts is None else facts,
    }
    if external_key is not None:
        body["external_key"] = external_key
    return body


def post_event(client: TestClient, **kwargs: Any) -> dict[str, Any]:
    """POST a scheduled event that must be accepted; return the stored row."""
    response = client.post("/admin/scheduled-events", headers=INGEST, json=event_body(**kwargs))
    assert response.status_code == 201, response.text
    row: dict[str, Any] = response.json()
    return row


def rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql), params).mappings()]


def event_row(engine: Engine, event_id: str) -> dict[str, Any]:
    found = rows(engine, "SELECT * FROM scheduled_events WHERE id = :id", id=event_id)
    assert found, f"no row {event_id}"
    return found[0]


def statuses(engine: Engine) -> dict[str, str]:
    return {r["id"]: r["status"] for r in rows(engine, "SELECT id, status FROM scheduled_events")}


MAX_DRAIN_POLLS = 1000


def drain(service: SchedulerService, max_polls: int = MAX_DRAIN_POLLS) -> list[PollReport]:
    """Poll until a poll claims nothing; return every report. A loop that claims for ever
    (rows that never leave ``pending``) fails after ``max_polls`` polls instead of hanging."""
    reports: list[PollReport] = []
    for _ in range(max_polls):
        report = service.scheduler.poll_once()
        if report.claimed == 0:
            return reports
        reports.append(report)
    raise AssertionError(f"still claiming rows after {max_polls} polls: do claimed rows never leave pending?")


def dispatch_all(scheduler: Scheduler, batch: Batch, each: Callable[[], None] | None = None) -> list[EventOutcome]:
    """Dispatch every event of ``batch`` (calling ``each`` after each one). A dispatch_next
    that never runs out (a bug that does not advance) fails instead of spinning."""
    outcomes: list[EventOutcome] = []
    for _ in range(len(batch.events) + 1):
        outcome = scheduler.dispatch_next(batch)
        if outcome is None:
            return outcomes
        outcomes.append(outcome)
        if each is not None:
            each()
    raise AssertionError(f"dispatch_next did not run out after the batch's {len(batch.events)} events")


DEADLINE_SECONDS = 30.0


T = TypeVar("T")
# How long an app's shutdown may take (its loop stopped, its replica row deleted, its listener
# and engines closed); a loop that sleeps out its interval instead of stopping fails here.
SHUTDOWN_DEADLINE_SECONDS = 10.0


def bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run ``fn`` in a thread and fail (instead of hanging the suite) if it has not returned
    within ``timeout`` seconds: the guard against the hang these tests look for."""
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            errors.append(exc)

    thread = threading.Thread(target=target, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"{what} did not return within {timeout:g}s: it hangs")
    if errors:
        raise errors[0]
    return result[0]


@contextlib.contextmanager
def running(app: ASGIApp, what: str = "the app's shutdown") -> Iterator[TestClient]:
    """A test client inside ``app``'s lifespan, for an app whose lifespan runs the loop: on
    leaving, the shutdown must finish within ``SHUTDOWN_DEADLINE_SECONDS`` (``with
    TestClient(app)`` alone waits for it without a deadline)."""
    client = TestClient(app)
    client.__enter__()
    try:
        yield client
    finally:
        bounded(lambda: client.__exit__(None, None, None), SHUTDOWN_DEADLINE_SECONDS, what)


async def eventually(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_SECONDS) -> None:
    """Yield to the event loop until ``condition()`` holds; fail naming ``what`` after
    ``timeout`` seconds (the deadline only turns a hang into a failure, it times nothing)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.001)


def later(hours: float = 1) -> timedelta:
    return timedelta(hours=hours)


class FakeDispatcher(DeclaredDispatcher):
    """A fake at the dispatcher edge: fails for chosen users, records what it was handed,
    and delegates everything else to the real platform."""

    # it wraps the platform and writes nothing of its own: declared safe to call again
    # (DEC-1.4), so the replay tests' batches run optimistically
    safe_to_repeat = True

    def __init__(self, real: Any, fail_for: Mapping[str, Exception] | None = None) -> None:
        self.real = real
        self.fail_for = dict(fail_for or {})
        self.seen: list[DigitalTwinEvent] = []

    def __call__(self, session: Any, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        self.seen.append(event)
        if event.user_id in self.fail_for:
            raise self.fail_for[event.user_id]
        result: DispatchResult = self.real(session, event, now)
        return result


def ids(items: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[str]:
    return sorted(item["id"] for item in items)


def wait_until_blocked_on_a_lock(engine: Engine, timeout: float = 30.0, count: int = 1) -> None:
    """Wait (on PostgreSQL's own view, not a timer) until ``count`` backends wait on a lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = rows(
            engine,
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        if len(waiting) >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{count} backend(s) did not start waiting on a lock within {timeout:g} s")


class FakeWebPush:
    """A fake second channel at the delivery edge (web push): a sent delivery row and a push for
    every participant but the ``unsubscribed`` ones, who get a failed row and nothing pushed."""

    name = "web-push"

    def __init__(self, unsubscribed: frozenset[str] = frozenset()) -> None:
        self.unsubscribed = unsubscribed

    def deliver(self, notification: Mapping[str, Any], now: datetime) -> Delivery:
        if notification["user_id"] in self.unsubscribed:
            return Delivery(rows=(DeliveryRow(self.name, NotificationStatus.FAILED, "fake: no push subscription"),))
        message = OutboundMessage(notification["id"], notification["user_id"], notification["community_id"],
                                  self.name, notification["kind"], notification["title"], notification["body"],
                                  notification["rule_id"])
        return Delivery(rows=(DeliveryRow(self.name, NotificationStatus.SENT),), outbound=(message,))


SHIPPED_RULES = Path(__file__).parents[1] / "src" / "scheduler" / "nudging" / "rules_catalogue" / "reminders.json"


def catalogue_with_a_second_rule(folder: Path, evaluator: str) -> Catalogue:
    """The shipped rules plus a second rule on commitment reminders (another kind, the test's
    ``evaluator``, e.g. one that raises when the facts ask for it), written to and loaded from
    ``folder``."""
    rules = json.loads(SHIPPED_RULES.read_text())
    rules.append({
        "id": "commitment-nudge", "description": "A second rule on the same scenario.", "enabled": True,
        "scenarios": ["commitment_reminder"], "frequency": "daily", "kind": "nudge", "required_facts": [],
        "title": "Nudge {{ scope }}", "body": "{{ commitment }}", "evaluator": evaluator,
    })
    (folder / "rules.json").write_text(json.dumps(rules))
    return load_catalogue(folder)
