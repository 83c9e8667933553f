"""BATCH-8: whatever PostgreSQL would refuse of a stored event is refused by the item's own
check, naming the field, so no item can make the batch's statement fail.

The set-based store sends every item of a batch in one statement (``store_events_batch``):
one value PostgreSQL refuses there (an offset of 16 hours, a JSON number like ``1e400`` that
Python reads as infinity) would fail the statement, and with it every valid item of the
request. So the one shared item check (``ScheduledEventIn``, ``core.store``) refuses
each such value first: the single POST, each batch item and each imported line answer the
same 422 naming the field. The Hypothesis property below sends hostile items (non-ASCII,
surrogates, NUL, huge and tiny numbers, odd offsets) to the real PostgreSQL of the fixtures.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.cli.events_import import import_lines
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.store import TriggerOutOfRange, store_event
from scheduler.core.store_batch import NewEvent, store_events
from scheduler.database.database import Database
from tests.conftest import INGEST, T0
from tests.helpers import event_body, reminder_facts, rows

BATCH = "/admin/scheduled-events/bulk"
SINGLE = "/admin/scheduled-events"
JSON = {"content-type": "application/json"}
# What the safety net behind the schemas says when the database refused a value itself.
SAFETY_NET = "a value cannot be stored"


class Raw(str):
    """JSON text sent as it is: a number Python's ``json`` would never write (``1e400``)."""


