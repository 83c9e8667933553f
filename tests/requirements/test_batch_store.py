"""BATCH-1 to BATCH-7: many scheduled events in one request (``POST /admin/scheduled-events/bulk``).

Each item is judged as a single POST's body (REQ-0063), the valid ones are stored together
in one transaction of a fixed number of statements, keys follow REQ-0064, a key repeated in
one request is refused naming its first item, and concurrent batches over the same keys do
not deadlock. ``scheduler events import`` runs the same checks and the same store.
"""

from __future__ import annotations

import io
import json
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from starlette.testclient import TestClient

from scheduler.cli import main
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.core.store_batch import NewEvent, store_events
from scheduler.database.database import Database
from scheduler.service import SchedulerService
from tests.conftest import INGEST, PARTICIPANT, T0, TEST_SECRET, bearer
from tests.helpers import (
    event_body,
    post_event,
    reminder_facts,
    rows,
    wait_until_blocked_on_a_lock,
)

BATCH = "/admin/scheduled-events/bulk"
SINGLE = "/admin/scheduled-events"

# Items a single POST refuses, each for another reason.
REFUSED: list[Any] = [
    {**event_body(), "facts": None},                                  # REQ-0063's "Missing facts"
    {**event_body(), "facts": {"scenario": "x"}},                     # the facts contract
    {**event_body(), "trigger_at": "1970-01-01T00:00:00Z"},           # outside the storable range
    {**event_body(), "trigger_at": 1764489600},                       # a number, not an instant
    {**event_body(), "surprise": 1},                                  # an unknown field
    "not an object",
    [event_body()],
    None,
]


def batch(client: TestClient, items: Any, headers: Any = INGEST) -> Any:
    return client.post(BATCH, headers=headers, json=items)


@pytest.mark.clause("BATCH-2")
@pytest.mark.clause("DEC-BATCH")
def test_each_item_answers_in_order_with_its_row_or_the_422_a_single_post_of_it_gets(
    client: TestClient, engine: Engine
) -> None:
    """BATCH-2: a mixed batch answers 200 with one result per item, by index: 201 with the
    stored row for the valid ones, and for each refused one the very body a single POST of
    that item is answered with; only the valid items are stored."""
    items = [event_body(user_id="first"), *REFUSED, event_body(user_id="last", external_key="k-last")]
    answer = batch(client, items)
    assert answer.status_code == 200, answer.text
    results = answer.json()
    assert [r["index"] for r in results] == list(range(len(items)))
    assert [r["status"] for r in results] == [201] + [422] * len(REFUSED) + [201]
    for item, result in zip(REFUSED, results[1:-1], strict=True):
        single = client.post(SINGLE, headers={**INGEST, "content-type": "application/json"}, content=json.dumps(item))
        assert single.status_code == 422
        assert result["error"] == single.json(), item
    assert results[0]["event"]["user_id"] == "first" and results[0]["rewritten"] is False
    assert results[-1]["event"]["external_key"] == "k-last"
    stored = rows(engine, "SELECT id, user_id, status FROM scheduled_events ORDER BY user_id")
    assert [(r["user_id"], r["status"]) for r in stored] == [("first", "pending"), ("last", "pending")]
    assert {r["id"] for r in stored} == {results[0]["event"]["id"], results[-1]["event"]["id"]}


@pytest.mark.clause("BATCH-1")
def test_an_empty_array_stores_nothing_and_a_non_array_is_a_422_naming_the_body(client: TestClient) -> None:
    """BATCH-1: ``[]`` answers an empty list; an object, a string or a number is a 422 naming ``body``."""
    assert batch(client, []).json() == []
    bodies: list[Any] = [event_body(), "x", 3, {"items": []}]
    for body in bodies:
        answer = batch(client, body)
        assert answer.status_code == 422, body
        assert answer.json()["errors"] == [{"field": "body", "message": "must be a JSON array of scheduled events"}]


@pytest.mark.clause("BATCH-1")
def test_more_events_than_the_bound_is_a_413_and_stores_nothing(
    engine: Engine, clock: ManualClock
) -> None:
    """BATCH-1: SCHEDULER_BULK_MAX_EVENTS items are accepted, one more is a 413; a body past
    SCHEDULER_BULK_MAX_BODY_BYTES is a 413 before it is parsed."""
    settings = Settings(jwt_secret=TEST_SECRET, bulk_max_events=3, bulk_max_body_bytes=4096)
    service = SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)
    with TestClient(service.app) as client:
        assert batch(client, [event_body(user_id=f"u{i}") for i in range(3)]).status_code == 200
        too_many = batch(client, [event_body(user_id=f"v{i}") for i in range(4)])
        assert too_many.status_code == 413 and "SCHEDULER_BULK_MAX_EVENTS" in too_many.json()["detail"]
        too_large = batch(client, [event_body(facts=reminder_facts(padding="x" * 5000))])
        assert too_large.status_code == 413
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 3


