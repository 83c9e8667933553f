"""The outbox and the delivery worker (OUTBOX-*, DEC-OUTBOX), on real PostgreSQL.

A sent notification's row for a channel with a ``Sender`` (a host's, the webhook) is written
``queued`` in the dispatch transaction; the worker claims due rows with a lease, sends, and
records each attempt. The senders here are fakes at the true edge (``ScriptedSender``); the
webhook is sent over loopback HTTP to ``scheduler.testing``'s receiver.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.delivery.backoff import RetryPolicy
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.operations.delivery_worker import Claimed, DeliveryWorker
from scheduler.service import SchedulerService
from scheduler.testing.webhook_receiver import LocalWebhookReceiver, Reply
from scheduler.types import Delivered, OutboundDelivery, Retry, SendResult, Undeliverable
from tests.conftest import TEST_SECRET
from tests.helpers import drain, post_event, rows, running

POLICY = RetryPolicy(base_seconds=1.0, cap_seconds=60.0, max_attempts=3)


class ScriptedSender:
    """A fake provider (the edge): answers the scripted results in order, then ``Delivered``;
    records every delivery it was handed."""

    def __init__(self, *answers: SendResult | BaseException) -> None:
        self.answers = list(answers)
        self.sent: list[OutboundDelivery] = []

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        self.sent.append(delivery)
        answer = self.answers.pop(0) if self.answers else Delivered(status=200, answer="ok")
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture
def sender() -> ScriptedSender:
    return ScriptedSender()


@pytest.fixture
def outbox_service(settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher,
                   sender: ScriptedSender) -> SchedulerService:
    return SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False,
                            senders={"sms": sender})


@pytest.fixture
def outbox_client(outbox_service: SchedulerService) -> Iterator[TestClient]:
    with TestClient(outbox_service.app, raise_server_exceptions=True) as client:
        yield client


def worker(service: SchedulerService, sender: Any, clock: ManualClock, name: str = "worker-a") -> DeliveryWorker:
    return DeliveryWorker(service.database, {"sms": sender}, clock, policy=POLICY, concurrency=4,
                          timeout=5.0, rng=random.Random(7), lease_seconds=30.0, worker_id=name)


def outbox(engine: Engine) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM deliveries WHERE channel = 'sms' ORDER BY id")


@pytest.mark.clause("OUTBOX-1")
@pytest.mark.clause("DEC-OUTBOX")
def test_a_sent_notification_queues_one_outbox_row_per_sender_channel_in_its_transaction(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, publisher: RecordingPublisher
) -> None:
    """OUTBOX-1: the dispatch writes the sms row queued, due at once, with its idempotency key and
    message; the in-app row stays ``sent`` and alone counts against the cap; nothing is sent yet."""
    post_event(outbox_client)
    drain(outbox_service)
    [row] = outbox(engine)
    [note] = rows(engine, "SELECT * FROM notifications")
    assert row["status"] == "queued" and row["attempts"] == 0 and row["notification_id"] == note["id"]
    assert row["next_attempt_at"] == note["created_at"] and row["idempotency_key"]
    assert row["message"]["title"] == note["title"] and row["message"]["body"] == note["body"]
    assert [r["status"] for r in rows(engine, "SELECT status FROM deliveries WHERE channel = 'web'")] == ["sent"]
    assert [m.channel for m in publisher.messages] == ["web"]  # the publisher never sees the outbox


@pytest.mark.clause("OUTBOX-1")
def test_a_decision_rolled_back_queues_nothing_and_the_worker_sends_nothing(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock,
    sender: ScriptedSender
) -> None:
    """OUTBOX-1: a batch that rolls back leaves no outbox row, so no send follows it."""
    post_event(outbox_client)
    scheduler = outbox_service.scheduler
    batch = scheduler.claim()
    while scheduler.dispatch_next(batch) is not None:
        pass
    scheduler.abort(batch)
    assert outbox(engine) == []
    assert asyncio.run(worker(outbox_service, sender, clock).run_once()) == []
    assert sender.sent == []


@pytest.mark.clause("OUTBOX-2")
def test_the_worker_sends_a_queued_row_and_records_it_delivered_with_the_providers_answer(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock,
    sender: ScriptedSender
) -> None:
    """OUTBOX-2: one claim sends the row once with its key and the notification's fields, and
    records ``delivered`` with when, the attempt and what the provider answered."""
    post_event(outbox_client)
    drain(outbox_service)
    [queued] = outbox(engine)
    clock.advance(timedelta(seconds=2))
    [recorded] = asyncio.run(worker(outbox_service, sender, clock).run_once())
    [sent] = sender.sent
    assert sent.idempotency_key == queued["idempotency_key"] and sent.attempt == 1
    assert sent.title == queued["message"]["title"] and sent.notification_id == queued["notification_id"]
    [row] = outbox(engine)
    assert recorded.kept
    assert (row["status"], row["attempts"], row["delivered_at"], row["provider_status"], row["provider_answer"],
            row["lease_until"], row["last_error"]) == ("delivered", 1, clock.now(), 200, "ok", None, None)


@pytest.mark.clause("OUTBOX-2")
def test_a_retry_waits_for_its_backoff_and_the_last_attempt_gives_up_undeliverable(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-2: a 5xx is ``retrying`` with ``next_attempt_at`` after the backoff and the reason; no
    claim takes it before then; the policy's last attempt ends it ``undeliverable``."""
    failing = ScriptedSender(*[Retry(reason="http 503")] * 3)
    post_event(outbox_client)
    drain(outbox_service)
    one = worker(outbox_service, failing, clock)
    asyncio.run(one.run_once())
    [row] = outbox(engine)
    assert (row["status"], row["attempts"], row["last_error"]) == ("retrying", 1, "http 503")
    assert row["next_attempt_at"] > clock.now() or row["next_attempt_at"] == clock.now()
    for attempt in (2, 3):
        if row["next_attempt_at"] > clock.now():
            assert asyncio.run(one.run_once()) == []  # not before its time
        clock.set(row["next_attempt_at"])
        [recorded] = asyncio.run(one.run_once())
        assert recorded.claimed.delivery.attempt == attempt
        [row] = outbox(engine)
    assert (row["status"], row["attempts"]) == ("undeliverable", 3)
    assert row["last_error"].startswith("gave up after 3 attempts")
    assert len(failing.sent) == 3 and len({d.idempotency_key for d in failing.sent}) == 1


