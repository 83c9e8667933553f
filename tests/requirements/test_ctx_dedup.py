"""Context: deduplication (REQ-0033 to REQ-0035).

In our words: a notification's deduplication key is ``<rule>:<user>:<community or
empty>:<scope>``. A unique constraint on the key is the arbiter between racing writers,
live or scheduled. A duplicate is recorded once per key as a ``suppressed_dedup``
notification; later repeats only bump a counter and a last-seen time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.core.clock import ManualClock
from tests.conftest import INGEST
from tests.helpers import reminder_facts, rows


def ingest(client: TestClient, user_id: str = "p1", community_id: str | None = "c1", day: str = "2026-11-30") -> int:
    body = {"event_type": "t", "user_id": user_id, "community_id": community_id, "facts": reminder_facts(day)}
    return int(client.post("/admin/ingest-event", headers=INGEST, json=body).status_code)


@pytest.mark.clause("CTX-DEDUP.1")
def test_the_key_names_rule_participant_community_and_scope(client: TestClient, engine: Engine) -> None:
    """CTX-DEDUP.1: <rule>:<user>:<community or empty>:<scope>; any part differing is a new key."""
    assert ingest(client) == 200
    assert ingest(client, community_id=None) == 200
    assert ingest(client, user_id="p2") == 200
    assert ingest(client, day="2026-12-01") == 200
    keys = sorted(r["key"] for r in rows(engine, "SELECT key FROM dedup_keys"))
    assert keys == [
        "commitment-reminder:p1::2026-11-30",
        "commitment-reminder:p1:c1:2026-11-30",
        "commitment-reminder:p1:c1:2026-12-01",
        "commitment-reminder:p2:c1:2026-11-30",
    ]


@pytest.mark.clause("CTX-DEDUP.2")
def test_racing_writers_of_one_key_yield_exactly_one_notification(client: TestClient, engine: Engine) -> None:
    """CTX-DEDUP.2: sixteen concurrent live events for one key: one 200, fifteen 409, one sent row."""
    barrier = threading.Barrier(16, timeout=30)

    def send(_: int) -> int:
        barrier.wait()
        return ingest(client)

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = sorted(pool.map(send, range(16)))
    assert answers == [200] + [409] * 15
    assert len(rows(engine, "SELECT id FROM notifications WHERE status = 'sent'")) == 1


@pytest.mark.clause("CTX-DEDUP.3")
def test_a_duplicate_is_recorded_once_and_later_repeats_only_count(
    client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """CTX-DEDUP.3: one suppressed_dedup row per key; repeats bump duplicate_count and last_duplicate_at."""
    assert ingest(client) == 200
    for _ in range(3):
        clock.advance(timedelta(minutes=5))
        assert ingest(client) == 409
    notes = rows(engine, "SELECT status, reason FROM notifications ORDER BY created_at")
    assert [(n["status"], n["reason"]) for n in notes] == [("sent", None), ("suppressed", "suppressed_dedup")]
    [key] = rows(engine, "SELECT duplicate_count, last_duplicate_at, duplicate_notification_id FROM dedup_keys")
    assert key["duplicate_count"] == 3
    assert key["last_duplicate_at"] == clock.now()
    assert key["duplicate_notification_id"] is not None
