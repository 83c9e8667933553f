"""INBOX — the participant's live inbox, from any replica.

In our words: ``GET /me/notifications`` gives a participant their own delivered
notifications, newest first, page by page (an admin token may name another participant);
``GET /me/notifications/stream`` streams them as server-sent events as they are delivered,
by whichever replica delivered them (LISTEN/NOTIFY, payload the stream number, the rest read
from the table). A reconnect with ``Last-Event-ID`` replays exactly what was missed. A slow
or vanished client never holds up the loop or other clients: queues are bounded, a client
that falls behind is dropped (its reconnect replays), a vanished one is cleaned up.
Heartbeats keep an idle stream open through proxies.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import make_url
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.database.database import Database
from scheduler.database.engine import make_engine
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.web.inbox.hub import CHANNEL, STREAM_LOCK_KEY, Inbox, StreamPublisher, sse_stream
from tests.conftest import ADMIN, INGEST, PARTICIPANT, bearer
from tests.helpers import event_body, post_event, reminder_facts, rows, wait_until_blocked_on_a_lock
from tests.servers import READ_DEADLINE, EventStream, serve, wait_for

ME = "/me/notifications"


def deliver(client: TestClient, service: SchedulerService, user_id: str = "participant-1", n: int = 1) -> None:
    """Deliver ``n`` reminders to ``user_id``, one a day (so that neither deduplication nor the
    daily cap suppresses any): the clock moves a day before each."""
    clock = service.clock
    assert isinstance(clock, ManualClock)
    for _ in range(n):
        clock.advance(timedelta(days=1))
        post_event(client, user_id=user_id, trigger_at=clock.now(),
                   facts=reminder_facts(clock.now().date().isoformat()))
        service.scheduler.poll_once()


def open_stream(base: str, headers: Mapping[str, str], client: httpx.Client) -> EventStream:
    """A participant's live stream on ``base``; every read has its own deadline (tests/servers.py)."""
    return EventStream(f"{base}{ME}/stream", headers, client)


@pytest.fixture
def replica_b(database_url: str, settings: Settings, clock: ManualClock) -> Iterator[SchedulerService]:
    """A second API replica (its own engine and LISTEN connection), no loop of its own."""
    engine_b = make_engine(database_url, Settings(lock_timeout_ms=0, statement_timeout_ms=60_000))
    service = SchedulerService(settings, engine=engine_b, clock=clock, publisher=RecordingPublisher(),
                               run_scheduler=False)
    yield service
    engine_b.dispose()


@pytest.mark.clause("INBOX-1")
def test_a_participant_reads_only_their_own_notifications_newest_first_page_by_page(
    client: TestClient, service: SchedulerService, clock: ManualClock
) -> None:
    """INBOX-1: own rows only, newest first, ?before= the previous page's next; a suppressed
    one (the fourth of the day is over the daily cap of 3) is not shown."""
    for i in range(4):
        clock.advance(timedelta(minutes=1))
        post_event(client, trigger_at=clock.now(), facts=reminder_facts(f"2026-12-1{i}"))
        service.scheduler.poll_once()
    deliver(client, service, user_id="participant-2")
    assert len(rows(service.engine, "SELECT id FROM notifications WHERE status = 'suppressed'")) == 1
    first = client.get(f"{ME}?limit=2", headers=PARTICIPANT)
    assert first.status_code == 200, first.text
    page = first.json()
    assert [n["user_id"] for n in page["items"]] == ["participant-1"] * 2
    second = client.get(ME, params={"limit": 2, "before": page["next"]}, headers=PARTICIPANT).json()
    seen = page["items"] + second["items"]
    assert len(seen) == 3 and len({n["id"] for n in seen}) == 3
    assert [n["created_at"] for n in seen] == sorted((n["created_at"] for n in seen), reverse=True)
    assert second["next"] is None
    assert all(n["stream_seq"] is not None for n in seen)


