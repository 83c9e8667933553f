"""The scheduler (REQ-0065 to REQ-0067): a poll split into phases a harness can step, run
by one loop for asyncio and for a thread.

A poll is ``claim`` → ``dispatch_next`` (once per claimed event) → ``finish``.
Production runs them back to back (``poll_once``); the simulation interleaves them across
replicas. Three modules make a poll, read top to bottom:

- ``core.poll``: the claim (DEC-2) and its batch, its record of what the events became,
  its commit and what leaves the process after it;
- ``core.strategies``: how the batch's events run, each isolated as if in its own savepoint
  (set-based, optimistic, a savepoint per event: DEC-1, DEC-1.4, DEC-1.6), returning what
  they became;
- ``core.runner`` and ``core.pacing``: the one run loop, over an asyncio or a thread wait
  strategy, and how long it waits after a poll (literal and prompt mode, wake-ups).

``Scheduler`` composes them; its phase methods are the seams subclasses (the
simulation's broken variants, the benchmarks) override.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from scheduler.core.clock import ensure_ready
from scheduler.core.pacing import (
    BUSY_RETRY_SECONDS,
    Pacing,
    interval_after,
    is_full,
    polls_again_at_once,
)
from scheduler.core.poll import Batch, SchedulerHealth, claim_params, open_batch, publish_committed
from scheduler.core.runner import (
    STOP_SLICE_SECONDS,
    AsyncioWaits,
    LoopState,
    ThreadWaits,
    Waits,
    run_to_completion,
)
from scheduler.database.database import Database
from scheduler.observability.observer import Observer, replica_scope
from scheduler.types import (
    MAX_ERROR_LENGTH,
    ClaimedEvent,
    Clock,
    Dispatcher,
    EventOutcome,
    PollReport,
    Publisher,
    SchedulerMode,
    error_text,
    refuse_async_dispatcher,
)

__all__ = [
    "BUSY_RETRY_SECONDS", "DUE_CHANNEL", "MAX_ERROR_LENGTH", "STOP_SLICE_SECONDS",
    "Batch", "ClaimedEvent", "EventOutcome", "PollReport", "Scheduler", "SchedulerHealth",
    "claim_params", "error_text",
]

logger = logging.getLogger(__name__)

# The NOTIFY channel on which the database announces a row that became pending, with its
# trigger_at (the trigger ``tr_scheduled_events_announce_due``; prompt-mode replicas listen).
DUE_CHANNEL = "scheduler_due"


class Scheduler:
    """Polls for due events and dispatches each through ``dispatcher``.

    ``database`` gives this replica its connections and its statements (the schema its
    rows are in, DEC-DB); ``clock`` is the only source of ``:now``; ``publisher`` receives
    delivered notifications after their batch commits.
    """

    def __init__(
        self,
        database: Database,
        dispatcher: Dispatcher,
        clock: Clock,
        *,
        publisher: Publisher | None = None,
        batch_size: int = 20,
        poll_seconds: float = 30.0,
        name: str = "scheduler",
        mode: SchedulerMode | str = SchedulerMode.LITERAL,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        try:
            self.mode = SchedulerMode(mode)
        except ValueError:
            raise ValueError(f"mode must be literal or prompt, got {mode!r}") from None
        if not isinstance(database, Database):
            raise TypeError(f"Scheduler takes the Database it polls (Database(engine, schema)), not {database!r}")
        self.database, self.sessions = database, database.sessions
        self.dispatcher = dispatcher  # refused here if it is async (``dispatcher`` below)
        self.clock = clock
        self.publisher = publisher
        self.batch_size = batch_size
        self.poll_seconds = poll_seconds
        self.name = name
        self.health = SchedulerHealth()
        # Called after every poll of the loop, completed or failed (heartbeats, metrics);
        # a hook that raises is logged and never stops the loop.
        self.poll_hooks: list[Callable[[Scheduler], None]] = []
        self.last_report: PollReport | None = None  # the last poll that committed
        self.last_claimed_at: datetime | None = None  # the clock time of the last claim
        self.last_poll_seconds: float | None = None  # how long the last poll of the loop took
        self.pacing = Pacing()  # prompt mode's wake-ups and the wait they imply
        self.state = LoopState()  # whether the loop waits, observable without sleeping
        # Observability: spans around each poll and each event's dispatch, and
        # the event id in log lines; the service sets a tracing observer when tracing is on.
        self.observer: Observer = Observer()
        # The replica the loop's log lines name (its heartbeat's id; the service sets it, OBS-8).
        self.replica_id: str | None = None

    @property
    def dispatcher(self) -> Dispatcher:
        """What each claimed event is dispatched through. An ``async def`` dispatcher (or an
        object whose ``__call__`` is one) is refused when set, with a sentence saying why:
        dispatchers run synchronously in the loop's worker thread on a sync session."""
        return self._dispatcher

    @dispatcher.setter
    def dispatcher(self, dispatcher: Dispatcher) -> None:
        refuse_async_dispatcher(dispatcher)
        self._dispatcher = dispatcher

    # -- the poll's phases ----------------------------------------------------------------

    def claim(self) -> Batch:
        """The poll's first phase: the batch ``core.poll.open_batch`` claims at the clock's now
        (DEC-2). "Due" is judged by the database's clock in production: before production's
        clock has read it once, the claim refuses (the poll fails and is retried, DEC-10)."""
        ensure_ready(self.clock)
        now = self.clock.now()
        self.last_claimed_at = now
        return open_batch(self.sessions, now, self.batch_size, self.database.events)

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        """Dispatch the next claimed event, isolated from the others; ``None`` when none is
        left (the batch's strategy: ``core.strategies``)."""
        return batch.dispatch_next(self.dispatcher, self.clock, self.name)

    def finish(self, batch: Batch) -> PollReport:
        """Record the batch's outcomes in one statement, commit (releasing its locks), then
        publish what it delivered.

        Events not yet dispatched (a stop arrived mid-batch) were never touched, so
        committing releases them still ``pending`` for the next poll.
        """
        report = batch.commit()
        self.health.committed(report, self.clock.now())
        self.last_report = report
        publish_committed(self.publisher, batch.outbound, self.name)
        return report

    def abort(self, batch: Batch) -> None:
        """Roll the batch back: every claimed row is pending again and its effects vanish."""
        batch.abort()

    def poll_once(self, should_stop: Callable[[], bool] | None = None) -> PollReport:
        """One full poll. Stops between events when ``should_stop`` says so (the batch asks it:
        ``Batch.stop_requested``)."""
        with replica_scope(self.replica_id):
            return self._poll(should_stop)

    def _poll(self, should_stop: Callable[[], bool] | None) -> PollReport:
        batch = self.claim()
        batch.should_stop = should_stop
        try:
            while batch.remaining and not batch.stop_requested():
                # observability: one span per event, linked to the request that stored it
                with self.observer.dispatch(batch.events[batch.position]) as dispatched:
                    dispatched(self.dispatch_next(batch))
            return self.finish(batch)
        finally:
            self.abort(batch)

    def poll_guarded(self, should_stop: Callable[[], bool]) -> PollReport | None:
        """The loop's poll: one poll that never raises an ``Exception`` (``None`` when it
        failed), then the poll hooks."""
        # observability: one span per poll of the loop, its statements and hooks inside
        with replica_scope(self.replica_id), self.observer.poll(self.name, str(self.mode)) as observed:
            report = self._poll_unobserved(should_stop)
            if report is None:
                observed.failed(self.health.last_error)
            else:
                observed.completed(report)
            return report

    def _poll_unobserved(self, should_stop: Callable[[], bool]) -> PollReport | None:
        self.pacing.poll_starts()  # this poll sees every row committed before its claim
        report: PollReport | None = None
        started = time.perf_counter()
        try:
            report = self.poll_once(should_stop)
            if self.mode is SchedulerMode.PROMPT and not is_full(report, self.batch_size):
                # After the claim's time, not the clock's now: a row that fell due while
                # the poll ran is then the next due (at once), not missed for an interval.
                self.pacing.next_due = self.read_next_due(after=self.last_claimed_at)
        except Exception as exc:
            # REQ-0067: an exception escaping the poll is caught here and the loop goes on.
            logger.exception("%s: poll failed; the loop continues", self.name)
            self.health.poll_failed(error_text(exc), self.clock.now())
            report = None
            # What we knew of the next trigger may be stale; a failed poll waits the whole
            # interval (no hot loop against a database that is down).
            self.pacing.next_due = None
        else:
            self.health.poll_completed()
        self.last_poll_seconds = time.perf_counter() - started  # wall time, for the metrics
        self._run_poll_hooks()
        self.state.changed()
        return report

    def _run_poll_hooks(self) -> None:
        for hook in self.poll_hooks:
            try:
                hook(self)
            except Exception:
                logger.exception("%s: a poll hook failed", self.name)

    def read_next_due(self, after: datetime | None = None) -> datetime | None:
        """The earliest pending ``trigger_at`` after ``after`` (default: now), from the pending index."""
        with self.sessions.begin() as session:
            return self.database.events.next_pending_trigger(session, after or self.clock.now())

    # -- pacing and wake-ups --------------------------------------------------------------

    @property
    def next_due(self) -> datetime | None:
        """The next pending ``trigger_at``, as the last poll read it (prompt mode)."""
        return self.pacing.next_due

    @next_due.setter
    def next_due(self, value: datetime | None) -> None:
        self.pacing.next_due = value

    @property
    def waiting_until(self) -> datetime | None:
        """Prompt mode: the clock time the current wait ends at, if a trigger bounds it."""
        return self.pacing.waiting_until

    @property
    def waiting(self) -> bool:
        """Whether the loop is between polls."""
        return self.state.waiting

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (checked after every poll and at the start and
        end of every wait), or ``timeout`` seconds pass; return whether it holds."""
        return self.state.wait_for(predicate, timeout)

    def announce(self, trigger_at: datetime | None) -> None:
        """A row became pending with ``trigger_at`` (``None``: something may have changed,
        look now). Thread-safe; the listener calls it for every replica's NOTIFY. Literal
        mode ignores it: REQ-0065 polls on its interval only."""
        if self.mode is SchedulerMode.PROMPT:
            self.pacing.announce(trigger_at)

    def announce_notified(self, payload: str) -> None:
        """A NOTIFY from any replica's store (DUE_CHANNEL): its payload is the pending row's
        trigger time; an unreadable one means look now (a poll costs little)."""
        try:
            trigger_at: datetime | None = datetime.fromisoformat(payload) if payload else None
        except ValueError:
            trigger_at = None
        self.announce(trigger_at)

    def recheck(self) -> None:
        """Interrupt the current wait so that it re-reads the clock (e.g. after a manual
        clock moved): it polls if a deadline has passed, else goes on waiting."""
        self.pacing.recheck()

    def wait_seconds(self, real_deadline: float) -> float:
        """How long the loop would wait now before its next poll (0: poll now), given the
        ``time.monotonic()`` at which its interval ends."""
        return self.pacing.wait_seconds(self.mode, self.clock, real_deadline)

    # -- running --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set. Literal mode waits ``poll_seconds`` after every poll
        (REQ-0065); prompt mode polls again at once after a full batch and otherwise waits
        for the earliest of the interval, the next pending trigger and a wake-up. Every wait
        is on ``stop`` itself, so shutdown is immediate however long the wait."""
        await self.run_loop(AsyncioWaits(stop))

    def run_blocking(self, stop: threading.Event) -> None:
        """The same loop for a thread of its own (benchmarks, worker processes, the
        simulation), returning once ``stop`` is set (``ThreadWaits``)."""
        run_to_completion(self.run_loop(ThreadWaits(stop, lambda: self.mode)))

    async def run_loop(self, waits: Waits) -> None:
        """Poll until stopped, over one runner's ``waits`` (``core.runner``). Literal mode waits
        ``poll_seconds`` after every poll (REQ-0065); prompt mode polls again at once after a
        full batch and otherwise waits for the earliest of the interval, the next pending
        trigger and a wake-up."""
        self.health.started(self.clock.now())
        self.pacing.attach(waits.interrupt)
        try:
            while not waits.stopped():
                report = await waits.poll(self.poll_guarded)
                if waits.stopped():
                    break
                if polls_again_at_once(self.mode, self.batch_size, report):
                    await waits.yield_to_loop()
                    continue
                real_deadline = time.monotonic() + interval_after(self.mode, self.poll_seconds, report)
                while not waits.stopped():
                    waits.clear()
                    seconds = self.pacing.wait_seconds(self.mode, self.clock, real_deadline)
                    if seconds <= 0:
                        break
                    self.state.changed(waiting=True)
                    if not await waits.wait(seconds) and self.mode is SchedulerMode.LITERAL:
                        break  # the interval is over (a literal wait is bounded by nothing else)
                self.state.changed(waiting=False)
        finally:
            self.pacing.attach(None)
            self.pacing.waiting_until = None
            self.health.running = False
            self.state.changed(waiting=False)

    def is_stale(self, now: datetime) -> bool:
        """True when no poll completed within three poll intervals."""
        return self.health.is_stale(now, self.poll_seconds)

