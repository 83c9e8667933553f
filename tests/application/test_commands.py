"""APP-2 and APP-3: the commands, their source statuses, their audit rows and records.

Reset, cancel, bulk reset and bulk cancel act on the same source statuses whatever runs
them (``RESETTABLE``: every status; ``CANCELLABLE``: pending and failed), are audited with
the adapter that ran them, and return typed records. The replica simulation runs the same
commands.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from harness import Simulation
from scheduler.application import commands
from scheduler.application.events import EventQuery, EventRecord
from scheduler.cli import build_parser, main
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from scheduler.types import EventStatus
from tests.application.support import one_row_per_status
from tests.conftest import ADMIN, INGEST
from tests.helpers import event_row, rows
from tests.operations.support import sign_in


def _choices(*command: str) -> set[str]:
    parser = build_parser()
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        parser = action.choices[command[0]]  # type: ignore[index]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        parser = action.choices[command[1]]  # type: ignore[index]
    [status] = [a for a in parser._actions if a.dest == "status"]
    return set(status.choices or [])


@pytest.mark.clause("APP-2")
@pytest.mark.clause("DEC-12")
def test_the_source_statuses_come_from_the_status_enum_and_the_cli_offers_exactly_them() -> None:
    """APP-2: RESETTABLE is every status (a cancelled row can be reset), CANCELLABLE pending and failed;
    `events reset --status` offers the reset's sources and `events list --status` every status."""
    assert frozenset(EventStatus) == commands.RESETTABLE
    assert {EventStatus.PENDING, EventStatus.FAILED} == commands.CANCELLABLE
    assert _choices("events", "reset") == {str(s) for s in commands.RESETTABLE}
    assert _choices("events", "list") == {str(s) for s in EventStatus}


@pytest.mark.clause("APP-2")
@pytest.mark.clause("DEC-12")
@pytest.mark.parametrize("adapter", ["api", "console", "cli", "bulk"])
def test_a_reset_acts_on_the_same_statuses_through_every_adapter(
    client: TestClient, service: SchedulerService, engine: Engine, database_url: str,
    monkeypatch: pytest.MonkeyPatch, adapter: str,
) -> None:
    """APP-2: through the API, the console, the CLI and the console's bulk reset, a row of every
    status (a cancelled one too) ends pending, without its error or dispatch time."""
    ids = one_row_per_status(client, service)
    csrf = sign_in(client)
    monkeypatch.setenv("DATABASE_URL", database_url)
    if adapter == "bulk":
        form = client.get("/console/bulk-reset", params={"community_id": "community-1"}).text
        expected = re.search(r'id="dry-run-count">(\d+)<', form)
        assert expected is not None and int(expected[1]) == 3  # every row of community-1, whatever its status
        as_of = re.search(r'name="as_of" value="([^"]+)"', form)
        assert as_of is not None
        assert client.post("/console/bulk-reset", data={"csrf": csrf, "community_id": "community-1",
                                                        "as_of": as_of[1], "expected": "3",
                                                        "reason": "again"}).status_code == 200
        assert client.post("/console/bulk-reset", data={"csrf": csrf, "community_id": "community-2",
                                                        "as_of": as_of[1], "expected": "1",
                                                        "reason": "again"}).status_code == 200
    for status, event_id in ids.items():
        if adapter == "api":
            assert client.post(f"/admin/scheduled-events/{event_id}/reset", headers=ADMIN).status_code == 200
        elif adapter == "console":
            answer = client.post(f"/console/events/{event_id}/reset", data={"csrf": csrf}, follow_redirects=False)
            assert answer.status_code == 303
        elif adapter == "cli":
            assert main(["events", "reset", event_id]) == 0, status
        row = event_row(engine, event_id)
        assert (row["status"], row["last_error"], row["dispatched_at"]) == ("pending", None, None), (adapter, status)