@pytest.mark.clause("INBOX-1")
def test_only_an_admin_may_read_another_participants_inbox(client: TestClient, service: SchedulerService) -> None:
    """INBOX-1: an admin passes user_id; a participant naming another is 403; no token is 401."""
    deliver(client, service, user_id="participant-2")
    as_admin = client.get(ME, params={"user_id": "participant-2"}, headers=ADMIN).json()
    assert [n["user_id"] for n in as_admin["items"]] == ["participant-2"]
    assert client.get(ME, params={"user_id": "participant-2"}, headers=PARTICIPANT).status_code == 403
    assert client.get(ME, params={"user_id": "participant-1"}, headers=PARTICIPANT).status_code == 200
    assert client.get(ME).status_code == 401
    assert client.get(f"{ME}/stream").status_code == 401
    assert client.get(f"{ME}/stream", params={"user_id": "participant-2"}, headers=PARTICIPANT).status_code == 403
    assert client.get(f"{ME}/stream", headers={**PARTICIPANT, "Last-Event-ID": "x"}).status_code == 422
    assert client.get(ME, params={"before": "nonsense"}, headers=PARTICIPANT).status_code == 422


@pytest.mark.clause("INBOX-2")
def test_a_notification_delivered_by_replica_a_reaches_a_stream_on_replica_b(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService, clock: ManualClock
) -> None:
    """INBOX-2: replica A stores and dispatches; the stream open on replica B receives it, and
    B's hub was woken by NOTIFY (LISTEN available on this server), not by its timer."""
    with serve(replica_b) as base_b, httpx.Client() as http:
        stream = open_stream(base_b, PARTICIPANT, http)
        try:
            stream.until_connected()
            deliver(client, service)  # replica A: the test's own service, stepped by hand
            seq, note = stream.next_event()
            assert note["title"] == "Reminder: run the dishwasher at noon"
            assert note["user_id"] == "participant-1" and note["stream_seq"] == seq
        finally:
            stream.close()
        listening = replica_b.inbox.listening
    if getattr(replica_b, "listener", None) is not None:
        assert listening and replica_b.inbox.stats.notifies >= 1


@pytest.mark.clause("INBOX-3")
@pytest.mark.clause("DEC-LIFE-3")
def test_a_reconnect_with_last_event_id_replays_exactly_what_was_missed(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService
) -> None:
    """INBOX-3, DEC-LIFE-3: one event seen, then a disconnect; three delivered meanwhile; the reconnect
    with Last-Event-ID gets exactly those three, in order, then live ones."""
    with serve(replica_b) as base_b, httpx.Client() as http:
        stream = open_stream(base_b, PARTICIPANT, http)
        stream.until_connected()
        deliver(client, service)
        seen, _ = stream.next_event()
        stream.close()
        deliver(client, service, n=3)
        missed = [r["stream_seq"] for r in rows(service.engine, "SELECT stream_seq FROM notifications "
                                                "WHERE stream_seq > :s ORDER BY stream_seq", s=seen)]
        assert len(missed) == 3
        again = open_stream(base_b, {**PARTICIPANT, "Last-Event-ID": str(seen)}, http)
        try:
            assert [again.next_event()[0] for _ in range(3)] == missed
            deliver(client, service)
            assert again.next_event()[0] > missed[-1]
        finally:
            again.close()


