"""PROMPT — on time at any backlog: the loop's prompt mode (DEC-9).

In our words: ``SCHEDULER_MODE=literal`` (the default) is REQ-0065 to the letter: one poll,
then a full interval. ``SCHEDULER_MODE=prompt`` still claims at most a batch per poll, but
polls again at once after a full batch; after a short batch it waits until the earliest of
the interval, the next pending ``trigger_at`` (read from the pending index) and a wake-up
from any replica that stored an event due before then (PostgreSQL LISTEN/NOTIFY). The time
of a wake-up still comes from the injected clock, and a stop ends every kind of wait at once.

These tests run the real loop in a thread of its own with a frozen clock and a one-hour
interval: anything that happens within their deadlines happened because of the mechanism
under test, never because an interval passed. Nothing sleeps; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from starlette.testclient import TestClient

from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.core.loop import Scheduler
from scheduler.database.listener import Listener, conninfo_of
from scheduler.nudging.orchestrator import RecordingPublisher
from scheduler.service import SchedulerService
from scheduler.types import SchedulerMode
from tests.conftest import ADMIN, INGEST, T0, TEST_SECRET
from tests.helpers import event_body, post_event, rows, statuses

HOUR = 3600.0
DEADLINE = 20.0  # generous: these are deadlines for a bug to fail, not performance limits


class LoopThread:
    """Runs ``service.start()``/``service.stop()`` on an event loop in a thread of its own,
    like an API process's lifespan; ``stop`` returns whether the loop ended in time."""

    def __init__(self, service: SchedulerService) -> None:
        self.service = service
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._main, name="test-loop", daemon=True)
        self._stopping: asyncio.Event | None = None

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        await self.service.start()
        self.started.set()
        await self._stopping.wait()  # bounded: stop() joins this thread with a deadline
        await self.service.stop()

    def start(self) -> LoopThread:
        self.thread.start()
        assert self.started.wait(DEADLINE), "the service did not start"
        return self

    def stop(self, timeout: float = DEADLINE) -> bool:
        assert self._stopping is not None
        self.loop.call_soon_threadsafe(self._stopping.set)
        self.thread.join(timeout)
        return not self.thread.is_alive()


def make_service(engine: Engine, clock: ManualClock, *, run_scheduler: bool = True, **changes: Any) -> SchedulerService:
    settings = Settings(jwt_secret=TEST_SECRET).with_(
        **{"poll_seconds": HOUR, "batch_size": 2, "mode": SchedulerMode.PROMPT, **changes}
    )
    return SchedulerService(settings, engine=engine, clock=clock, publisher=RecordingPublisher(),
                            run_scheduler=run_scheduler)


def api(engine: Engine, clock: ManualClock) -> TestClient:
    """Another replica's API only (its loop switched off): a sender posting through it."""
    return TestClient(make_service(engine, clock, run_scheduler=False).app)


@pytest.fixture
def running(engine: Engine, clock: ManualClock) -> Iterator[list[LoopThread]]:
    """Loops started by a test; each is stopped (with a deadline) when the test ends."""
    started: list[LoopThread] = []
    yield started
    for loop in started:
        if loop.thread.is_alive():
            assert loop.stop(), "a loop did not stop"


def start(running: list[LoopThread], service: SchedulerService) -> Scheduler:
    running.append(LoopThread(service).start())
    return service.scheduler


def waits(scheduler: Scheduler) -> bool:
    return scheduler.wait_for(lambda: scheduler.waiting, DEADLINE)


def post_due(client: TestClient, n: int, *, at: timedelta = timedelta(0)) -> list[str]:
    return [post_event(client, user_id=f"u{i}", trigger_at=T0 + at - timedelta(seconds=n - i))["id"]
            for i in range(n)]


# -- the setting -----------------------------------------------------------------------