@pytest.mark.clause("APP-2")
@pytest.mark.parametrize("adapter", ["api", "console", "cli", "bulk", "console-bulk"])
def test_a_cancel_acts_on_the_same_statuses_through_every_adapter(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock, database_url: str,
    monkeypatch: pytest.MonkeyPatch, adapter: str,
) -> None:
    """APP-2: through the API, the console, the CLI, a bulk cancel and the console's bulk cancel,
    pending and failed rows end cancelled; a dispatched row stays dispatched (409, exit 1, not
    counted by the bulk dry run); a cancelled one stays as it was."""
    ids = one_row_per_status(client, service)
    before = {s: event_row(engine, i) for s, i in ids.items()}
    monkeypatch.setenv("DATABASE_URL", database_url)
    actor = commands.Actor("ops", "cli")
    csrf = sign_in(client)
    if adapter == "console-bulk":
        for community in ("community-1", "community-2"):
            form = client.get("/console/bulk-cancel", params={"community_id": community}).text
            expected = re.search(r'id="dry-run-count">(\d+)<', form)
            as_of = re.search(r'name="as_of" value="([^"]+)"', form)
            assert expected is not None and as_of is not None
            form_fields = {"csrf": csrf, "community_id": community, "as_of": as_of[1], "expected": expected[1],
                           "reason": "withdrawn"}
            assert client.post("/console/bulk-cancel", data=form_fields).status_code == 200
    if adapter == "bulk":
        query = EventQuery()
        count = commands.count_matching(service.database, query, commands.CANCELLABLE)
        assert count == 2
        done = commands.bulk_cancel(service.database, query, now=clock.now(), as_of=clock.now(), expected=count,
                                    actor=actor, reason="withdrawn campaign")
        assert done.changed == 2
    for status, event_id in ids.items():
        if adapter == "api":
            answer = client.delete(f"/admin/scheduled-events/{event_id}", headers=INGEST)
            assert answer.status_code == (409 if status is EventStatus.DISPATCHED else 200)
        elif adapter == "console":
            answer = client.post(f"/console/events/{event_id}/cancel", data={"csrf": csrf, "reason": "withdrawn"},
                                 follow_redirects=False)
            assert answer.status_code == (409 if status is EventStatus.DISPATCHED else 303)
        elif adapter == "cli":
            assert main(["events", "cancel", event_id]) == (1 if status is EventStatus.DISPATCHED else 0)
    after = {s: event_row(engine, i) for s, i in ids.items()}
    assert after[EventStatus.DISPATCHED] == before[EventStatus.DISPATCHED]
    assert after[EventStatus.CANCELLED] == before[EventStatus.CANCELLED]
    assert after[EventStatus.PENDING]["status"] == after[EventStatus.FAILED]["status"] == "cancelled"
    assert after[EventStatus.FAILED]["last_error"] == before[EventStatus.FAILED]["last_error"]