@pytest.mark.clause("BATCH-2")
def test_an_item_larger_than_the_single_posts_bound_is_a_422_for_that_item_only(client: TestClient) -> None:
    """BATCH-2: an item past SCHEDULER_MAX_BODY_BYTES (64 KiB) is refused on its own; its neighbours are stored."""
    huge = event_body(facts=reminder_facts(padding="x" * 70_000))
    results = batch(client, [event_body(user_id="a"), huge, event_body(user_id="b")]).json()
    assert [r["status"] for r in results] == [201, 422, 201]
    assert results[1]["error"]["errors"][0]["field"] == "body"
    assert "SCHEDULER_MAX_BODY_BYTES" in results[1]["error"]["detail"]


@pytest.mark.clause("BATCH-5")
@pytest.mark.clause("DEC-BATCH")
def test_a_key_repeated_in_one_request_is_a_422_for_the_later_items_naming_the_first(
    client: TestClient, engine: Engine
) -> None:
    """BATCH-5: the first item of a key is stored; each later one is a 422 naming external_key and the first index."""
    items = [event_body(external_key="k", user_id="one"), event_body(external_key="other"),
             event_body(external_key="k", user_id="two"), event_body(external_key="k", user_id="three")]
    results = batch(client, items).json()
    assert [r["status"] for r in results] == [201, 201, 422, 422]
    for result in results[2:]:
        assert result["error"]["errors"] == [
            {"field": "external_key", "message": "repeats the external_key of item 0; a key appears once per request"}]
    assert rows(engine, "SELECT user_id FROM scheduled_events WHERE external_key = 'k'") == [{"user_id": "one"}]


@pytest.mark.clause("BATCH-3")
def test_a_known_key_in_a_batch_rewrites_and_resets_its_row_as_a_single_post_does(
    client: TestClient, engine: Engine
) -> None:
    """BATCH-3: a key already stored (here dispatched) keeps its id, is rewritten and reset to
    pending without dispatched_at or last_error, answers ``rewritten: true``, and its history
    says ``rewritten`` with the caller's subject, as a single POST's rewrite does."""
    first = post_event(client, external_key="k-known")
    with engine.begin() as conn:
        conn.execute(text("UPDATE scheduled_events SET status = 'failed', last_error = 'boom' WHERE id = :id"),
                     {"id": first["id"]})
    results = batch(client, [event_body(external_key="k-known", user_id="moved", trigger_at=T0 + timedelta(days=1)),
                             event_body(external_key="k-new")]).json()
    assert [(r["status"], r["rewritten"]) for r in results] == [(201, True), (201, False)]
    rewritten = results[0]["event"]
    assert rewritten["id"] == first["id"]
    assert (rewritten["status"], rewritten["last_error"], rewritten["dispatched_at"], rewritten["user_id"]) == (
        "pending", None, None, "moved")
    history = rows(engine, "SELECT change, actor FROM scheduled_event_history WHERE event_id = :id ORDER BY id",
                   id=first["id"])
    assert history[-1]["change"] == "rewritten" and history[-1]["actor"]
    assert rows(engine, "SELECT change FROM scheduled_event_history WHERE event_id = :id",
                id=results[1]["event"]["id"]) == [{"change": "stored"}]


class StatementCount:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.kinds[" ".join(line.split("--", 1)[0] for line in statement.splitlines()).split()[0].upper()] += 1


@pytest.fixture
def statements(engine: Engine) -> Iterator[StatementCount]:
    counted = StatementCount()
    event.listen(engine, "before_cursor_execute", counted)
    yield counted
    event.remove(engine, "before_cursor_execute", counted)


@pytest.mark.clause("BATCH-3")
def test_a_batch_of_three_hundred_sends_the_statements_of_a_batch_of_three(
    client: TestClient, engine: Engine, statements: StatementCount
) -> None:
    """BATCH-3: set-based, in one transaction: the statements a batch sends do not grow with it."""
    batch(client, [event_body(user_id=f"s{i}", external_key=f"s{i}") for i in range(3)])
    small = Counter(statements.kinds)
    statements.kinds.clear()
    answer = batch(client, [event_body(user_id=f"l{i}", external_key=f"l{i}" if i % 2 else None) for i in range(300)])
    assert all(r["status"] == 201 for r in answer.json())
    assert statements.kinds == small
    assert small["INSERT"] == 1
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 303


