"""APP-1 and APP-4: one query model of scheduled events, whatever the adapter.

The API list, the console's events page, ``scheduler events list`` and the bulk
commands' dry run select rows by one ``EventQuery`` bound to one WHERE fragment of
queries.sql; the API list pages by keyset cursor without changing its body.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.testclient import TestClient

from scheduler.application import commands
from scheduler.application.events import EventQuery
from scheduler.database.queries import SQL_FILE, load_queries
from scheduler.service import SchedulerService
from tests.application.support import api_ids, cli_ids, console_ids, one_row_per_status
from tests.conftest import ADMIN, T0
from tests.helpers import post_event
from tests.operations.support import sign_in

QUERIES = [
    {"status": "cancelled"},
    {"status": "failed", "error_contains": "TIME_scope"},
    {"user_id": "anna"},
    {"community_id": "community-2"},
    {"event_type": "other"},
    {"external_key": "sent"},
    {"trigger_from": "2026-12-01T00:00:00+00:00"},
    {"trigger_to": "2026-12-01T00:00:00+00:00", "user_id": "anna"},
]


@pytest.mark.clause("APP-1")
@pytest.mark.parametrize("params", QUERIES, ids=["&".join(f"{k}={v}" for k, v in q.items()) for q in QUERIES])
def test_every_adapter_selects_the_same_rows_for_one_query(
    client: TestClient, service: SchedulerService, database_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], params: dict[str, str],
) -> None:
    """APP-1: the API list, the console's page, the CLI's list and the bulk dry run agree on each query
    (and each query keeps some rows and removes others)."""
    one_row_per_status(client, service)
    everything = set(api_ids(client, {}))
    by_api = api_ids(client, params)
    assert by_api and len(by_api) < len(everything)
    sign_in(client)
    assert sorted(console_ids(client, params)) == sorted(by_api)
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert cli_ids(params, capsys) == by_api
    query = EventQuery.from_mapping(params)
    assert commands.count_matching(service.database, query, commands.RESETTABLE) == len(by_api)
    cancellable = commands.count_matching(service.database, query, commands.CANCELLABLE)
    assert cancellable == len([i for i in by_api if client.get(
        f"/admin/scheduled-events/{i}", headers=ADMIN).json()["status"] in ("pending", "failed")])


@pytest.mark.clause("APP-1")
def test_the_filter_is_written_once_and_every_list_count_and_bulk_statement_includes_it() -> None:
    """APP-1: queries.sql holds the filter's WHERE clause once, as a fragment; the statements that list,
    count or change rows by a query include it by name (so they cannot drift apart)."""
    text = Path(SQL_FILE).read_text()
    for predicate in ("event_type = :event_type", "last_error ILIKE :error_like", "trigger_at < :trigger_to"):
        assert text.count(predicate) == 1, predicate
    users = ("list_events", "filter_events_page", "filter_pending_page", "count_filtered_events",
             "change_filtered_chunk")
    for name in users:
        assert re.search(r"-- name: " + name + r"\n.*?\{\{event_filter\}\}", text, re.S), name
    fragment = load_queries()["event_filter"].sql
    for name in users:
        assert fragment in load_queries()[name].sql, name


@pytest.mark.clause("APP-1")
def test_a_malformed_query_field_is_a_422_naming_it_in_the_api_and_the_console(client: TestClient) -> None:
    """APP-1: one parser: an unknown status, a time without a zone, a forged cursor are refused alike."""
    sign_in(client)
    for params, field in (({"status": "gone"}, "status"), ({"trigger_from": "2026-12-01T00:00"}, "trigger_from"),
                          ({"cursor": "not-a-cursor"}, "cursor"), ({"user_id": "x" * 201}, "user_id")):
        answer = client.get("/admin/scheduled-events", headers=ADMIN, params=params)
        assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == field, answer.text
        page = client.get("/console/events", params=params)
        assert page.status_code == 422 and field in page.text


@pytest.mark.clause("APP-4")
def test_the_api_list_pages_by_cursor_in_its_order_without_changing_its_body(
    client: TestClient, service: SchedulerService
) -> None:
    """APP-4: with ?limit, each page names the next in X-Next-Cursor and Link; the pages joined are the
    unpaged list in the same order (newest change first, then id), even among rows of one updated_at;
    the last page names none; a cursor of the console's order is refused."""
    for n in range(7):
        post_event(client, user_id=f"user-{n}", trigger_at=T0.replace(hour=10))
    everything = client.get("/admin/scheduled-events", headers=ADMIN)
    assert "X-Next-Cursor" not in everything.headers and "Link" not in everything.headers
    rows = everything.json()
    assert len({r["updated_at"] for r in rows}) == 1  # one instant: the order among them is by id
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    seen: list[str] = []
    params: dict[str, str] = {"limit": "3", "user_id": ""}
    pages = 0
    while True:
        page = client.get("/admin/scheduled-events", headers=ADMIN, params=params)
        assert page.status_code == 200
        assert all(set(r) == set(rows[0]) for r in page.json())
        seen += [r["id"] for r in page.json()]
        pages += 1
        cursor = page.headers.get("X-Next-Cursor")
        if cursor is None:
            assert "Link" not in page.headers
            break
        link = re.fullmatch(r'<([^>]+)>; rel="next"', page.headers["Link"])
        assert link is not None
        assert parse_qs(urlsplit(link[1]).query) == {"limit": ["3"], "cursor": [cursor]}
        params = {"limit": "3", "cursor": cursor}
    assert (pages, seen) == (3, [r["id"] for r in rows])
    sign_in(client)
    first = client.get("/admin/scheduled-events", headers=ADMIN, params={"limit": "1"}).headers["X-Next-Cursor"]
    assert client.get("/console/events", params={"cursor": first}).status_code == 422