def dumps(value: Any) -> str:
    """``value`` as JSON text, ``Raw`` parts verbatim (strings escaped, lone surrogates too)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(key)}:{dumps(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(item) for item in value) + "]"
    return json.dumps(value)


def send(client: TestClient, path: str, body: str) -> Any:
    return client.post(path, headers={**INGEST, **JSON}, content=body.encode("utf-8"))


def fields_named(error: dict[str, Any]) -> set[str]:
    return {entry["field"] for entry in error.get("errors", [])}


# Each refused for a value PostgreSQL would refuse, and the field its 422 names.
UNSTORABLE: list[tuple[str, dict[str, Any], str]] = [
    ("an offset of +16:00", {**event_body(), "trigger_at": "2026-12-01T00:00:00+16:00"}, "trigger_at"),
    ("an offset of -23:59", {**event_body(), "trigger_at": "2026-12-01T00:00:00-23:59"}, "trigger_at"),
    ("an expiry offset of +16:00", {**event_body(), "expires_at": "2026-12-01T12:00:00+16:00"}, "expires_at"),
    ("1e400 in the facts", {**event_body(), "facts": {**reminder_facts(), "big": Raw("1e400")}}, "facts"),
    ("-1e400 deep in the facts", {**event_body(), "facts": {**reminder_facts(), "l": [{"x": Raw("-1e400")}]}},
     "facts"),
    ("NUL in a key of the facts", {**event_body(), "facts": {**reminder_facts(), "k\u0000": 1}}, "facts"),
    ("a surrogate in the facts", {**event_body(), "facts": {**reminder_facts(), "s": "\ud800"}}, "facts"),
    ("an external key of 201 characters", {**event_body(), "external_key": "k" * 201}, "external_key"),
]
# Values at the edge that PostgreSQL stores: accepted.
STORABLE: list[dict[str, Any]] = [
    {**event_body(user_id="edge-east"), "trigger_at": "2026-12-01T00:00:00+15:59"},
    {**event_body(user_id="edge-west"), "trigger_at": "2026-12-01T00:00:00-15:59",
     "expires_at": "2026-12-01T18:00:00-15:59"},
    {**event_body(user_id="edge-numbers"), "facts": {**reminder_facts(), "tiny": Raw("1e-400"), "small": Raw("5e-324"),
                                                     "large": Raw("1.7976931348623157e308"), "long": Raw("9" * 4000)}},
]


@pytest.mark.clause("BATCH-8")
@pytest.mark.clause("DEC-BATCH")
def test_a_value_the_database_refuses_is_that_items_422_naming_the_field_and_the_valid_items_are_stored(
    client: TestClient, engine: Engine
) -> None:
    """BATCH-8: an offset of 16 hours or more (in ``trigger_at`` or ``expires_at``), a number
    like 1e400, NUL, a surrogate, text too long for its column: each item is refused on its
    own naming the field, with the very body a single POST of it gets (the single POST names
    ``facts`` for 1e400, not ``body``); the valid items, edge values included, are stored."""
    items = [event_body(user_id="first"), *(item for _, item, _ in UNSTORABLE), *STORABLE]
    answer = send(client, BATCH, "[" + ",".join(dumps(item) for item in items) + "]")
    assert answer.status_code == 200, answer.text
    results = answer.json()
    assert [r["status"] for r in results] == [201] + [422] * len(UNSTORABLE) + [201] * len(STORABLE)
    for (label, item, field), result in zip(UNSTORABLE, results[1:], strict=False):
        assert fields_named(result["error"]) == {field}, (label, result["error"])
        single = send(client, SINGLE, dumps(item))
        assert single.status_code == 422 and single.json() == result["error"], label
    stored = {r["user_id"] for r in rows(engine, "SELECT user_id FROM scheduled_events")}
    assert stored == {"first", "edge-east", "edge-west", "edge-numbers"}


@pytest.mark.clause("DEC-TRIGGER")
def test_an_offset_of_sixteen_hours_is_refused_by_the_api_naming_the_field_and_by_the_core_stores(
    client: TestClient, engine: Engine
) -> None:
    """DEC-TRIGGER: ``+16:00`` and ``-16:00`` (which PostgreSQL's text input refuses) are a 422
    naming ``trigger_at`` for a single POST, which stored them before, and a
    ``TriggerOutOfRange`` for ``store_event`` and ``store_events``; ``±15:59`` is stored."""
    east = datetime(2026, 12, 1, tzinfo=timezone(timedelta(hours=16)))
    for spelled in ("2026-12-01T00:00:00+16:00", "2026-12-01T00:00:00-1600"):
        answer = send(client, SINGLE, dumps({**event_body(), "trigger_at": spelled}))
        assert answer.status_code == 422 and fields_named(answer.json()) == {"trigger_at"}, answer.text
        assert "\u00b115:59" in answer.json()["errors"][0]["message"]
    sessions = Database(engine)
    with pytest.raises(TriggerOutOfRange, match="offset"):
        store_event(sessions, event_type="t", user_id="u", community_id=None, external_key=None, trigger_at=east,
                    facts=reminder_facts(), now=T0)
    with pytest.raises(TriggerOutOfRange, match="offset"):
        store_events(sessions, [NewEvent(event_type="t", user_id="u", community_id=None, external_key=None,
                                         trigger_at=east, facts=reminder_facts())], now=T0)
    assert rows(engine, "SELECT id FROM scheduled_events") == []
    edge = datetime(2026, 12, 1, tzinfo=timezone(timedelta(hours=15, minutes=59)))
    [stored] = store_events(sessions, [NewEvent(event_type="t", user_id="u", community_id=None, external_key=None,
                                                trigger_at=edge, facts=reminder_facts())], now=T0)
    assert datetime.fromisoformat(stored.row["trigger_at"]) == edge


@pytest.mark.clause("BATCH-8")
def test_import_refuses_each_line_the_database_would_refuse_by_number_and_stores_the_rest(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """BATCH-8: the same items as lines of ``events import``, all in one chunk: each refused
    line is named with the field (never a database error for the whole chunk), the valid
    lines are stored, exit 1."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    lines = [dumps(event_body(user_id="first")), *(dumps(item) for _, item, _ in UNSTORABLE),
             *(dumps(item) for item in STORABLE)]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code = main(["events", "import", str(path)])
    out = capsys.readouterr()
    assert code == 1, out
    report = out.out.splitlines()
    assert report[0] == f"stored {1 + len(STORABLE)}, rewritten 0, refused {len(UNSTORABLE)}"
    for (label, _, field), line, number in zip(UNSTORABLE, report[1:], range(2, 2 + len(UNSTORABLE)), strict=True):
        assert line.startswith(f"line {number}: ") and field in line, (label, line)
    assert "database error" not in out.err
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 1 + len(STORABLE)


# -- the property: no item can make the batch's statement fail ----------------------------

NASTY_CHARACTERS = ["\u0000", "\ud800", "\udfff", "\ud83d", "é", "漢", "🎉", "\u202e", "\x1b", "\ufeff", " "]
TEXT = st.one_of(
    st.sampled_from(["x", "reminder", "é"]),
    st.lists(st.sampled_from(NASTY_CHARACTERS), min_size=1, max_size=6).map("".join),
    st.text(st.characters(exclude_categories=()), min_size=1, max_size=12),  # surrogates too
    st.integers(195, 205).map(lambda n: "é" * n),  # around the columns' 200 characters
)
NUMBER = st.one_of(
    st.sampled_from(["1e400", "-1e400", "1E+309", "1e-400", "-0", "5e-324", "1.7976931348623157e308",
                     "123456789012345678901234567890e-50", "9" * 4000]).map(Raw),
    st.integers(-(10**40), 10**40),
    st.floats(allow_nan=False, allow_infinity=False),
)
VALUE = st.recursive(st.one_of(NUMBER, TEXT, st.none(), st.booleans()),
                     lambda children: st.one_of(st.lists(children, max_size=3),
                                                st.dictionaries(TEXT, children, max_size=3)),
                     max_leaves=6)