@pytest.mark.clause("BATCH-4")
@pytest.mark.clause("DEC-BATCH")
def test_two_batches_over_the_same_keys_in_opposite_orders_both_finish_without_a_deadlock(engine: Engine) -> None:
    """BATCH-4: both batches are held behind one locked row, then let go at once: each takes
    the keys in key order, so neither waits for the other in a cycle (PostgreSQL would end one
    with a deadlock error); both finish within the deadline, every row rewritten."""
    sessions = Database(engine)
    keys = [f"key-{i:03d}" for i in range(60)]

    def events(order: list[str], who: str) -> list[NewEvent]:
        return [NewEvent("commitment_reminder", who, None, key, T0, reminder_facts()) for key in order]

    store_events(sessions, events(keys, "seed"), now=T0)
    errors: list[BaseException] = []

    def run(order: list[str], who: str) -> None:
        try:
            store_events(sessions, events(order, who), now=T0)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    for _ in range(3):  # each round a fresh race; with keys out of order most rounds deadlock
        with engine.connect() as holder:
            holder.execute(text("SELECT id FROM scheduled_events WHERE external_key = :k FOR UPDATE"), {"k": keys[0]})
            threads = [threading.Thread(target=run, args=(keys, "forward"), daemon=True),
                       threading.Thread(target=run, args=(keys[::-1], "backward"), daemon=True)]
            for count, thread in enumerate(threads, start=1):
                thread.start()
                wait_until_blocked_on_a_lock(engine, count=count)  # forward first in the queue, then backward
            holder.rollback()
        for thread in threads:
            thread.join(30)  # the deadline: a batch stuck behind the other fails here
            assert not thread.is_alive(), "a batch did not finish within the deadline"
    assert errors == []
    users = {r["user_id"] for r in rows(engine, "SELECT user_id FROM scheduled_events")}
    assert len(users) == 1 and users <= {"forward", "backward"}


