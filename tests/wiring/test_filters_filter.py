"""WIRE-2: every query filter of an admin route filters.

The query parameters come from the app's own ``/openapi.json``, so a route or parameter
added later without a case here fails ``test_every_documented_query_parameter_has_a_case``.
Each case asks with the filter and without it, over data where the filter has something
to remove, and expects exactly the unfiltered rows that match (``limit``: the first ones).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.service import SchedulerService
from scheduler.web.api.openapi import openapi_document
from tests.conftest import ADMIN, INGEST, T0, token
from tests.helpers import drain, post_event, reminder_facts
from tests.operations.support import sign_in


@dataclass(frozen=True)
class Case:
    value: str
    keeps: Callable[[dict[str, Any]], bool] | None  # None: ``limit``, the first rows in order
    # ``cursor``: the value is the next cursor of a page of ``value`` rows, and the answer
    # is every row after that page, in order
    cursor: bool = False


DAY_ONE = (T0 + timedelta(days=1)).isoformat()


def _at(row: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(row["trigger_at"])


FILTERS: dict[tuple[str, str], Case] = {
    ("/admin/scheduled-events", "status"): Case("failed", lambda r: r["status"] == "failed"),
    ("/admin/scheduled-events", "user_id"): Case("anna", lambda r: r["user_id"] == "anna"),
    ("/admin/scheduled-events", "limit"): Case("2", None),
    ("/admin/scheduled-events", "external_key"): Case("anna-later", lambda r: r["external_key"] == "anna-later"),
    ("/admin/scheduled-events", "event_type"): Case("other_reminder", lambda r: r["event_type"] == "other_reminder"),
    ("/admin/scheduled-events", "community_id"): Case("community-2", lambda r: r["community_id"] == "community-2"),
    ("/admin/scheduled-events", "trigger_from"): Case(DAY_ONE, lambda r: _at(r) >= T0 + timedelta(days=1)),
    ("/admin/scheduled-events", "trigger_to"): Case(DAY_ONE, lambda r: _at(r) < T0 + timedelta(days=1)),
    ("/admin/scheduled-events", "error_contains"): Case(
        "TIME_SCOPE", lambda r: "time_scope" in (r["last_error"] or "").lower()),
    ("/admin/scheduled-events", "cursor"): Case("2", None, cursor=True),
    ("/admin/notifications", "status"): Case("suppressed", lambda r: r["status"] == "suppressed"),
    ("/admin/notifications", "user_id"): Case("ben", lambda r: r["user_id"] == "ben"),
    ("/admin/notifications", "limit"): Case("1", None),
    # the varied rows' deliveries: anna's and ben's in-app rows, and one queued sms row of a
    # notification of known id (``OUTBOX_NOTE``)
    ("/admin/deliveries", "status"): Case("queued", lambda r: r["status"] == "queued"),
    ("/admin/deliveries", "channel"): Case("web", lambda r: r["channel"] == "web"),
    ("/admin/deliveries", "user_id"): Case("anna", lambda r: r["user_id"] == "anna"),
    ("/admin/deliveries", "notification_id"): Case("note-outbox", lambda r: r["notification_id"] == "note-outbox"),
    ("/admin/deliveries", "limit"): Case("1", None),
    # the varied rows' two operator actions have ids 1 and 2 (a fresh database)
    ("/admin/audit", "limit"): Case("1", None),
    ("/admin/audit", "before_id"): Case("2", lambda r: r["id"] < 2),
    # one console session and one inbox page session
    ("/admin/sessions", "kind"): Case("participant", lambda r: r["kind"] == "participant"),
}


def documented_filters(service: SchedulerService) -> set[tuple[str, str]]:
    document = openapi_document(service.app.routes)
    return {
        (path, parameter["name"])
        for path, operations in document["paths"].items()
        # the routes under /me answer pages, not lists: their parameters are tested in
        # tests/requirements/test_inbox.py
        if path.startswith("/admin")
        for method, operation in operations.items()
        if method == "get"
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "query"
    }


@pytest.fixture
def varied(client: TestClient, service: SchedulerService) -> None:
    """Rows that differ in every filtered dimension: two users, every event status,
    sent and suppressed notifications, two operator actions, an admin's and a participant's session."""
    post_event(client, user_id="anna")  # dispatched, sent
    post_event(client, user_id="anna", facts=reminder_facts("not-a-date"))  # failed
    post_event(client, user_id="ben")  # dispatched, then a suppressed live repeat
    later = post_event(client, user_id="ben", trigger_at=T0 + timedelta(days=1),
                       community_id="community-2")  # stays pending
    post_event(client, user_id="anna", trigger_at=T0 + timedelta(days=2), external_key="anna-later",
               event_type="other_reminder")  # pending
    drain(service)
    for _ in range(2):  # two operator actions for the audit trail's filters (the row stays pending)
        assert client.post(f"/admin/scheduled-events/{later['id']}/reset", headers=ADMIN).status_code == 200
    client.put("/admin/participants/ben/preferences", headers=ADMIN, json={"enabled_kinds": [], "max_per_day": 3})
    live = {"event_type": "reminder", "user_id": "ben", "facts": reminder_facts("2026-12-01")}
    assert client.post("/admin/ingest-event", headers=INGEST, json=live).status_code == 202
    sign_in(client)
    assert client.post("/inbox/session", json={"token": token(None, subject="ben")}).status_code == 201
    with service.engine.begin() as conn:  # an outbox row of a notification of known id
        conn.execute(text(
            "INSERT INTO scheduler.notifications (id, user_id, community_id, rule_id, kind, scenario, time_scope,"
            " dedup_key, title, body, status, reason, source, created_at)"
            " SELECT 'note-outbox', user_id, community_id, rule_id, kind, scenario, time_scope, 'key-outbox',"
            " title, body, status, reason, source, created_at FROM scheduler.notifications"
            " WHERE user_id = 'ben' AND status = 'sent' LIMIT 1"))
        conn.execute(text(
            "INSERT INTO scheduler.deliveries (notification_id, user_id, channel, status, created_at,"
            " idempotency_key, next_attempt_at) SELECT id, user_id, 'sms', 'queued', created_at, 'key-1',"
            " created_at FROM scheduler.notifications WHERE id = 'note-outbox'"))


@pytest.mark.clause("WIRE-2")
def test_every_documented_query_parameter_has_a_case(service: SchedulerService) -> None:
    """WIRE-2: each query parameter /openapi.json documents has a filter case here."""
    assert sorted(documented_filters(service) - set(FILTERS)) == []
    assert sorted(set(FILTERS) - documented_filters(service)) == []


@pytest.mark.clause("WIRE-2")
@pytest.mark.parametrize(("path", "parameter"), sorted(FILTERS), ids=[f"{p}?{q}" for p, q in sorted(FILTERS)])
def test_each_filter_of_an_admin_route_returns_exactly_the_matching_rows(
    client: TestClient, varied: None, path: str, parameter: str
) -> None:
    """WIRE-2: with the filter, exactly the unfiltered rows it keeps, and it had rows to remove."""
    case = FILTERS[(path, parameter)]
    everything = client.get(path, headers=ADMIN).json()
    value = case.value
    if case.cursor:
        value = client.get(path, headers=ADMIN, params={"limit": case.value}).headers["X-Next-Cursor"]
        expected = everything[int(case.value):]
    elif case.keeps is None:
        expected = everything[: int(case.value)]
    else:
        expected = [r for r in everything if case.keeps(r)]
    assert expected, "the data gives this filter nothing to keep"
    assert len(expected) < len(everything), "the data gives this filter nothing to remove"
    filtered = client.get(path, headers=ADMIN, params={parameter: value})
    assert filtered.status_code == 200, filtered.text
    assert [r["id"] for r in filtered.json()] == [r["id"] for r in expected]


@pytest.mark.clause("WIRE-2")
@pytest.mark.parametrize(
    ("arguments", "keeps"),
    [
        (["--status", "failed"], lambda r: r["status"] == "failed"),
        (["--user-id", "anna"], lambda r: r["user_id"] == "anna"),
        (["--limit", "2"], None),
        (["--external-key", "anna-later"], lambda r: r["external_key"] == "anna-later"),
    ],
    ids=["status", "user-id", "limit", "external-key"],
)
def test_each_filter_of_scheduler_events_list_returns_exactly_the_matching_rows(
    client: TestClient, varied: None, database_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], arguments: list[str], keeps: Callable[[dict[str, Any]], bool] | None,
) -> None:
    """WIRE-2: the command line's filters reach the query just as the route's do."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    everything = client.get("/admin/scheduled-events", headers=ADMIN).json()
    expected = everything[:2] if keeps is None else [r for r in everything if keeps(r)]
    assert 0 < len(expected) < len(everything)
    capsys.readouterr()
    assert main(["events", "list", "--json", *arguments]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [r["id"] for r in expected]