@pytest.mark.clause("INBOX-4")
def test_a_slow_client_is_dropped_without_holding_up_the_hub_or_a_fast_client(
    client: TestClient, service: SchedulerService
) -> None:
    """INBOX-4: queues of 2; a client that stops reading is dropped at the third row without
    the hub waiting; a client that reads gets all five; the dropped stream ends (it does not
    wait forever) once it has sent what it holds, each row once and in order."""
    deliver(client, service, n=5)
    inbox = Inbox(service.database, queue_size=2, read_limit=2)

    async def scenario() -> tuple[list[int], list[int], Any]:
        fast = await inbox.subscribe("participant-1")
        slow_stream = sse_stream(inbox, "participant-1", after=0)  # a client that stops reading
        assert (await slow_stream.__anext__()).startswith("retry:")
        inbox.cursor = 0
        got: list[int] = []

        async def consume() -> None:
            while len(got) < 5:
                got.append(int((await fast.queue.get())["stream_seq"]))  # bounded: wait_for(consumer)

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(inbox.pump(), timeout=20)
        await asyncio.wait_for(consumer, timeout=20)
        dropped = inbox.snapshot()

        async def drain_slow() -> list[str]:
            return [chunk async for chunk in slow_stream]

        # the dropped stream must end by itself: a stream that never ends fails here, in seconds
        slow_seen = await asyncio.wait_for(drain_slow(), timeout=READ_DEADLINE)
        return got, [int(c.split("\n")[0][4:]) for c in slow_seen if c.startswith("id:")], dropped

    got, slow_seen, snapshot = asyncio.run(scenario())
    assert got == sorted(got) and len(got) == 5
    assert slow_seen == got
    assert snapshot["dropped_clients"] == 1 and snapshot["streams"] == 1


@pytest.mark.clause("INBOX-5")
def test_a_vanished_client_is_cleaned_up_and_heartbeats_keep_an_idle_stream_alive(
    replica_b: SchedulerService,
) -> None:
    """INBOX-5: an idle stream gets heartbeat comments; when the client goes, its subscription goes."""
    replica_b.inbox.heartbeat_seconds = 0.05
    with serve(replica_b) as base_b, httpx.Client() as http:
        stream = open_stream(base_b, PARTICIPANT, http)
        stream.until_connected()
        assert stream.next_block() == [": heartbeat"]
        assert replica_b.inbox.snapshot()["streams"] == 1
        stream.close()
        wait_for(lambda: replica_b.inbox.snapshot()["streams"] == 0, what="the stream to be cleaned up")
        assert replica_b.inbox.stats.streams_closed == 1


@pytest.mark.clause("INBOX-6")
def test_the_inbox_page_is_served_and_holds_no_data(client: TestClient) -> None:
    """INBOX-6: /inbox is an HTML page without a token; it reads with the token it is given."""
    response = client.get("/inbox")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert "me/notifications/stream" in response.text and "Last-Event-ID" in response.text


@pytest.mark.clause("INBOX-2")
def test_a_live_event_reaches_the_stream_too(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService
) -> None:
    """INBOX-2: the live path publishes the same way (REQ-0066: one path)."""
    with serve(replica_b) as base_b, httpx.Client() as http:
        stream = open_stream(base_b, bearer(None, subject="participant-7"), http)
        try:
            stream.until_connected()
            body = event_body(user_id="participant-7")
            del body["trigger_at"]
            assert client.post("/admin/ingest-event", headers=INGEST, json=body).status_code == 200
            _, note = stream.next_event()
            assert (note["user_id"], note["source"]) == ("participant-7", "live")
        finally:
            stream.close()



@pytest.mark.clause("DEC-LIFE-3")
def test_a_stream_number_waits_for_the_transaction_numbering_before_it_to_commit(
    client: TestClient, service: SchedulerService
) -> None:
    """DEC-LIFE-3: while one publisher's numbering transaction is open, another waits on the
    stream lock, and then takes a higher number: numbers become visible in commit order."""
    service.scheduler.publisher = None  # number by hand below
    deliver(client, service, n=2)
    first_id, second_id = (r["id"] for r in rows(service.engine, "SELECT id FROM notifications ORDER BY created_at"))
    publisher = StreamPublisher(service.database)
    held = service.sessions()
    held.execute(service.database.statements["lock_stream_order"], {"key": STREAM_LOCK_KEY})
    first = held.execute(service.database.statements["number_for_stream"],
                         {"ids": [first_id], "channel": CHANNEL}).scalar_one()
    got: list[list[int]] = []
    thread = threading.Thread(target=lambda: got.append(publisher.number([second_id])))
    thread.start()
    try:
        wait_until_blocked_on_a_lock(service.engine)
        assert got == []
    finally:
        held.commit()
        held.close()
        thread.join(timeout=30)
    assert got == [[first + 1]]


