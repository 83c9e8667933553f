"""Context: preferences and the daily cap (REQ-0036 to REQ-0040).

In our words: each participant has the kinds they want (default: all) and ``max_per_day``
(default 3). A notification of a disabled kind is suppressed ``kind_disabled``; one over
the cap is suppressed ``rate_limited``. The cap counts the participant's sent deliveries
of the current UTC day, and it holds exactly even when two replicas deliver to the same
participant at the same moment.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.service import SchedulerService
from tests.conftest import ADMIN, INGEST, T0
from tests.helpers import post_event, reminder_facts, rows


def ingest(client: TestClient, day: str, user_id: str = "p1") -> int:
    body = {"event_type": "t", "user_id": user_id, "facts": reminder_facts(day)}
    return int(client.post("/admin/ingest-event", headers=INGEST, json=body).status_code)


def days(n: int) -> list[str]:
    return [f"2026-10-{d:02d}" for d in range(1, n + 1)]


def sent(engine: Engine, user_id: str = "p1") -> int:
    return len(rows(engine, "SELECT id FROM deliveries WHERE status = 'sent' AND user_id = :u", u=user_id))


@pytest.mark.clause("CTX-PREFS.1")
def test_without_preferences_every_kind_is_enabled_and_the_cap_is_three(client: TestClient, engine: Engine) -> None:
    """CTX-PREFS.1: defaults: all kinds, three sent per day, then rate_limited."""
    assert [ingest(client, d) for d in days(5)] == [200, 200, 200, 202, 202]
    reasons = [r["reason"] for r in rows(engine, "SELECT reason FROM notifications ORDER BY time_scope")]
    assert reasons == [None, None, None, "rate_limited", "rate_limited"]


@pytest.mark.clause("CTX-PREFS.2")
def test_a_disabled_kind_is_suppressed_and_does_not_count_toward_the_cap(client: TestClient, engine: Engine) -> None:
    """CTX-PREFS.2: kind_disabled suppressions are recorded but do not use up the day's cap."""
    client.put("/admin/participants/p1/preferences", headers=ADMIN, json={"enabled_kinds": [], "max_per_day": 1})
    assert [ingest(client, d) for d in days(3)] == [202, 202, 202]
    assert {r["reason"] for r in rows(engine, "SELECT reason FROM notifications")} == {"kind_disabled"}
    client.put("/admin/participants/p1/preferences", headers=ADMIN, json={"enabled_kinds": None, "max_per_day": 1})
    assert ingest(client, "2026-10-20") == 200
    assert ingest(client, "2026-10-21") == 202


@pytest.mark.clause("DEC-4")
@pytest.mark.clause("CTX-PREFS.3")
def test_the_cap_counts_the_current_utc_day_only(client: TestClient, clock: ManualClock) -> None:
    """CTX-PREFS.3: yesterday's deliveries do not count today; the window is midnight to midnight UTC."""
    clock.set(T0.replace(hour=23, minute=59))
    assert [ingest(client, d) for d in days(4)] == [200, 200, 200, 202]
    clock.advance(timedelta(minutes=2))  # 00:01 the next day
    assert ingest(client, "2026-10-10") == 200


@pytest.mark.clause("CTX-PREFS.4")
def test_the_cap_holds_exactly_when_many_live_events_race_for_one_participant(
    client: TestClient, engine: Engine
) -> None:
    """CTX-PREFS.4: twelve concurrent live events, distinct periods: exactly three sent."""
    barrier = threading.Barrier(12, timeout=30)

    def send(day: str) -> int:
        barrier.wait()
        return ingest(client, day)

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = sorted(pool.map(send, days(12)))
    assert answers == [200] * 3 + [202] * 9
    assert sent(engine) == 3


@pytest.mark.clause("CTX-PREFS.4")
def test_the_cap_holds_exactly_when_two_replicas_deliver_to_one_participant_at_once(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """CTX-PREFS.4: two schedulers' batches for the same participant, run at once: three sent in all.

    Whichever claim comes second finds the participant busy and leaves its rows pending
    (DEC-2: a claim never waits); the next polls take them. Either way, ten dispatched."""
    for i, day in enumerate(days(10)):
        post_event(client, user_id="p1", facts=reminder_facts(day), trigger_at=T0 - timedelta(minutes=i))
    replicas = [Scheduler(service.database, service.dispatcher, clock, batch_size=5, name=f"r{i}") for i in range(2)]
    barrier = threading.Barrier(2, timeout=30)

    def run(replica: Scheduler) -> int:
        barrier.wait()
        return replica.poll_once().dispatched

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = sum(pool.map(run, replicas))
    assert first in (5, 10)
    later = sum(replicas[0].poll_once().dispatched for _ in range(2))
    assert first + later == 10
    assert sent(engine) == 3
    reasons = sorted(str(r["reason"]) for r in rows(engine, "SELECT reason FROM notifications"))
    assert reasons == ["None"] * 3 + ["rate_limited"] * 7