@pytest.mark.clause("BATCH-6")
def test_the_batch_route_needs_the_ingest_permission(client: TestClient, engine: Engine) -> None:
    """BATCH-6: no token is a 401, a participant's token a 403, an ingest token gets in; nothing stored before."""
    assert batch(client, [event_body()], headers={}).status_code == 401
    assert batch(client, [event_body()], headers=PARTICIPANT).status_code == 403
    assert rows(engine, "SELECT id FROM scheduled_events") == []
    assert batch(client, [event_body()], headers=bearer("nudging.ingest")).status_code == 200


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.clause("BATCH-7")
def test_import_stores_rewrites_and_refuses_by_line_in_chunks_of_the_batch_bound(
    client: TestClient, engine: Engine, database_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """BATCH-7: ``events import FILE`` judges each line as a batch item (a line that is not
    JSON, a bad contract, a key repeated on a later line: refused with its line number),
    rewrites a known key, stores the rest, chunk by chunk, says so and exits 1."""
    post_event(client, external_key="known")
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_BULK_MAX_EVENTS", "2")
    lines = [json.dumps(event_body(user_id="a", external_key="known")),   # 1: rewritten
             json.dumps(event_body(user_id="b")),                         # 2: stored
             "{not json",                                                 # 3: refused
             "",                                                          # 4: blank, skipped
             json.dumps(event_body(user_id="c", external_key="fresh")),   # 5: stored
             json.dumps({**event_body(), "facts": {"scenario": "x"}}),    # 6: refused
             json.dumps(event_body(user_id="d", external_key="fresh"))]   # 7: refused, names line 5
    code = main(["events", "import", str(_jsonl(tmp_path / "events.jsonl", lines)), "--actor", "importer"])
    out = capsys.readouterr()
    assert code == 1, out
    report = out.out.splitlines()
    assert report[0] == "stored 2, rewritten 1, refused 3"
    assert [line.split(":")[0] for line in report[1:]] == ["line 3", "line 6", "line 7"]
    assert "not valid JSON" in report[1] and "invalid_facts_contract" in report[2] and "line 5" in report[3]
    assert out.err == ""  # no progress bar: stderr is not a terminal
    users = sorted(r["user_id"] for r in rows(engine, "SELECT user_id FROM scheduled_events"))
    assert users == ["a", "b", "c"]
    assert rows(engine, "SELECT DISTINCT actor FROM scheduled_event_history WHERE change = 'rewritten'") == [
        {"actor": "importer"}]


@pytest.mark.clause("BATCH-7")
def test_import_reads_stdin_and_exits_0_when_every_line_is_stored(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """BATCH-7: ``-`` reads stdin; every line stored is exit 0; an unreadable file is exit 2."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(json.dumps(event_body(user_id=f"p{i}")) for i in range(5))))
    assert main(["events", "import", "-"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "stored 5, rewritten 0, refused 0"
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 5
    assert main(["events", "import", "/nonexistent/events.jsonl"]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.clause("BATCH-7")
def test_import_draws_a_progress_bar_on_stderr_only_when_it_is_a_terminal() -> None:
    """BATCH-7: the bar is drawn on a terminal and never on a pipe or a file."""
    from scheduler.cli.events_import import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown, piped = Terminal(), io.StringIO()
    for stream in (shown, piped):
        bar = Progress(4, stream)
        bar.update(2)
        bar.update(4)
        bar.close()
    assert "2/4 lines" in shown.getvalue() and shown.getvalue().endswith("4/4 lines\n")
    assert piped.getvalue() == ""


@pytest.mark.clause("BATCH-7")
def test_import_stopped_by_the_database_exits_2_naming_the_first_line_not_stored(
    client: TestClient, engine: Engine, database_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """BATCH-7: a chunk the database refuses (here a lock timeout on a row another
    transaction holds) rolls back alone: the chunks before it stay stored, and the command
    exits 2 naming the first line not stored."""
    post_event(client, external_key="held")
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SCHEDULER_BULK_MAX_EVENTS", "2")
    monkeypatch.setenv("SCHEDULER_LOCK_TIMEOUT_MS", "200")
    lines = [json.dumps(event_body(user_id=f"early-{i}")) for i in range(2)] + [
        json.dumps(event_body(user_id="late", external_key="held")), json.dumps(event_body(user_id="later"))]
    path = _jsonl(tmp_path / "events.jsonl", lines)
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM scheduled_events WHERE external_key = 'held' FOR UPDATE"))
        code = main(["events", "import", str(path)])
        holder.rollback()
    out = capsys.readouterr()
    assert code == 2, out
    assert out.out.splitlines()[0] == "stored 2, rewritten 0, refused 0"
    assert "database error" in out.err and "from line 3 on" in out.err
    users = sorted(r["user_id"] for r in rows(engine, "SELECT user_id FROM scheduled_events"))
    assert users == ["early-0", "early-1", "participant-1"]


@pytest.mark.clause("EXP-10")
def test_a_batch_keeps_each_items_expiry_as_a_single_post_does_and_refuses_a_bad_one_for_that_item(
    client: TestClient, engine: Engine, settings: Settings, clock: ManualClock
) -> None:
    """EXP-10: a batch item's ``expires_at`` is stored with its row and a rewrite by key takes
    the new one, as a single POST's; one not after its ``trigger_at`` is that item's 422 (the
    single POST's body), the rest stored; with a default window, items without an expiry get
    ``trigger_at`` plus it."""
    later = (T0 + timedelta(hours=1)).isoformat()
    answer = batch(client, [{**event_body(external_key="k1"), "expires_at": later},
                            {**event_body(external_key="k2"), "expires_at": T0.isoformat()},
                            event_body(external_key="k3")])
    assert answer.status_code == 200, answer.text
    results = answer.json()
    assert [r["status"] for r in results] == [201, 422, 201]
    single = client.post(SINGLE, headers=INGEST, json={**event_body(external_key="k2"), "expires_at": T0.isoformat()})
    assert results[1]["error"] == single.json()
    stored = {r["external_key"]: r["expires_at"] for r in rows(engine, "SELECT external_key, expires_at FROM "
                                                                        "scheduler.scheduled_events")}
    assert stored == {"k1": T0 + timedelta(hours=1), "k3": None}
    assert batch(client, [event_body(external_key="k1")]).json()[0]["event"]["expires_at"] is None
    windowed = SchedulerService(settings.with_(default_expiry_seconds=5400.0), engine=engine, clock=clock,
                                run_scheduler=False)
    with TestClient(windowed.app) as other:
        [item] = batch(other, [event_body(external_key="k4")]).json()
    assert datetime.fromisoformat(item["event"]["expires_at"]) == T0 + timedelta(minutes=90)