@pytest.mark.clause("INBOX-8")
def test_a_failing_stream_numbering_loses_neither_the_push_nor_the_record(
    client: TestClient, service: SchedulerService, publisher: RecordingPublisher, database_url: str
) -> None:
    """INBOX-8: numbering fails (the database is unreachable after the batch committed): it is
    logged, the configured publisher still gets the message, the notification stays readable."""
    gone = make_url(database_url).set(database="no_such_database").render_as_string(hide_password=False)
    unreachable = Database(make_engine(gone))
    service.scheduler.publisher = StreamPublisher(unreachable, publisher)
    deliver(client, service)
    assert [m.user_id for m in publisher.messages] == ["participant-1"]
    page = client.get(ME, headers=PARTICIPANT).json()
    assert [n["stream_seq"] for n in page["items"]] == [None]


@pytest.mark.clause("INBOX-2")
def test_without_listen_the_hub_reads_on_its_timer_and_nothing_is_missed(
    client: TestClient, service: SchedulerService, database_url: str, settings: Settings, clock: ManualClock
) -> None:
    """INBOX-2: SCHEDULER_LISTEN=false (as behind a transaction-pooling PgBouncer): no LISTEN
    connection, the hub reads the table on its short timer, and the stream still gets it."""
    engine_c = make_engine(database_url, Settings(lock_timeout_ms=0, statement_timeout_ms=60_000))
    replica_c = SchedulerService(settings.with_(listen=False), engine=engine_c, clock=clock, run_scheduler=False)
    try:
        with serve(replica_c) as base_c, httpx.Client() as http:
            stream = open_stream(base_c, PARTICIPANT, http)
            try:
                stream.until_connected()
                deliver(client, service)
                _, note = stream.next_event()
                assert note["user_id"] == "participant-1"
            finally:
                stream.close()
        assert replica_c.inbox.listener is None and not replica_c.listener.running
        assert replica_c.inbox.stats.notifies == 0 and replica_c.inbox.stats.reads >= 1
    finally:
        engine_c.dispose()


@pytest.mark.clause("INBOX-9")
def test_two_participants_streams_on_two_replicas_each_carry_only_their_own_notifications_in_order(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService
) -> None:
    """INBOX-9: participant-1 and participant-2 each have a stream open on replica A and on
    replica B at once; notifications for both, interleaved, are delivered by both replicas'
    loops. Every stream receives exactly its participant's notifications, in stream order,
    and nothing of the other's (a hub offering every row to every stream fails at the first
    foreign event); a replay from the start carries only the participant's own rows too."""
    users = ("participant-1", "participant-2")
    headers = {u: bearer(None, subject=u) for u in users}
    with serve(service) as base_a, serve(replica_b) as base_b, httpx.Client() as http:
        streams = {(u, base): open_stream(base, headers[u], http) for u in users for base in (base_a, base_b)}
        try:
            for stream in streams.values():
                stream.until_connected()
            # interleaved: 1, 2, 1, 2, 1, 2; odd ones through replica A's loop, even ones B's
            for i in range(6):
                deliver(client, service if i % 2 == 0 else replica_b, user_id=users[i % 2])
            expected = {u: [r["stream_seq"] for r in rows(service.engine, "SELECT stream_seq FROM notifications "
                                                           "WHERE user_id = :u ORDER BY stream_seq", u=u)]
                        for u in users}
            assert all(len(seqs) == 3 for seqs in expected.values()), expected
            for (user, _), stream in streams.items():
                got = [stream.next_event() for _ in range(3)]
                assert [note["user_id"] for _, note in got] == [user] * 3, (user, got)
                assert [seq for seq, _ in got] == expected[user]
                assert [note["stream_seq"] for _, note in got] == expected[user]
            # nothing else is queued for either: the next event each stream sees is its own new one
            deliver(client, service, user_id="participant-2")
            deliver(client, replica_b, user_id="participant-1")
            for (user, _), stream in streams.items():
                seq, note = stream.next_event()
                assert note["user_id"] == user and seq > expected[user][-1]
            with open_stream(base_b, {**headers["participant-1"], "Last-Event-ID": "0"}, http) as replay:
                replayed = [replay.next_event()[1]["user_id"] for _ in range(4)]
            assert replayed == ["participant-1"] * 4
        finally:
            for stream in streams.values():
                stream.close()