@pytest.mark.clause("APP-3")
def test_every_command_is_audited_with_its_adapter_and_returns_typed_records(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """APP-3: reset, cancel, bulk reset and bulk cancel each write one audit row (actor, source, action,
    count of rows changed, reason, the query) linked to the rows they changed; a cancel that changed
    nothing is recorded with count 0; each returns a dataclass, the row an EventRecord."""
    ids = one_row_per_status(client, service)
    actor = commands.Actor("ops-kim", "cli")
    reset = commands.reset(service.database, ids[EventStatus.FAILED], now=clock.now(), actor=actor, reason="fixed")
    cancel = commands.cancel(service.database, now=clock.now(), actor=actor, external_key="sent")
    assert dataclasses.is_dataclass(reset) and isinstance(reset.event, EventRecord)
    assert (reset.outcome, reset.event.status, cancel.outcome) == ("reset", EventStatus.PENDING, "dispatched")
    query = EventQuery(user_id="anna")
    bulk = commands.bulk_cancel(service.database, query, now=clock.now(), as_of=clock.now(), expected=5,
                                actor=actor, reason="left the programme", chunk=1)
    assert (bulk.changed, bulk.chunks) == (1, 1)  # anna's pending row; her dispatched one is not cancellable
    again = commands.bulk_reset(service.database, query, now=clock.now(), as_of=clock.now(), expected=5,
                                actor=actor, reason="rejoined", chunk=1)
    assert (again.changed, again.chunks) == (2, 2)
    with pytest.raises(ValueError, match="reason"):
        commands.bulk_reset(service.database, query, now=clock.now(), as_of=clock.now(), expected=5,
                            actor=actor, reason="  ")
    trail = rows(engine, "SELECT a.actor, a.source, a.action, a.event_id, a.count, a.reason, a.filter, "
                 "array(SELECT event_id FROM operator_action_events l WHERE l.action_id = a.id ORDER BY 1) AS linked "
                 "FROM operator_actions a ORDER BY a.id")
    api_cancel = trail.pop(0)  # one_row_per_status's own cancel, over the API
    assert (api_cancel["source"], api_cancel["action"], api_cancel["count"]) == ("api", "cancel", 1)
    anna = sorted([ids[EventStatus.DISPATCHED], ids[EventStatus.PENDING]])
    assert [(a["action"], a["count"], a["reason"], a["filter"], sorted(a["linked"])) for a in trail] == [
        ("reset", 1, "fixed", None, [ids[EventStatus.FAILED]]),
        ("cancel", 0, None, None, []),
        ("bulk_cancel", 1, "left the programme", {"user_id": "anna"}, [ids[EventStatus.PENDING]]),
        ("bulk_reset", 2, "rejoined", {"user_id": "anna"}, anna),
    ]
    assert {(a["actor"], a["source"]) for a in trail} == {("ops-kim", "cli")}
    assert json.loads(client.get("/admin/audit", headers=ADMIN).text)[0]["action"] == "bulk_reset"


@pytest.mark.clause("APP-3")
def test_bulk_cancel_skips_rows_a_poll_holds_and_leaves_rows_changed_since_the_dry_run(
    client: TestClient, service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """APP-3: like the bulk reset, the bulk cancel never waits for a row a poll holds, and a row that
    changed after the dry run is not touched."""
    from datetime import timedelta

    from tests.conftest import T0
    from tests.helpers import post_event

    ids = [post_event(client, user_id=f"u{n}", trigger_at=T0 + timedelta(days=1))["id"] for n in range(4)]
    as_of = clock.now()
    clock.advance(timedelta(seconds=5))
    moved = post_event(client, user_id="u9", trigger_at=T0 + timedelta(days=1))["id"]  # after the dry run
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM scheduled_events WHERE id = :id FOR UPDATE"), {"id": ids[0]})
        done = commands.bulk_cancel(service.database, EventQuery(), now=clock.now(), as_of=as_of, expected=5,
                                    actor=commands.Actor("ops", "console"), reason="campaign over", chunk=2)
        holder.rollback()
    assert done.changed == 3
    assert [event_row(engine, i)["status"] for i in [*ids, moved]] == ["pending", *["cancelled"] * 3, "pending"]


@pytest.mark.clause("APP-3")
def test_the_simulation_resets_and_cancels_through_the_audited_commands(database_url: str, engine: Engine) -> None:
    """APP-3: the replica simulation's operator reset and sender cancel are production's commands:
    each leaves its audit row (source `simulation`) and its history entry."""
    with Simulation(database_url, replicas=1, clients=1, batch_size=2) as sim:
        sim.post(user=0, trigger=-5)
        sim.post(user=1, trigger=5)
        sim.run(0)
        sim.reset(0)
        sim.cancel(1)
        sim.drain()
    trail = rows(engine, "SELECT actor, source, action, count FROM operator_actions ORDER BY id")
    assert [(a["actor"], a["source"], a["action"], a["count"]) for a in trail] == [
        ("simulation", "simulation", "reset", 1), ("simulation", "simulation", "cancel", 1)]
    changes = rows(engine, "SELECT change, actor FROM scheduled_event_history WHERE change IN ('reset', 'cancelled')")
    assert sorted((c["change"], c["actor"]) for c in changes) == [("cancelled", "simulation"), ("reset", "simulation")]