OFFSET = st.sampled_from(["+16:00", "-16:00", "+23:59", "-1600", "+15:59", "-15:59", "+05:30", "Z", "+24:00",
                          "+09:60"])
INSTANT = st.builds("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}{}{}".format,
                    st.sampled_from([2027, 2000, 9998, 1, 1999, 9999]), st.integers(1, 12), st.integers(1, 28),
                    st.integers(0, 23), st.integers(0, 59), st.integers(0, 59),
                    st.sampled_from(["", ".5", ".123456", ".123456789"]), OFFSET)
HOSTILE = {
    "event_type": TEXT, "user_id": TEXT, "community_id": st.one_of(st.none(), TEXT),
    "external_key": st.one_of(st.none(), TEXT), "trigger_at": INSTANT, "expires_at": st.one_of(INSTANT, st.none()),
    "facts": st.dictionaries(TEXT, VALUE, min_size=1, max_size=3).map(lambda extra: {**reminder_facts(), **extra}),
}


@st.composite
def hostile_items(draw: st.DrawFn) -> dict[str, Any]:
    """A scheduled event with one or two of its values replaced by hostile ones (the others
    valid, so that the hostile value is what the checks and the store meet)."""
    item: dict[str, Any] = event_body()
    for name in draw(st.lists(st.sampled_from(sorted(HOSTILE)), min_size=1, max_size=2, unique=True)):
        item[name] = draw(HOSTILE[name])
    return item


@pytest.mark.clause("BATCH-8")
@settings(max_examples=int(os.environ.get("SCHEDULER_FUZZ_EXAMPLES", "25")) * 2, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(hostile=st.lists(hostile_items(), min_size=1, max_size=4))
def test_no_item_can_make_the_batchs_statement_fail_every_item_gets_its_own_answer_and_the_valid_ones_are_stored(
    client: TestClient, engine: Engine, settings: Settings, clock: ManualClock, hostile: list[dict[str, Any]]
) -> None:
    """BATCH-8: a batch of hostile items between two valid ones answers 200 with one result
    per item; each hostile item gets what a single POST of it gets (201, or the same 422,
    never the safety net's "a value cannot be stored"); every 201 is a stored row; and the
    same items imported as lines are refused by line exactly where, and as, the batch refused them."""
    items = [event_body(user_id="before"), *hostile, event_body(user_id="after")]
    answer = send(client, BATCH, "[" + ",".join(dumps(item) for item in items) + "]")
    assert answer.status_code == 200, answer.text
    results = answer.json()
    assert [r["index"] for r in results] == list(range(len(items)))
    assert results[0]["status"] == results[-1]["status"] == 201
    assert SAFETY_NET not in answer.text
    ids = [r["event"]["id"] for r in results if r["status"] == 201]
    stored = {r["id"] for r in rows(engine, "SELECT id FROM scheduled_events WHERE id = ANY(:ids)", ids=ids)}
    assert stored == set(ids)
    for item, result in zip(hostile, results[1:-1], strict=True):
        if result["status"] == 422 and "repeats the external_key" in json.dumps(result["error"]):
            continue  # a key given twice in one request: the single POST has no earlier item
        single = send(client, SINGLE, dumps(item))
        assert single.status_code == result["status"], (item, single.text, result)
        if single.status_code == 422:
            assert single.json() == result["error"]
    lines = [(number, dumps(item).encode("utf-8")) for number, item in enumerate(items, start=1)]
    summary = import_lines(lines, settings, database=Database(engine), clock=clock, actor="property")
    assert summary.stopped_at is None, summary.error
    refused = [(number, result) for number, result in enumerate(results, start=1) if result["status"] == 422]
    assert [number for number, _ in summary.refused] == [number for number, _ in refused]
    for (_, why), (_, result) in zip(summary.refused, refused, strict=True):
        if "repeats the external_key" not in why:  # which names a line, where the batch names an item
            assert why == said(result["error"]["detail"])


def said(detail: Any) -> str:
    """A refusal's ``detail`` as the import's summary prints it."""
    return detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