def csp_of(header: str) -> dict[str, set[str]]:
    """A Content-Security-Policy header as directive -> set of sources."""
    policy: dict[str, set[str]] = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            policy[words[0].lower()] = set(words[1:])
    return policy


@pytest.mark.clause("INBOX-10")
def test_the_inbox_page_sends_a_policy_as_strict_as_the_consoles_and_may_not_be_framed(client: TestClient) -> None:
    """INBOX-10: /inbox (which holds a participant's token and shows what senders wrote) sends
    a Content-Security-Policy allowing nothing the console's does not, except the hashes of its
    own inline script and style and its own service worker (worker-src 'self', web push: PUSH-9;
    no 'unsafe-inline', no other host), frame-ancestors 'none' and
    X-Frame-Options: DENY; every inline script and style of the page is allowed by its hash, and
    the page has no inline event handler (which no hash allows)."""
    import base64
    import hashlib
    import re

    page = client.get("/inbox")
    console = client.get("/console/sign-in")
    assert page.status_code == 200 and "content-security-policy" in page.headers, dict(page.headers)
    mine, theirs = csp_of(page.headers["content-security-policy"]), csp_of(console.headers["content-security-policy"])
    assert set(theirs) <= set(mine), f"missing directives: {set(theirs) - set(mine)}"
    assert mine.pop("worker-src") == {"'self'"}  # the page's own service worker, nothing else
    for directive, sources in mine.items():
        allowed = theirs.get(directive, theirs.get("default-src", set()))
        extra = {s for s in sources if s not in allowed and not re.fullmatch(r"'sha256-[A-Za-z0-9+/]+=*'", s)}
        assert not extra, f"{directive} allows {extra}, the console does not"
    assert mine["default-src"] == {"'none'"} and mine["frame-ancestors"] == {"'none'"}
    assert mine["base-uri"] == {"'none'"} and mine["connect-src"] == {"'self'"}
    assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff"
    for tag, directive in (("script", "script-src"), ("style", "style-src")):
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page.text, flags=re.DOTALL)
        assert bodies, tag
        for body in bodies:
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in mine[directive], f"the page's own {tag} would be blocked"
    assert not re.search(r"<[^>]+\son[a-z]+\s*=", page.text, flags=re.IGNORECASE), "an inline event handler"


@pytest.mark.clause("INBOX-1")
def test_pages_of_notifications_delivered_at_one_instant_lose_and_repeat_nothing(
    client: TestClient, service: SchedulerService
) -> None:
    """INBOX-1: three notifications delivered by one poll share their created_at; pages of one
    each still give all three, once each (the cursor breaks the tie by id), then no next."""
    for day in ("2026-12-01", "2026-12-02", "2026-12-03"):  # three distinct reminders, one instant
        post_event(client, trigger_at=service.clock.now(), facts=reminder_facts(day))
    assert service.scheduler.poll_once().dispatched == 3
    seen: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 1}
    for _ in range(4):
        page = client.get(ME, params=params, headers=PARTICIPANT).json()
        seen += page["items"]
        if page["next"] is None:
            break
        params = {"limit": 1, "before": page["next"]}
    assert len({n["created_at"] for n in seen}) == 1
    assert len(seen) == 3 and len({n["id"] for n in seen}) == 3