@pytest.mark.clause("PROMPT-1")
def test_the_mode_is_literal_by_default_and_a_bad_value_is_a_clear_error() -> None:
    """PROMPT-1: SCHEDULER_MODE defaults to literal, accepts prompt, and refuses anything else
    with an error that names the variable."""
    assert Settings.from_env({}).mode is SchedulerMode.LITERAL
    assert Settings.from_env({"SCHEDULER_MODE": "Prompt"}).mode is SchedulerMode.PROMPT
    with pytest.raises(ConfigError, match="SCHEDULER_MODE must be literal or prompt, got 'fast'"):
        Settings.from_env({"SCHEDULER_MODE": "fast"})
    with pytest.raises(ValueError, match="mode must be literal or prompt"):
        Scheduler(None, None, ManualClock(T0), mode="fast")  # type: ignore[arg-type]


@pytest.mark.clause("PROMPT-1")
def test_the_health_route_shows_the_mode_and_how_the_loop_is_woken(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-1: /health/scheduler names the mode and whether wake-ups come by LISTEN."""
    literal = make_service(engine, clock, mode=SchedulerMode.LITERAL)
    prompt = make_service(engine, clock)
    start(running, prompt)
    with TestClient(literal.app) as a, TestClient(prompt.app) as b:
        assert a.get("/health/scheduler").json()["mode"] == "literal"
        body = b.get("/health/scheduler").json()
    assert body["mode"] == "prompt"
    assert body["wakeups"]["by"] == "listen"


# -- polling again at once, or waiting ----------------------------------------------------


@pytest.mark.clause("DEC-9")
@pytest.mark.clause("PROMPT-2")
def test_in_prompt_mode_a_full_batch_is_followed_by_an_immediate_poll(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-2: five due rows, batch 2, one-hour interval: three polls drain them at once."""
    service = make_service(engine, clock)
    with api(engine, clock) as client:
        ids = post_due(client, 5)
    scheduler = start(running, service)
    assert waits(scheduler)
    assert scheduler.health.polls == 3
    assert {statuses(engine)[i] for i in ids} == {"dispatched"}


@pytest.mark.clause("DEC-9")
@pytest.mark.clause("PROMPT-2")
def test_in_literal_mode_a_full_batch_still_waits_the_whole_interval(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-2: the literal default keeps REQ-0065's wait after every poll, full or not."""
    service = make_service(engine, clock, mode=SchedulerMode.LITERAL)
    with api(engine, clock) as client:
        post_due(client, 5)
    scheduler = start(running, service)
    assert waits(scheduler)
    assert scheduler.health.polls == 1
    assert sorted(statuses(engine).values()) == ["dispatched"] * 2 + ["pending"] * 3


@pytest.mark.clause("PROMPT-3")
def test_in_prompt_mode_a_short_batch_waits(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-3: one due row with batch 2 is a short batch: the loop dispatches it and waits,
    with nothing pending to wake it before the interval."""
    service = make_service(engine, clock)
    with api(engine, clock) as client:
        post_due(client, 1)
    scheduler = start(running, service)
    assert waits(scheduler)
    assert scheduler.health.polls == 1
    assert scheduler.waiting_until is None  # only the interval can end this wait
    scheduler.recheck()  # the clock did not move: nothing to do
    assert waits(scheduler)
    assert scheduler.health.polls == 1


# -- wake-ups -----------------------------------------------------------------------------


@pytest.mark.clause("DEC-9")
@pytest.mark.clause("PROMPT-4")
def test_a_row_due_before_the_next_poll_wakes_the_loop_at_its_trigger_time(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-4: a pending row due in five minutes (read from the pending index) sets the
    wait's deadline; the loop polls when the clock reaches it, not an interval later."""
    service = make_service(engine, clock)
    with api(engine, clock) as client:
        row = post_event(client, user_id="later", trigger_at=T0 + timedelta(minutes=5))
    scheduler = start(running, service)
    assert scheduler.wait_for(lambda: scheduler.waiting_until == T0 + timedelta(minutes=5), DEADLINE)
    clock.advance(timedelta(minutes=4))
    scheduler.recheck()  # a minute early: still waiting
    assert waits(scheduler)
    assert scheduler.health.polls == 1
    clock.advance(timedelta(minutes=1))
    scheduler.recheck()
    assert scheduler.wait_for(lambda: scheduler.health.polls == 2, DEADLINE)
    dispatched = rows(engine, "SELECT status, dispatched_at FROM scheduled_events WHERE id = :id", id=row["id"])
    assert dispatched == [{"status": "dispatched", "dispatched_at": T0 + timedelta(minutes=5)}]


@pytest.mark.clause("PROMPT-5")
def test_a_post_on_another_replica_wakes_this_one(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5: replica A waits out a one-hour interval; a row due now stored through
    replica B's API reaches A by NOTIFY, and A dispatches it at once."""
    a = make_service(engine, clock)
    b = make_service(engine, clock, mode=SchedulerMode.LITERAL, run_scheduler=False)
    scheduler = start(running, a)
    assert waits(scheduler)
    assert scheduler.health.polls == 1
    with TestClient(b.app) as client:  # B does not run a loop here: only its API
        row = post_event(client, user_id="now", trigger_at=T0)
    assert scheduler.wait_for(lambda: scheduler.health.dispatched == 1, DEADLINE)
    assert statuses(engine)[row["id"]] == "dispatched"


@pytest.mark.clause("PROMPT-5")
@pytest.mark.clause("BATCH-3")
def test_a_batch_posted_on_another_replica_wakes_this_one(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5, BATCH-3: as for a single POST, rows due now stored by a batch through
    replica B's API reach A by NOTIFY, and A dispatches them at once."""
    a = make_service(engine, clock)
    b = make_service(engine, clock, mode=SchedulerMode.LITERAL, run_scheduler=False)
    scheduler = start(running, a)
    assert waits(scheduler)
    with TestClient(b.app) as client:
        answer = client.post("/admin/scheduled-events/bulk", headers=INGEST,
                             json=[event_body(user_id=f"batch-{i}", trigger_at=T0) for i in range(2)])
        assert answer.status_code == 200, answer.text
    assert scheduler.wait_for(lambda: scheduler.health.dispatched == 2, DEADLINE)
    assert set(statuses(engine).values()) == {"dispatched"}


@pytest.mark.clause("PROMPT-5")
def test_an_operators_reset_on_another_replica_wakes_this_one(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5: the database announces every row that becomes pending, whatever wrote it: a
    failed row reset by an operator through replica B's API (the audited reset) wakes A."""
    facts = {"facts_version": "1", "scenario": "no-such-scenario", "date": "2026-11-30"}
    with api(engine, clock) as client:
        row = post_event(client, user_id="fails", trigger_at=T0, facts=facts)
    a = make_service(engine, clock)
    scheduler = start(running, a)
    assert scheduler.wait_for(lambda: scheduler.health.failed == 1 and scheduler.waiting, DEADLINE)
    polls = scheduler.health.polls
    with api(engine, clock) as client:
        answer = client.post(f"/admin/scheduled-events/{row['id']}/reset", headers=ADMIN)
        assert answer.status_code == 200
    assert scheduler.wait_for(lambda: scheduler.health.polls > polls, DEADLINE)
    assert scheduler.health.failed == 2  # it ran again (and failed again: its facts are still wrong)


@pytest.mark.clause("PROMPT-5")
def test_a_post_due_later_moves_the_wait_to_its_trigger_time_without_a_poll(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5: a wake-up for a row due in ten minutes does not poll early: it only moves
    the wait's deadline to the row's trigger time, by the injected clock."""
    a = make_service(engine, clock)
    scheduler = start(running, a)
    assert waits(scheduler)
    with api(engine, clock) as client:
        post_event(client, user_id="soon", trigger_at=T0 + timedelta(minutes=10))
    assert scheduler.wait_for(lambda: scheduler.waiting_until == T0 + timedelta(minutes=10), DEADLINE)
    assert scheduler.health.polls == 1


# -- stop ---------------------------------------------------------------------------------


def _into_interval_wait(client: TestClient, scheduler: Scheduler, clock: ManualClock) -> None:
    assert waits(scheduler)


def _into_next_due_wait(client: TestClient, scheduler: Scheduler, clock: ManualClock) -> None:
    post_event(client, user_id="later", trigger_at=T0 + timedelta(minutes=30))
    assert scheduler.wait_for(lambda: scheduler.waiting_until == T0 + timedelta(minutes=30), DEADLINE)


def _into_wait_after_a_wakeup(client: TestClient, scheduler: Scheduler, clock: ManualClock) -> None:
    assert waits(scheduler)
    post_event(client, user_id="now", trigger_at=T0)
    assert scheduler.wait_for(lambda: scheduler.health.polls == 2 and scheduler.waiting, DEADLINE)


@pytest.mark.clause("PROMPT-6")
@pytest.mark.parametrize(
    "into", [_into_interval_wait, _into_next_due_wait, _into_wait_after_a_wakeup],
    ids=["interval", "next-due", "after-a-wake-up"],
)
def test_a_stop_ends_every_kind_of_wait_at_once(
    engine: Engine, clock: ManualClock, into: Any
) -> None:
    """PROMPT-6: whichever wait the loop is in (the interval, a pending row's trigger, the
    wait after a wake-up), a stop ends the loop without cancellation, long before an hour."""
    service = make_service(engine, clock)
    loop = LoopThread(service).start()
    try:
        with api(engine, clock) as client:
            into(client, service.scheduler, clock)
    finally:
        assert loop.stop(), "the loop did not stop"
    assert service.scheduler.health.running is False


@pytest.mark.clause("PROMPT-6")
def test_a_stop_ends_the_threads_loop_in_prompt_mode_too(engine: Engine, clock: ManualClock) -> None:
    """PROMPT-6: run_blocking (benchmarks, worker threads) in prompt mode stops at once too."""
    service = make_service(engine, clock)
    stop = threading.Event()
    thread = threading.Thread(target=service.scheduler.run_blocking, args=(stop,), daemon=True)
    thread.start()
    assert waits(service.scheduler)
    stop.set()
    thread.join(DEADLINE)
    assert not thread.is_alive()


# -- without LISTEN -------------------------------------------------------------------------


@pytest.mark.clause("PROMPT-7")
def test_where_notifications_do_not_arrive_the_listener_says_so_once_and_the_loop_uses_timers(
    engine: Engine, database_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture,
    running: list[LoopThread],
) -> None:
    """PROMPT-7: a listener whose probe NOTIFY never comes back (here it is sent to another
    database, as a transaction-pooling proxy would lose it) reports LISTEN unavailable, logs
    it once, and /health/scheduler shows timed wake-ups with the reason; the loop still
    dispatches by its next-due deadline."""
    elsewhere = f"elsewhere_{uuid.uuid4().hex[:12]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'CREATE DATABASE "{elsewhere}"'))
    other_engine = create_engine(engine.url.set(database=elsewhere))
    try:
        service = make_service(engine, clock)
        service.listener = Listener(conninfo_of(engine), name="scheduler", probe_engine=other_engine,
                                    probe_seconds=0.5)
        service.listener.subscribe("scheduler_due", service.scheduler.announce_notified)
        with api(engine, clock) as sender:
            row = post_event(sender, user_id="later", trigger_at=T0 + timedelta(minutes=1))
        with caplog.at_level(logging.WARNING, logger="scheduler.database.listener"):
            scheduler = start(running, service)
            with TestClient(service.app) as client:  # the loop runs already: only its API here
                body = client.get("/health/scheduler").json()
            assert body["wakeups"]["by"] == "timer"
            assert "did not come back" in body["wakeups"]["reason"]
            assert scheduler.wait_for(lambda: scheduler.waiting_until == T0 + timedelta(minutes=1), DEADLINE)
            clock.advance(timedelta(minutes=1))
            scheduler.recheck()
            assert scheduler.wait_for(lambda: scheduler.health.dispatched == 1, DEADLINE)
        assert statuses(engine)[row["id"]] == "dispatched"
        unavailable = [r for r in caplog.records if "LISTEN/NOTIFY unavailable" in r.getMessage()]
        assert len(unavailable) == 1
    finally:
        for loop in running:
            loop.stop()
        other_engine.dispose()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{elsewhere}" WITH (FORCE)'))


@pytest.mark.clause("PROMPT-7")
def test_with_listen_switched_off_the_loop_uses_timed_wakeups(engine: Engine, clock: ManualClock) -> None:
    """PROMPT-7: SCHEDULER_LISTEN=false opens no LISTEN connection; health says timer."""
    assert Settings.from_env({"SCHEDULER_LISTEN": "false"}).listen is False
    service = make_service(engine, clock, listen=False)
    assert not service.listener.has_subscribers
    with TestClient(service.app) as client:
        wakeups = client.get("/health/scheduler").json()["wakeups"]
        assert wakeups == {"by": "timer", "reason": "SCHEDULER_LISTEN is false"}


class FakeSessionsThatFail:
    """A fake at the database edge: every session the loop asks for is refused."""

    def __call__(self) -> Any:
        raise RuntimeError("database down (fake)")

    def begin(self) -> Any:
        raise RuntimeError("database down (fake)")


@pytest.mark.clause("PROMPT-3")
def test_a_failed_poll_waits_the_interval_instead_of_retrying_at_once(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-3: even with a next trigger already due (as last read), a poll that fails is
    followed by the interval, not a hot retry loop against a database that is down."""
    service = make_service(engine, clock)
    service.scheduler.next_due = T0 - timedelta(hours=1)
    service.scheduler.sessions = FakeSessionsThatFail()  # type: ignore[assignment]
    scheduler = start(running, service)
    assert waits(scheduler)
    scheduler.recheck()
    assert waits(scheduler)
    assert scheduler.health.consecutive_failures == 1
    assert scheduler.waiting_until is None


@pytest.mark.clause("PROMPT-5")
def test_a_post_wakes_every_waiting_replica_not_only_one(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5: two prompt-mode replicas both wait out a one-hour interval; one row due now,
    stored through a third replica's API, wakes both (each polls once more), and exactly one
    of them dispatches it."""
    loops = [start(running, make_service(engine, clock)) for _ in range(2)]
    for scheduler in loops:
        assert waits(scheduler) and scheduler.health.polls == 1
    with api(engine, clock) as client:
        row = post_event(client, user_id="now", trigger_at=T0)
    def polled_again(scheduler: Scheduler) -> Callable[[], bool]:
        return lambda: scheduler.health.polls >= 2 and scheduler.waiting

    for scheduler in loops:
        assert scheduler.wait_for(polled_again(scheduler), DEADLINE), "a waiting replica was not woken"
    assert sum(s.health.dispatched for s in loops) == 1
    assert statuses(engine)[row["id"]] == "dispatched"


@pytest.mark.clause("PROMPT-4")
def test_rows_due_at_several_instants_wake_the_loop_at_each_trigger_in_turn(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-4: rows due in 5, 8 and 20 minutes, with a one-hour interval. The loop waits for
    the first; as the clock reaches each trigger it polls once, dispatches that row only, and
    then waits for the next trigger (read again from the pending index after each poll): never
    a deadline already past (a hot loop of polls), never the interval."""
    service = make_service(engine, clock)
    triggers = [T0 + timedelta(minutes=m) for m in (5, 8, 20)]
    with api(engine, clock) as client:
        ids = [post_event(client, user_id=f"at-{n}", trigger_at=when)["id"] for n, when in enumerate(triggers)]
    scheduler = start(running, service)
    assert scheduler.wait_for(lambda: scheduler.waiting_until == triggers[0] and scheduler.waiting, DEADLINE)
    for n, when in enumerate(triggers):
        clock.set(when)
        scheduler.recheck()
        following = triggers[n + 1] if n + 1 < len(triggers) else None
        assert scheduler.wait_for(
            lambda n=n, following=following: scheduler.health.polls == n + 2 and scheduler.waiting  # type: ignore[misc]
            and scheduler.waiting_until == following,
            DEADLINE), (n, scheduler.health.polls, scheduler.waiting_until)
        assert [statuses(engine)[i] for i in ids] == ["dispatched"] * (n + 1) + ["pending"] * (len(ids) - n - 1)
        scheduler.recheck()  # the clock did not move: no poll
        assert waits(scheduler) and scheduler.health.polls == n + 2


class AnnouncementSpy:
    """Records each wake-up the loop's pacing is handed (after handing it on), so that a test
    knows a NOTIFY has arrived instead of guessing with a timer."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.seen: list[Any] = []
        self._changed = threading.Condition()
        self._real = scheduler.pacing.announce
        scheduler.pacing.announce = self  # type: ignore[method-assign]

    def __call__(self, trigger_at: Any) -> None:
        self._real(trigger_at)
        with self._changed:
            self.seen.append(trigger_at)
            self._changed.notify_all()

    def until(self, count: int) -> list[Any]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.seen) >= count, DEADLINE), (
                f"{count} wake-ups expected within {DEADLINE:g} s, got {self.seen}")
            return list(self.seen)


@pytest.mark.clause("PROMPT-5")
def test_wake_ups_for_several_posts_keep_the_earliest_trigger_whatever_their_order(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5: a replica waits out its interval with nothing pending. Posts through another
    replica announce rows due in 10, then 30 minutes: the wait's deadline is 10 minutes (a
    later announcement never postpones an earlier one), and when the clock gets there the loop
    polls, with no poll before. Its wait then moves to the next trigger (30 minutes); a row
    posted due already (5 minutes, the clock being at 10) is polled for at once."""
    service = make_service(engine, clock)
    scheduler = start(running, service)
    assert waits(scheduler) and scheduler.waiting_until is None
    spy = AnnouncementSpy(scheduler)
    at = {m: T0 + timedelta(minutes=m) for m in (5, 10, 30)}
    with api(engine, clock) as client:
        ten = post_event(client, user_id="in-10", trigger_at=at[10])["id"]
        thirty = post_event(client, user_id="in-30", trigger_at=at[30])["id"]
        assert spy.until(2) == [at[10], at[30]]  # both wake-ups have reached the loop
        assert scheduler.wait_for(lambda: scheduler.waiting_until == at[10] and scheduler.waiting, DEADLINE)
        assert scheduler.health.polls == 1
        clock.set(at[10])
        scheduler.recheck()
        assert scheduler.wait_for(lambda: scheduler.health.polls == 2 and scheduler.waiting
                                  and scheduler.waiting_until == at[30], DEADLINE), scheduler.waiting_until
        assert (statuses(engine)[ten], statuses(engine)[thirty]) == ("dispatched", "pending")
        five = post_event(client, user_id="in-5", trigger_at=at[5])["id"]
        assert scheduler.wait_for(lambda: scheduler.health.polls == 3 and scheduler.waiting, DEADLINE)
    assert (statuses(engine)[five], statuses(engine)[thirty]) == ("dispatched", "pending")
    assert scheduler.waiting_until == at[30]


@pytest.mark.clause("PROMPT-5")
def test_a_pending_row_rewritten_to_fall_due_now_wakes_the_loop_at_once(
    engine: Engine, clock: ManualClock, running: list[LoopThread]
) -> None:
    """PROMPT-5: a row stays pending while its sender moves it. The loop waits for a row due in
    an hour; its sender re-posts the same key due now (REQ-0064: the same row, rewritten, never
    having left `pending`). That wakes the loop at once, which dispatches it, an hour early
    by the old trigger: a wake-up only for rows *becoming* pending would leave it waiting."""
    with api(engine, clock) as client:
        row = post_event(client, user_id="moved", external_key="k-moved", trigger_at=T0 + timedelta(hours=1))
        scheduler = start(running, make_service(engine, clock))
        assert scheduler.wait_for(lambda: scheduler.waiting_until == T0 + timedelta(hours=1) and scheduler.waiting,
                                  DEADLINE)
        again = post_event(client, user_id="moved", external_key="k-moved", trigger_at=T0)
        assert again["id"] == row["id"]
        assert scheduler.wait_for(lambda: scheduler.health.dispatched == 1, DEADLINE), "the rewrite woke nobody"
    assert statuses(engine)[row["id"]] == "dispatched"
    assert scheduler.health.polls == 2