@pytest.mark.clause("OUTBOX-2")
def test_any_other_4xx_or_a_sender_that_raises_is_recorded_never_lost(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-2: ``Undeliverable`` ends the row at once with its reason; a sender that raises is a
    retry naming the error, and the row stays in the outbox."""
    post_event(outbox_client, user_id="p-1")
    post_event(outbox_client, user_id="p-2")
    drain(outbox_service)
    answers = ScriptedSender(Undeliverable(reason="http 400: bad request"), RuntimeError("socket closed"))
    asyncio.run(worker(outbox_service, answers, clock).run_once())
    by_status = {r["status"]: r for r in outbox(engine)}
    assert by_status["undeliverable"]["last_error"] == "http 400: bad request"
    assert "RuntimeError" in by_status["retrying"]["last_error"]


@pytest.mark.clause("OUTBOX-3")
@pytest.mark.clause("DEC-OUTBOX")
def test_a_crash_after_the_send_and_before_the_record_sends_again_after_the_lease_with_the_same_key(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock,
    sender: ScriptedSender
) -> None:
    """OUTBOX-3: a worker that claimed and sent, then died before recording, leaves the row leased;
    no other worker takes it while the lease holds; after it, another sends it again with the same
    idempotency key, and the dead worker's late record (if it ever came) writes nothing."""
    post_event(outbox_client)
    drain(outbox_service)
    crashed = worker(outbox_service, sender, clock, name="worker-a")
    [claimed] = crashed.claim(10)
    asyncio.run(crashed.attempt_one(claimed))  # the provider got it; the process dies here
    other = worker(outbox_service, sender, clock, name="worker-b")
    assert asyncio.run(other.run_once()) == []  # the lease holds
    clock.advance(timedelta(seconds=31))
    [taken_over] = asyncio.run(other.run_once())
    assert [d.idempotency_key for d in sender.sent] == [claimed.delivery.idempotency_key] * 2
    assert [d.attempt for d in sender.sent] == [1, 2]
    [late] = crashed.record([(claimed, Delivered(status=200))])
    assert taken_over.kept and not late.kept
    [row] = outbox(engine)
    assert (row["status"], row["attempts"]) == ("delivered", 2)


@pytest.mark.clause("OUTBOX-3")
def test_two_workers_claiming_at_once_never_take_the_same_row(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock,
    sender: ScriptedSender
) -> None:
    """OUTBOX-3: claims skip the rows another holds (SKIP LOCKED and the lease): every row is
    claimed by exactly one of two workers."""
    for n in range(6):
        post_event(outbox_client, user_id=f"p-{n}")
    drain(outbox_service)
    a, b = worker(outbox_service, sender, clock, "worker-a"), worker(outbox_service, sender, clock, "worker-b")
    first, second = a.claim(4), b.claim(4)
    ids = [c.delivery.delivery_id for c in [*first, *second]]
    assert len(first) == 4 and len(second) == 2 and len(set(ids)) == 6


@pytest.mark.clause("OUTBOX-4")
def test_the_service_runs_the_worker_in_its_lifespan_and_a_stop_returns_promptly(
    settings: Settings, engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """OUTBOX-4: ``SchedulerService(senders=...)`` starts a worker beside the loop; the loop's
    batch wakes it, the row ends delivered, and stopping the service ends the worker, even with a
    send that never returns in flight."""
    hanging = asyncio.Event()

    class Hanging(ScriptedSender):
        async def send(self, delivery: OutboundDelivery) -> SendResult:
            self.sent.append(delivery)
            if len(self.sent) > 1:
                await hanging.wait()  # bounded: never set, the service's stop cancels it (the scenario's wait_for)
            return Delivered(status=202)

    provider = Hanging()
    poster = SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=False)
    with running(poster.app) as client:
        post_event(client, user_id="p-1")
        post_event(client, user_id="p-2", trigger_at=clock.now() + timedelta(hours=1))
    service = SchedulerService(settings, engine=engine, clock=clock, publisher=publisher, run_scheduler=True,
                               senders={"sms": provider})

    async def scenario() -> None:
        async with service.lifespan():
            assert service.delivery is not None
            await asyncio.to_thread(service.scheduler.poll_once)
            service._wake_delivery(service.scheduler)
            await _eventually(lambda: [r["status"] for r in outbox(engine)] == ["delivered"])
            clock.advance(timedelta(hours=2))
            await asyncio.to_thread(service.scheduler.poll_once)
            service._wake_delivery(service.scheduler)
            await _eventually(lambda: len(provider.sent) == 2)
        assert service.delivery is None

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    statuses = [r["status"] for r in outbox(engine)]
    assert statuses[0] == "delivered" and statuses[1] == "queued"  # leased, cut short: sent again later


async def _eventually(condition: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await asyncio.to_thread(condition):
            await asyncio.sleep(0.01)


@pytest.mark.clause("OUTBOX-5")
def test_the_webhook_channel_is_queued_and_sent_signed_over_loopback(
    engine: Engine, clock: ManualClock, publisher: RecordingPublisher
) -> None:
    """OUTBOX-5: with ``SCHEDULER_WEBHOOK_URL`` (and a secret) the decision queues a webhook row
    and the worker's send reaches the receiver signed, with the row's key as ``webhook-id``; a 503
    is retried with the same id."""
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    async def scenario() -> None:
        async with LocalWebhookReceiver(secret, clock=clock) as receiver:
            receiver.answer(Reply.of(503))
            settings = Settings(jwt_secret=TEST_SECRET, poll_seconds=30.0, batch_size=20,
                                webhook_url=receiver.url, webhook_secret=secret)
            service = SchedulerService(settings, engine=engine, clock=clock, publisher=publisher,
                                       run_scheduler=False)
            assert service.outbox_channels == ("webhook",)
            with TestClient(service.app) as client:
                post_event(client)
            await asyncio.to_thread(drain, service)
            worker = service.delivery_worker()
            await worker.run_once()
            [row] = await asyncio.to_thread(rows, engine, "SELECT * FROM deliveries WHERE channel = 'webhook'")
            assert row["status"] == "retrying" and row["provider_status"] is None
            clock.set(row["next_attempt_at"])
            await worker.run_once()
            assert [r.status for r in receiver.received] == [503, 204]
            assert all(r.accepted for r in receiver.received)
            assert {r.headers["webhook-id"] for r in receiver.received} == {row["idempotency_key"]}
            await service.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    [row] = rows(engine, "SELECT * FROM deliveries WHERE channel = 'webhook'")
    assert (row["status"], row["attempts"], row["provider_status"]) == ("delivered", 2, 204)


@pytest.mark.clause("OUTBOX-6")
def test_the_admin_route_lists_deliveries_by_strict_filters_and_metrics_count_the_attempts(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-6: ``GET /admin/deliveries`` filters by status, channel, participant and notification
    (an unknown status is a 422); ``/metrics`` shows the queued depth, the oldest queued age, the
    attempts by channel and outcome and the trigger-to-delivered latency."""
    from tests.conftest import ADMIN

    post_event(outbox_client, user_id="p-1")
    post_event(outbox_client, user_id="p-2")
    drain(outbox_service)
    clock.advance(timedelta(seconds=90))
    scrape = outbox_client.get("/metrics").text
    assert 'scheduler_deliveries_queued{status="queued"} 2.0' in scrape
    assert "scheduler_oldest_queued_delivery_seconds 90.0" in scrape
    worker = outbox_service.delivery_worker()
    worker.senders["sms"] = ScriptedSender(Retry(reason="http 503"))
    asyncio.run(worker.run_once())
    queued = outbox_client.get("/admin/deliveries?status=retrying", headers=ADMIN)
    assert queued.status_code == 200
    [retrying] = queued.json()
    assert (retrying["channel"], retrying["attempts"], retrying["last_error"]) == ("sms", 1, "http 503")
    mine = outbox_client.get(f"/admin/deliveries?user_id={retrying['user_id']}&channel=sms", headers=ADMIN).json()
    assert [d["id"] for d in mine] == [retrying["id"]]
    by_note = outbox_client.get(f"/admin/deliveries?notification_id={retrying['notification_id']}",
                                headers=ADMIN).json()
    assert sorted(d["channel"] for d in by_note) == ["sms", "web"]
    assert outbox_client.get("/admin/deliveries?status=lost", headers=ADMIN).status_code == 422
    assert outbox_client.get("/admin/deliveries?colour=red", headers=ADMIN).status_code == 422
    clock.advance(timedelta(seconds=5))
    outbox_service.metrics.cache_for = timedelta(0)
    scrape = outbox_client.get("/metrics").text
    assert 'scheduler_delivery_attempts_total{channel="sms",outcome="delivered"} 1.0' in scrape
    assert 'scheduler_delivery_attempts_total{channel="sms",outcome="retrying"} 1.0' in scrape
    assert "scheduler_delivery_latency_seconds_count 1.0" in scrape


@pytest.mark.clause("OUTBOX-12")
@pytest.mark.clause("DEC-DELIVERY-HTTP")
def test_sends_that_finish_together_are_recorded_in_one_round_and_an_empty_claim_waits_for_a_wake(
    outbox_service: SchedulerService, outbox_client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-12: eight sends that finish at once are recorded by one statement; a claim that
    found fewer rows than it asked for is not repeated until a wake (with an hour's
    ``idle_seconds``, nothing else makes the worker look)."""
    claims: list[int] = []
    rounds: list[list[str]] = []
    provider = Gated()
    for n in range(8):
        post_event(outbox_client, user_id=f"p-{n}")
    drain(outbox_service)
    one = counting_worker(outbox_service, provider, clock, claims, concurrency=8)
    one.observers.append(lambda recorded: rounds.append(sorted(r.claimed.delivery.delivery_id for r in recorded)))

    async def scenario() -> None:
        provider.gate = asyncio.Event()
        stop = asyncio.Event()
        task = asyncio.create_task(one.run(stop))
        await _eventually(lambda: len(provider.sent) == 8)
        assert claims == [8]  # asked for 16 (in flight and ahead), found 8: no claim again
        provider.gate.set()
        await _eventually(lambda: len(rounds) == 1)
        assert rounds == [sorted(d.delivery_id for d in provider.sent)]
        await asyncio.to_thread(post_event, outbox_client, user_id="p-8")
        await asyncio.to_thread(drain, outbox_service)
        assert claims == [8]  # a row is due, but nothing told the worker
        one.wake()
        await _eventually(lambda: len(rounds) == 2)
        assert claims == [8, 1] and len(provider.sent) == 9
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert [r["status"] for r in outbox(engine)] == ["delivered"] * 9


@pytest.mark.clause("OUTBOX-12")
def test_a_worker_claims_ahead_of_its_slots_and_gives_back_what_it_never_sent_when_it_stops(
    outbox_service: SchedulerService, outbox_client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """OUTBOX-12: two slots hold four rows (two sent, two claimed ahead); a stop cancels the two
    sends (leased: sent again after the lease) and gives back the two never sent, their attempt
    taken back, so another worker's claim at once takes them and the two never claimed."""
    claims: list[int] = []
    provider = Gated()  # its gate never opens: the sends are in flight when the stop comes
    for n in range(6):
        post_event(outbox_client, user_id=f"p-{n}")
    drain(outbox_service)
    one = counting_worker(outbox_service, provider, clock, claims, concurrency=2)

    async def scenario() -> None:
        provider.gate = asyncio.Event()
        stop = asyncio.Event()
        task = asyncio.create_task(one.run(stop))
        await _eventually(lambda: len(provider.sent) == 2)
        assert claims == [4]
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    found = [(r["attempts"], r["leased_by"]) for r in outbox(engine)]
    assert found == [(1, "worker-a")] * 2 + [(0, None)] * 4
    sent = {d.delivery_id for d in provider.sent}
    taken = {c.delivery.delivery_id for c in worker(outbox_service, provider, clock, "worker-b").claim(6)}
    assert len(taken) == 4 and not taken & sent
    assert [r["attempts"] for r in outbox(engine) if str(r["id"]) in taken] == [1] * 4


class Gated(ScriptedSender):
    """A fake provider (the edge) whose every answer waits for its gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        self.sent.append(delivery)
        assert self.gate is not None
        await self.gate.wait()  # bounded: the scenario's wait_for, or the stop's cancel
        return Delivered(status=200)


def counting_worker(service: SchedulerService, sender: Any, clock: ManualClock, claims: list[int], *,
                    concurrency: int) -> DeliveryWorker:
    """A production worker that notes how many rows each of its claims found."""

    class Counting(DeliveryWorker):
        def claim(self, limit: int) -> list[Claimed]:
            found = super().claim(limit)
            claims.append(len(found))
            return found

    return Counting(service.database, {"sms": sender}, clock, policy=POLICY, concurrency=concurrency,
                    timeout=5.0, rng=random.Random(7), lease_seconds=30.0, idle_seconds=3600.0,
                    worker_id="worker-a")


REFUSE_RECORDS = """
CREATE FUNCTION refuse_delivered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'fault: the database refuses the record'; END $$;
CREATE TRIGGER tr_refuse_delivered BEFORE UPDATE ON deliveries
FOR EACH ROW WHEN (NEW.status = 'delivered' AND OLD.user_id = 'p-1') EXECUTE FUNCTION refuse_delivered();
"""
ACCEPT_RECORDS = "DROP TRIGGER tr_refuse_delivered ON deliveries; DROP FUNCTION refuse_delivered();"


@pytest.mark.clause("OUTBOX-13")
@pytest.mark.clause("DEC-OUTBOX")
def test_a_record_the_database_refuses_is_kept_and_recorded_later_without_sending_again(
    outbox_service: SchedulerService, outbox_client: TestClient, engine: Engine, clock: ManualClock,
    sender: ScriptedSender
) -> None:
    """OUTBOX-13: while the database refuses the record of a finished send (a fault injected
    in PostgreSQL itself: a trigger that fails p-1's update to ``delivered``), the worker keeps
    the result and tries again each ``idle_seconds``; a send that finishes meanwhile (p-2's) is
    recorded in its own statement, not held back; once the database takes p-1's record, its row
    is delivered after one attempt, and the provider was sent each row once."""
    refused: list[int] = []

    class Refused(DeliveryWorker):
        def record(self, outcomes: list[tuple[Claimed, SendResult]]) -> list[Any]:
            try:
                return super().record(outcomes)
            except Exception:
                refused.append(len(outcomes))
                raise

    post_event(outbox_client, user_id="p-1")
    drain(outbox_service)
    one = Refused(outbox_service.database, {"sms": sender}, clock, policy=POLICY, concurrency=4, timeout=5.0,
                  rng=random.Random(7), lease_seconds=30.0, idle_seconds=0.05, worker_id="worker-a")
    with engine.begin() as conn:
        conn.exec_driver_sql(REFUSE_RECORDS)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(one.run(stop))
        try:
            await _eventually(lambda: len(refused) >= 3)  # refused, kept, tried again, refused again
            await asyncio.to_thread(post_event, outbox_client, user_id="p-2")
            await asyncio.to_thread(drain, outbox_service)
            one.wake()
            await _eventually(lambda: [(r["user_id"], r["status"]) for r in outbox(engine)]
                              == [("p-1", "queued"), ("p-2", "delivered")])
            with engine.begin() as conn:
                conn.exec_driver_sql(ACCEPT_RECORDS)
            await _eventually(lambda: [r["status"] for r in outbox(engine)] == ["delivered"] * 2)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS tr_refuse_delivered ON deliveries; "
                                 "DROP FUNCTION IF EXISTS refuse_delivered();")
    assert set(refused) == {1}
    found = outbox(engine)
    assert sorted(d.idempotency_key for d in sender.sent) == sorted(r["idempotency_key"] for r in found)
    assert [(r["attempts"], r["leased_by"], r["lease_until"]) for r in found] == [(1, None, None)] * 2


@pytest.mark.clause("DEC-OUTBOX-STORAGE")
def test_a_claim_updates_its_rows_in_place_on_the_pages_the_decision_filled(
    outbox_client: TestClient, outbox_service: SchedulerService, engine: Engine, clock: ManualClock,
    sender: ScriptedSender
) -> None:
    """DEC-OUTBOX-STORAGE: with the outbox's fill factor, a claim's new row versions stay on
    the pages the decision wrote (heap-only updates: no index entry); the pages are several,
    so a page with no room would have moved its rows."""
    for n in range(120):
        post_event(outbox_client, user_id=f"participant-{n}")
    drain(outbox_service)
    [options] = rows(engine, "SELECT reloptions FROM pg_class WHERE oid = 'deliveries'::regclass")
    assert options["reloptions"] == ["fillfactor=50"]

    def pages() -> dict[int, int]:
        found = rows(engine, "SELECT id, (ctid::text::point)[0]::int AS page FROM deliveries WHERE channel = 'sms'")
        return {r["id"]: r["page"] for r in found}

    before = pages()
    claimed = worker(outbox_service, sender, clock).claim(len(before))
    assert sorted(int(c.delivery.delivery_id) for c in claimed) == sorted(before)
    assert len(set(before.values())) > 3  # several pages, each filled as far as the fill factor lets it
    assert pages() == before


def _node_types(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan: its type and the index it uses."""
    found = [(plan["Node Type"], plan.get("Index Name"))]
    for child in plan.get("Plans", []):
        found.extend(_node_types(child))
    return found


@pytest.mark.clause("DEC-OUTBOX-STORAGE")
def test_a_claim_walks_the_due_index_in_order_and_stops_at_its_limit_whatever_the_statistics_say(
    outbox_service: SchedulerService, engine: Engine, clock: ManualClock
) -> None:
    """DEC-OUTBOX-STORAGE: with a backlog of due rows in a table whose statistics lag it (never
    analyzed, as in a burst), the claim as the worker sends it (``claim_by_due_order`` first)
    reads ``ix_deliveries_due`` in order, with no bitmap scan and no sort of the due rows;
    the planner left to itself sorts every due row for the first few."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO deliveries (notification_id, user_id, channel, status, created_at, idempotency_key, "
            "message, next_attempt_at, updated_at, attempts) "
            "SELECT 'n-' || g, 'u-' || g, 'sms', 'queued', :now, 'k-' || g, '{}', :now - g * interval '1 ms', :now, 0 "
            "FROM generate_series(1, :n) AS g"), {"now": clock.now(), "n": 3000})
    statements = outbox_service.database.deliveries.statements
    params = {"now": clock.now(), "lease_until": clock.now() + timedelta(seconds=30), "worker": "w", "limit": 64}

    def due_plan(ordered: bool) -> list[tuple[str, str | None]]:
        with engine.connect() as conn:
            if ordered:
                conn.execute(statements["claim_by_due_order"])
            [[document]] = conn.execute(text("EXPLAIN (FORMAT JSON) " + str(statements["claim_due_deliveries"])),
                                        params).fetchall()
            conn.rollback()
        [due] = [p for p in document[0]["Plan"]["Plans"] if p.get("Subplan Name") == "CTE due"]
        return _node_types(due)

    ordered = due_plan(ordered=True)
    assert ("Index Scan", "ix_deliveries_due") in ordered
    assert not {"Bitmap Heap Scan", "Sort"} & {kind for kind, _ in ordered}
    assert {"Bitmap Heap Scan", "Sort"} <= {kind for kind, _ in due_plan(ordered=False)}