@pytest.mark.clause("INBOX-3")
def test_a_replay_longer_than_one_read_of_the_table_misses_nothing(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INBOX-3: the replay reads the table a page at a time; with pages of two, five missed
    notifications still come back, each once and in order, and the stream then goes live."""
    import scheduler.web.inbox.hub as inbox_module

    monkeypatch.setattr(inbox_module, "REPLAY_LIMIT", 2)
    deliver(client, service, n=5)
    missed = [r["stream_seq"] for r in rows(service.engine, "SELECT stream_seq FROM notifications ORDER BY stream_seq")]
    with serve(replica_b) as base_b, httpx.Client() as http, \
            open_stream(base_b, {**PARTICIPANT, "Last-Event-ID": "0"}, http) as stream:
        assert [stream.next_event()[0] for _ in range(5)] == missed
        deliver(client, service)
        assert stream.next_event()[0] > missed[-1]


@pytest.mark.clause("INBOX-3")
def test_a_last_event_id_past_the_newest_number_still_receives_what_comes_next(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService
) -> None:
    """INBOX-3: a client remembering a number the database never gave (a restored database, a
    client of another deployment) reconnects with it: the stream starts from the newest number
    instead, so the next notification still arrives (it is not hidden as already seen)."""
    deliver(client, service)
    with serve(replica_b) as base_b, httpx.Client() as http, \
            open_stream(base_b, {**PARTICIPANT, "Last-Event-ID": str(10**15)}, http) as stream:
        stream.until_connected()
        deliver(client, service)
        seq, note = stream.next_event()
        assert note["user_id"] == "participant-1" and seq < 10**15


@pytest.mark.clause("INBOX-5")
def test_when_one_of_a_participants_streams_vanishes_the_others_keep_receiving(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService
) -> None:
    """INBOX-5: participant-1 has the page open in two tabs (two streams on one replica) and
    participant-2 one. One of participant-1's tabs goes: its subscription is cleaned up, and
    only that one: participant-1's other tab and participant-2's stream still receive what is
    delivered next (cleaning up by participant would silence the remaining tab)."""
    other = bearer(None, subject="participant-2")
    with serve(replica_b) as base_b, httpx.Client() as http:
        gone, kept, theirs = (open_stream(base_b, PARTICIPANT, http), open_stream(base_b, PARTICIPANT, http),
                              open_stream(base_b, other, http))
        try:
            for stream in (gone, kept, theirs):
                stream.until_connected()
            assert replica_b.inbox.snapshot()["streams"] == 3
            gone.close()
            wait_for(lambda: replica_b.inbox.snapshot()["streams"] == 2, what="the vanished stream to be cleaned up")
            deliver(client, service)
            deliver(client, service, user_id="participant-2")
            assert kept.next_event()[1]["user_id"] == "participant-1"
            assert theirs.next_event()[1]["user_id"] == "participant-2"
            assert replica_b.inbox.stats.streams_closed == 1
        finally:
            for stream in (kept, theirs):
                stream.close()


class PublisherFailingFor(RecordingPublisher):
    """A fake at the publisher edge: the push of one participant's notification fails."""

    def __init__(self, user_id: str) -> None:
        super().__init__()
        self.user_id = user_id

    def publish(self, message: Any) -> None:
        if message.user_id == self.user_id:
            raise ConnectionError("push service refused (fake)")
        super().publish(message)


@pytest.mark.clause("INBOX-8")
def test_a_batch_whose_numbering_and_one_push_fail_still_pushes_the_others_and_keeps_every_record(
    client: TestClient, service: SchedulerService, database_url: str
) -> None:
    """INBOX-8: one poll delivers to three participants; numbering for the stream fails (the
    database went away after the commit) and the push of the second participant's message
    fails too. The other two are still pushed, and all three notifications stay readable by
    their participants (unnumbered)."""
    gone = make_url(database_url).set(database="no_such_database").render_as_string(hide_password=False)
    pushed = PublisherFailingFor("participant-2")
    service.scheduler.publisher = StreamPublisher(Database(make_engine(gone)), pushed)
    users = ("participant-1", "participant-2", "participant-3")
    for user in users:
        post_event(client, user_id=user, trigger_at=service.clock.now())
    assert service.scheduler.poll_once().dispatched == 3
    assert sorted(m.user_id for m in pushed.messages) == ["participant-1", "participant-3"]
    for user in users:
        page = client.get(ME, headers=bearer(None, subject=user)).json()
        assert [(n["user_id"], n["stream_seq"]) for n in page["items"]] == [(user, None)]


@pytest.mark.clause("INBOX-15")
def test_a_notification_whose_numbering_failed_is_numbered_and_streamed_on_the_inbox_next_read(
    client: TestClient, service: SchedulerService, publisher: RecordingPublisher, database_url: str
) -> None:
    """INBOX-15: two reminders are numbered normally and two more while the numbering fails
    (the database went away after their batches committed). A hub's next read numbers the two
    left behind and offers them live; the participant's stream, replayed from the start, then
    holds every sent notification: nothing missing, nothing twice."""
    deliver(client, service, n=2)
    gone = make_url(database_url).set(database="no_such_database").render_as_string(hide_password=False)
    working = service.scheduler.publisher
    service.scheduler.publisher = StreamPublisher(Database(make_engine(gone)), publisher)
    deliver(client, service, n=2)
    service.scheduler.publisher = working
    unnumbered = rows(service.engine, "SELECT id FROM notifications WHERE stream_seq IS NULL ORDER BY created_at")
    assert len(unnumbered) == 2
    inbox = Inbox(service.database)

    async def next_read() -> list[dict[str, Any]]:
        subscriber = await inbox.subscribe("participant-1")
        await asyncio.wait_for(inbox.pump(), timeout=20)
        live = []
        while not subscriber.queue.empty():
            live.append(subscriber.queue.get_nowait())
        inbox.unsubscribe(subscriber)
        return live

    live = asyncio.run(next_read())
    assert [r["id"] for r in live] == [r["id"] for r in unnumbered]
    sent = rows(service.engine, "SELECT id FROM notifications WHERE status = 'sent' AND user_id = 'participant-1'")
    with service.database.begin() as session:
        stream = service.database.inbox.participant_stream_after(session, user_id="participant-1", after=0,
                                                                  limit=100)
    assert sorted(r["id"] for r in stream) == sorted(r["id"] for r in sent)
    assert len({r["stream_seq"] for r in stream}) == len(sent) == 4


@pytest.mark.clause("INBOX-15")
def test_a_stream_open_on_another_replica_receives_a_notification_whose_numbering_failed(
    client: TestClient, service: SchedulerService, replica_b: SchedulerService, publisher: RecordingPublisher,
    database_url: str,
) -> None:
    """INBOX-15: a stream is open on replica B; replica A's numbering fails after its commit, so
    no NOTIFY comes; B's hub numbers the notification on its next timed read and the stream
    receives it (the hub's timer is shortened here so the wait stays short)."""
    replica_b.inbox.safety_seconds = replica_b.inbox.fallback_seconds = 0.05
    gone = make_url(database_url).set(database="no_such_database").render_as_string(hide_password=False)
    service.scheduler.publisher = StreamPublisher(Database(make_engine(gone)), publisher)
    with serve(replica_b) as base_b, httpx.Client() as http:
        stream = open_stream(base_b, PARTICIPANT, http)
        try:
            stream.until_connected()
            deliver(client, service)
            seq, note = stream.next_event()
            assert note["user_id"] == "participant-1" and note["stream_seq"] == seq
        finally:
            stream.close()
    assert rows(service.engine, "SELECT count(*) AS n FROM notifications WHERE stream_seq IS NULL")[0]["n"] == 0
