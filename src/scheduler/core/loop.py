"""The scheduler loop (REQ-0065 to REQ-0067), split into phases a harness can step.

A poll is ``claim`` → ``dispatch_next`` (once per claimed event) → ``finish``.
Production runs them back to back; the simulation interleaves them across replicas.

Isolation. The claim's row locks (``FOR UPDATE SKIP LOCKED``) must be held until each
row's new status commits, and that status must commit together with the event's effects
(notifications, deliveries, deduplication keys). So a batch is one transaction, and the
outcome of every event is exactly what it would be if every event ran inside its own
SAVEPOINT: whatever an event raises, a Python error or a database error that aborts the
statement, only its own work is rolled back, its row ends ``failed`` with the error, and
the next event starts on a healthy transaction.

Cost. A savepoint per event is two extra round trips per event, paid for the rare event
that fails. So the batch runs optimistically: one savepoint (the *checkpoint*) is taken
before the first event, and events run under it without savepoints of their own. When an
event fails (or is refused), the transaction rolls back to the checkpoint, which undoes
the work of every event since it (the claim's row and participant locks were taken before
the checkpoint, so they stay held), and those events are replayed, each in its own
savepoint, with the time they first ran; then the failing event runs once more in its own
savepoint, where it fails alone exactly as it would have the first time. The next event
takes a fresh checkpoint. The dispatcher must therefore be safe to call again for an
event whose first call was rolled back: everything it writes goes through the session it
is handed, and nothing leaves the process before the batch commits (``Dispatcher``).
The outcomes are kept in memory and written with one statement when the batch finishes,
just before its commit (DEC-1 in ``specs/decisions.md``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio.to_thread
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from scheduler.core.participant_locks import participant_lock_key, try_lock_participants
from scheduler.database.queries import statement
from scheduler.observability.observer import Observer
from scheduler.types import (
    Clock,
    DigitalTwinEvent,
    Dispatcher,
    EventStatus,
    OutboundMessage,
    Publisher,
    SchedulerMode,
)

logger = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 4000

# The NOTIFY channel on which the database announces a row that became pending, with its
# trigger_at (migration 0005's trigger; prompt-mode replicas listen).
DUE_CHANNEL = "scheduler_due"

# A claim that finds busy participants takes further rounds past them, at most this many,
# so that one participant's held lock cannot empty the batch (DEC-2).
MAX_CLAIM_ROUNDS = 4

# Prompt mode: how soon to look again after a poll left rows of busy participants behind.
BUSY_RETRY_SECONDS = 0.5

# run_blocking in prompt mode checks its stop event at least this often.
STOP_SLICE_SECONDS = 0.02

# The start of the claim's keyset: before every row.
_BEFORE_ALL = (datetime(1, 1, 2, tzinfo=UTC), "")


def claim_params(now: datetime, batch_size: int) -> dict[str, Any]:
    """The bind parameters of a claim's first round (benchmarks and plan tests use them too)."""
    return {"now": now, "batch_size": batch_size, "after_trigger": _BEFORE_ALL[0],
            "after_id": _BEFORE_ALL[1], "busy": []}


def error_text(exc: BaseException) -> str:
    """``last_error`` for an exception: its type and message, storable in a text column."""
    message = f"{type(exc).__name__}: {exc}".replace("\x00", "\\0")
    return message[:MAX_ERROR_LENGTH]


@dataclass(frozen=True)
class ClaimedEvent:
    """A row taken by a claim, locked until its batch ends."""

    id: str
    event_type: str
    user_id: str
    community_id: str | None
    trigger_at: datetime
    facts: dict[str, Any]
    traceparent: str | None = None  # the storing request's trace context (observability)

    def as_event(self) -> DigitalTwinEvent:
        """The stored facts become a DigitalTwinEvent, exactly as a live event would (REQ-0066)."""
        return DigitalTwinEvent(
            event_type=self.event_type,
            user_id=self.user_id,
            community_id=self.community_id,
            facts=self.facts,
            scheduled_event_id=self.id,
        )


@dataclass(frozen=True)
class EventOutcome:
    """What one claimed event became, with what metrics need (its type and lateness)."""

    id: str
    status: EventStatus  # dispatched or failed
    error: str | None = None
    event_type: str = ""
    trigger_at: datetime | None = None
    finished_at: datetime | None = None  # the injected clock's time of the outcome

    @property
    def lateness(self) -> timedelta | None:
        """``dispatched_at - trigger_at`` for a dispatched event (the user's measure)."""
        if self.status != EventStatus.DISPATCHED or self.trigger_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.trigger_at


def outcome_parameters(outcomes: list[EventOutcome]) -> dict[str, list[Any]]:
    """The ``record_outcomes`` arrays: one element per event, in the batch's order."""
    return {
        "ids": [o.id for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "errors": [o.error for o in outcomes],
        "times": [o.finished_at for o in outcomes],
    }


@dataclass
class Batch:
    """An open poll: a transaction holding the claimed rows' locks."""

    session: Session
    events: list[ClaimedEvent]
    claimed_at: datetime
    # Rows the claim locked but left alone because their participant was busy elsewhere:
    # untouched (still pending, no error); the commit releases them for a later poll.
    skipped: list[str] = field(default_factory=list)
    position: int = 0
    outcomes: list[EventOutcome] = field(default_factory=list)
    outbound: list[OutboundMessage] = field(default_factory=list)
    closed: bool = False
    # The optimistic run: the savepoint the events since ``checkpoint_position`` ran under
    # without savepoints of their own, and how much outbound they had produced.
    checkpoint: SessionTransaction | None = None
    checkpoint_position: int = 0
    checkpoint_outbound: int = 0
    replayed: int = 0  # dispatcher calls repeated after a failure rolled back to the checkpoint

    @property
    def remaining(self) -> int:
        return len(self.events) - self.position


@dataclass(frozen=True)
class PollReport:
    claimed: int
    outcomes: tuple[EventOutcome, ...]
    skipped: int = 0  # rows of busy participants, left pending

    @property
    def dispatched(self) -> int:
        return sum(o.status == EventStatus.DISPATCHED for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == EventStatus.FAILED for o in self.outcomes)


@dataclass
class SchedulerHealth:
    """What ``GET /health/scheduler`` reports; the row's status stays the real record."""

    running: bool = False
    started_at: datetime | None = None
    last_poll_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    polls: int = 0
    dispatched: int = 0
    failed: int = 0
    consecutive_failures: int = 0  # polls that failed since the last one that completed
    skipped: int = 0  # rows left pending because their participant was busy

    def snapshot(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "running": self.running,
            "started_at": iso(self.started_at),
            "last_poll_at": iso(self.last_poll_at),
            "last_error": self.last_error,
            "last_error_at": iso(self.last_error_at),
            "polls": self.polls,
            "dispatched": self.dispatched,
            "failed": self.failed,
            "consecutive_failures": self.consecutive_failures,
            "skipped_busy": self.skipped,
        }


class Scheduler:
    """Polls for due events and dispatches each through ``dispatcher``.

    ``sessions`` gives this replica its connections; ``clock`` is the only source of
    ``:now``; ``publisher`` receives delivered notifications after their batch commits.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
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
        self.sessions = sessions
        self.dispatcher = dispatcher
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
        # Prompt mode's wake-ups: the earliest trigger_at another replica announced, and
        # how to interrupt the current wait (set while run or run_blocking waits).
        self._wake_lock = threading.Lock()
        self._announced: datetime | None = None
        self._interrupt: Callable[[], None] | None = None
        self.next_due: datetime | None = None  # the next pending trigger_at, as last read
        self.last_claimed_at: datetime | None = None  # the clock time of the last claim
        self.waiting_until: datetime | None = None  # prompt mode: the wait's clock deadline
        # Observable state for tests, the simulation and health: whether the loop is
        # between polls, announced on a condition so that nobody has to sleep to see it.
        self.waiting = False
        self._state = threading.Condition()
        self.last_poll_seconds: float | None = None  # how long the last poll of the loop took
        # Observability (issue 17): spans around each poll and each event's dispatch, and
        # the event id in log lines; the service sets a tracing observer when tracing is on.
        self.observer: Observer = Observer()

    # -- phases -------------------------------------------------------------------------

    def claim(self) -> Batch:
        """Open a transaction and lock up to ``batch_size`` due pending rows, oldest first,
        whose participants' locks are free; never wait for a lock (DEC-2).

        A row whose participant's advisory lock is held elsewhere (another batch, a live
        event, an operator) is left exactly as it is: still pending, no error, no effect.
        The claim then takes a further round past such rows, so a busy participant at the
        head of the queue does not empty the batch.
        """
        now = self.clock.now()
        self.last_claimed_at = now
        session = self.sessions()
        try:
            events, skipped = self._claim_rounds(session, now)
        except BaseException:
            session.rollback()
            session.close()
            raise
        return Batch(session=session, events=events, claimed_at=now, skipped=skipped)

    def _claim_rounds(self, session: Session, now: datetime) -> tuple[list[ClaimedEvent], list[str]]:
        held: set[int] = set()
        busy: set[str] = set()
        events: list[ClaimedEvent] = []
        skipped: list[str] = []
        after = _BEFORE_ALL
        for _ in range(MAX_CLAIM_ROUNDS):
            wanted = self.batch_size - len(events)
            params = {**claim_params(now, wanted), "after_trigger": after[0], "after_id": after[1],
                      "busy": sorted(busy)}
            rows = session.execute(statement("claim_due_events"), params).mappings().all()
            if not rows:
                break
            after = (rows[-1]["trigger_at"], rows[-1]["id"])
            keys = {participant_lock_key(r["user_id"]) for r in rows}
            held |= try_lock_participants(session, keys - held)
            round_skipped = 0
            for r in rows:
                if participant_lock_key(r["user_id"]) not in held:
                    busy.add(r["user_id"])
                    skipped.append(r["id"])
                    round_skipped += 1
                    continue
                events.append(
                    ClaimedEvent(
                        id=r["id"],
                        event_type=r["event_type"],
                        user_id=r["user_id"],
                        community_id=r["community_id"],
                        trigger_at=r["trigger_at"],
                        facts=dict(r["facts"]),
                        traceparent=r["traceparent"],
                    )
                )
            # Fewer rows than asked: nothing more is due. None skipped: the batch is full.
            if len(rows) < wanted or round_skipped == 0:
                break
        return events, skipped

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        """Dispatch the next claimed event, isolated from the others; ``None`` when none is left.

        The event runs under the batch's checkpoint; if it fails, the events since the
        checkpoint are replayed one savepoint each and it runs again in its own (see the
        module docstring), so its outcome is the one a savepoint of its own would give.
        """
        if batch.closed:
            raise RuntimeError("batch already finished")
        if batch.remaining == 0:
            return None
        event = batch.events[batch.position]
        batch.position += 1
        now = self.clock.now()
        if batch.checkpoint is None or not batch.checkpoint.is_active:
            batch.checkpoint = batch.session.begin_nested()
            batch.checkpoint_position = batch.position - 1
            batch.checkpoint_outbound = len(batch.outbound)
        checkpoint = batch.checkpoint
        try:
            result = self.dispatcher(batch.session, event.as_event(), now)
            if not checkpoint.is_active:
                raise RuntimeError("the dispatcher ended the transaction it was handed")
        except Exception as exc:
            if isinstance(exc, DBAPIError) and exc.connection_invalidated:
                # The connection is gone (a database restart, a terminated backend): this is
                # no fault of the event, and nothing can be recorded on this transaction. Let
                # the poll fail whole with the real cause; the rows are pending again.
                raise
            first_error = error_text(exc)
        else:
            if result.refusal is None:
                batch.outbound.extend(result.outbound)
                outcome = EventOutcome(event.id, EventStatus.DISPATCHED, None, event.event_type, event.trigger_at, now)
                batch.outcomes.append(outcome)
                return outcome
            first_error = result.refusal
        outcome = self._replay(batch, event, now, first_error)
        batch.outcomes.append(outcome)
        return outcome

    def _replay(self, batch: Batch, event: ClaimedEvent, now: datetime, first_error: str) -> EventOutcome:
        """``event`` failed under the checkpoint: roll back to it, replay the events since it
        one savepoint each, then run ``event`` again in a savepoint of its own."""
        checkpoint, batch.checkpoint = batch.checkpoint, None
        if checkpoint is None or not checkpoint.is_active:
            # The dispatcher committed or rolled back the batch's transaction itself: there is
            # nothing left to roll back to, so the event is recorded failed as it stands.
            logger.error("%s: dispatch of scheduled event %s failed: %s", self.name, event.id, first_error)
            return self._mark_failed(event, first_error, now)
        checkpoint.rollback()  # ROLLBACK TO SAVEPOINT: the claim's locks predate it and stay held
        start = batch.checkpoint_position
        earlier = batch.outcomes[start:]
        logger.info("%s: scheduled event %s failed (%s); replaying the %d event(s) before it in the batch, "
                    "one savepoint each", self.name, event.id, first_error, len(earlier))
        del batch.outcomes[start:]
        del batch.outbound[batch.checkpoint_outbound:]
        for previous, outcome in zip(batch.events[start:batch.position - 1], earlier, strict=True):
            batch.outcomes.append(self._dispatch_isolated(batch, previous, outcome.finished_at or now))
        batch.replayed += len(earlier) + 1
        return self._dispatch_isolated(batch, event, now)

    def _dispatch_isolated(self, batch: Batch, event: ClaimedEvent, now: datetime) -> EventOutcome:
        """Run one event inside its own SAVEPOINT: whatever it raises, only its work is undone."""
        session = batch.session
        savepoint = session.begin_nested()
        try:
            result = self.dispatcher(session, event.as_event(), now)
            if not savepoint.is_active:
                raise RuntimeError("the dispatcher ended the transaction it was handed")
            if result.refusal is not None:
                # The sender's error: a live request would get 400/422. Nothing it wrote stays.
                savepoint.rollback()
                return self._mark_failed(event, result.refusal, now)
            savepoint.commit()
        except Exception as exc:
            if isinstance(exc, DBAPIError) and exc.connection_invalidated:
                raise
            logger.exception("%s: dispatch of scheduled event %s failed", self.name, event.id)
            if savepoint.is_active:
                savepoint.rollback()
            return self._mark_failed(event, error_text(exc), now)
        batch.outbound.extend(result.outbound)
        return EventOutcome(event.id, EventStatus.DISPATCHED, None, event.event_type, event.trigger_at, now)

    def _mark_failed(self, event: ClaimedEvent, error: str, now: datetime) -> EventOutcome:
        """A failed outcome; its row is written with the others when the batch finishes."""
        return EventOutcome(event.id, EventStatus.FAILED, error, event.event_type, event.trigger_at, now)

    def finish(self, batch: Batch) -> PollReport:
        """Record the batch's outcomes in one statement, commit (releasing its locks), then
        publish what it delivered.

        Events not yet dispatched (a stop arrived mid-batch) were never touched, so
        committing releases them still ``pending`` for the next poll.
        """
        if batch.closed:
            raise RuntimeError("batch already finished")
        batch.closed = True
        try:
            if batch.outcomes:
                batch.session.execute(statement("record_outcomes"), outcome_parameters(batch.outcomes))
            batch.session.commit()
        except BaseException:
            batch.session.rollback()
            raise
        finally:
            batch.session.close()
        report = PollReport(len(batch.events), tuple(batch.outcomes), len(batch.skipped))
        self.health.polls += 1
        self.health.skipped += report.skipped
        self.health.last_poll_at = self.clock.now()
        self.health.dispatched += report.dispatched
        self.health.failed += report.failed
        self.last_report = report
        self._publish(batch.outbound)
        return report

    def abort(self, batch: Batch) -> None:
        """Roll the batch back: every claimed row is pending again and its effects vanish."""
        if batch.closed:
            return
        batch.closed = True
        try:
            batch.session.rollback()
        finally:
            batch.session.close()

    def _publish(self, messages: list[OutboundMessage]) -> None:
        if self.publisher is None or not messages:
            return
        publish_many = getattr(self.publisher, "publish_many", None)
        if publish_many is not None:
            # One call for the batch (the inbox numbers a whole batch in one transaction);
            # it isolates its own per-message failures.
            try:
                publish_many(messages)
            except Exception:
                logger.exception("%s: publishing %d notifications failed", self.name, len(messages))
            return
        for message in messages:
            try:
                self.publisher.publish(message)
            except Exception:
                # Already committed and recorded: a push that fails is logged, not retried.
                logger.exception("%s: publishing notification %s failed", self.name, message.notification_id)

    # -- the loop -----------------------------------------------------------------------

    def poll_once(self, should_stop: Callable[[], bool] | None = None) -> PollReport:
        """One full poll. Stops between events when ``should_stop`` says so."""
        batch = self.claim()
        try:
            while batch.remaining and not (should_stop and should_stop()):
                # observability: one span per event, linked to the request that stored it
                with self.observer.dispatch(batch.events[batch.position]) as dispatched:
                    dispatched(self.dispatch_next(batch))
            return self.finish(batch)
        finally:
            self.abort(batch)

    def _poll_guarded(self, should_stop: Callable[[], bool]) -> PollReport | None:
        """One poll that never raises an ``Exception``; ``None`` when it failed."""
        # observability: one span per poll of the loop, its statements and hooks inside
        with self.observer.poll(self.name, str(self.mode)) as observed:
            report = self._poll_unobserved(should_stop)
            if report is None:
                observed.failed(self.health.last_error)
            else:
                observed.completed(report)
            return report

    def _poll_unobserved(self, should_stop: Callable[[], bool]) -> PollReport | None:
        with self._wake_lock:
            self._announced = None  # this poll sees every row committed before its claim
        report: PollReport | None = None
        started = time.perf_counter()
        try:
            report = self.poll_once(should_stop)
            if self.mode is SchedulerMode.PROMPT and not self._full(report):
                # After the claim's time, not the clock's now: a row that fell due while
                # the poll ran is then the next due (at once), not missed for an interval.
                self.next_due = self.read_next_due(after=self.last_claimed_at)
        except Exception as exc:
            # REQ-0067: an exception escaping the poll is caught here and the loop goes on.
            logger.exception("%s: poll failed; the loop continues", self.name)
            self.health.last_error = error_text(exc)
            self.health.last_error_at = self.clock.now()
            self.health.consecutive_failures += 1
            report = None
            # What we knew of the next trigger may be stale; a failed poll waits the whole
            # interval (no hot loop against a database that is down).
            self.next_due = None
        else:
            self.health.consecutive_failures = 0
        self.last_poll_seconds = time.perf_counter() - started  # wall time, for the metrics
        self._run_poll_hooks()
        self._changed()
        return report

    def _changed(self, *, waiting: bool | None = None) -> None:
        with self._state:
            if waiting is not None:
                self.waiting = waiting
            self._state.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (checked after every poll and at the start and
        end of every wait), or ``timeout`` seconds pass; return whether it holds."""
        with self._state:
            return self._state.wait_for(predicate, timeout)

    def _run_poll_hooks(self) -> None:
        for hook in self.poll_hooks:
            try:
                hook(self)
            except Exception:
                logger.exception("%s: a poll hook failed", self.name)

    def _full(self, report: PollReport) -> bool:
        return report.claimed >= self.batch_size

    def read_next_due(self, after: datetime | None = None) -> datetime | None:
        """The earliest pending ``trigger_at`` after ``after`` (default: now), from the pending index."""
        with self.sessions.begin() as session:
            value = session.execute(statement("next_pending_trigger"), {"now": after or self.clock.now()}).scalar()
        return value if isinstance(value, datetime) else None

    # -- wake-ups (prompt mode) -----------------------------------------------------------

    def announce(self, trigger_at: datetime | None) -> None:
        """A row became pending with ``trigger_at`` (``None``: something may have changed,
        look now). Thread-safe; the listener calls it for every replica's NOTIFY. Literal
        mode ignores it: REQ-0065 polls on its interval only."""
        if self.mode is not SchedulerMode.PROMPT:
            return
        when = trigger_at or datetime(1, 1, 2, tzinfo=UTC)
        with self._wake_lock:
            if self._announced is None or when < self._announced:
                self._announced = when
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def recheck(self) -> None:
        """Interrupt the current wait so that it re-reads the clock (e.g. after a manual
        clock moved): it polls if a deadline has passed, else goes on waiting."""
        with self._wake_lock:
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def _wait_seconds(self, report: PollReport | None, real_deadline: float) -> float:
        """How long to wait now before the next poll; 0 means poll now."""
        remaining = real_deadline - time.monotonic()
        if self.mode is SchedulerMode.LITERAL or remaining <= 0:
            self.waiting_until = None
            return max(remaining, 0.0)
        with self._wake_lock:
            announced = self._announced
        due = min((t for t in (self.next_due, announced) if t is not None), default=None)
        self.waiting_until = due
        if due is None:
            return remaining
        until_due = (due - self.clock.now()).total_seconds()
        return max(min(remaining, until_due), 0.0)

    def _interval_after(self, report: PollReport | None) -> float:
        """The real-time bound of the wait after a poll: the interval, or in prompt mode a
        short retry when busy participants left due rows behind."""
        if self.mode is SchedulerMode.PROMPT and report is not None and report.skipped:
            return min(self.poll_seconds, BUSY_RETRY_SECONDS)
        return self.poll_seconds

    def _polls_again_at_once(self, report: PollReport | None) -> bool:
        return self.mode is SchedulerMode.PROMPT and report is not None and self._full(report)

    def _started(self) -> None:
        self.health.running = True
        self.health.started_at = self.clock.now()

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set. Literal mode waits ``poll_seconds`` after every poll
        (REQ-0065); prompt mode polls again at once after a full batch and otherwise waits
        for the earliest of the interval, the next pending trigger and a wake-up. Every wait
        is on ``stop`` itself, so shutdown is immediate however long the wait."""
        self._started()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def interrupt() -> None:
            loop.call_soon_threadsafe(wake.set)

        with self._wake_lock:
            self._interrupt = interrupt
        # A thread limiter of its own: requests that fill the default threadpool (their
        # limiter) cannot keep a poll waiting for a thread.
        limiter = anyio.CapacityLimiter(1)
        try:
            while not stop.is_set():
                report = await anyio.to_thread.run_sync(self._poll_guarded, stop.is_set, limiter=limiter)
                if stop.is_set():
                    break
                if self._polls_again_at_once(report):
                    await asyncio.sleep(0)  # let the event loop breathe between batches
                    continue
                real_deadline = time.monotonic() + self._interval_after(report)
                while not stop.is_set():
                    wake.clear()
                    seconds = self._wait_seconds(report, real_deadline)
                    if seconds <= 0:
                        break
                    self._changed(waiting=True)
                    await _first_of(stop, wake, seconds)
                self._changed(waiting=False)
        finally:
            with self._wake_lock:
                self._interrupt = None
            self.waiting_until = None
            self.health.running = False
            self._changed(waiting=False)

    def run_blocking(self, stop: threading.Event) -> None:
        """The same loop for a thread of its own (benchmarks, worker processes).

        Literal mode waits on ``stop`` itself, once per poll. Prompt mode waits on its
        wake-up event in slices of at most ``STOP_SLICE_SECONDS``, checking ``stop`` in
        between (a thread cannot wait on two events at once).
        """
        self._started()
        wake = threading.Event()
        with self._wake_lock:
            self._interrupt = wake.set
        try:
            while not stop.is_set():
                report = self._poll_guarded(stop.is_set)
                if stop.is_set() or self._polls_again_at_once(report):
                    continue
                if self.mode is SchedulerMode.LITERAL:
                    self._changed(waiting=True)
                    stop.wait(self.poll_seconds)
                    self._changed(waiting=False)
                    continue
                real_deadline = time.monotonic() + self._interval_after(report)
                while not stop.is_set():
                    wake.clear()
                    seconds = self._wait_seconds(report, real_deadline)
                    if seconds <= 0:
                        break
                    if not self.waiting:
                        self._changed(waiting=True)
                    wake.wait(min(seconds, STOP_SLICE_SECONDS))
                self._changed(waiting=False)
        finally:
            with self._wake_lock:
                self._interrupt = None
            self.waiting_until = None
            self.health.running = False
            self._changed(waiting=False)

    def is_stale(self, now: datetime) -> bool:
        """True when no poll completed within three poll intervals."""
        reference = self.health.last_poll_at or self.health.started_at
        if reference is None:
            return False
        return now - reference > timedelta(seconds=3 * max(self.poll_seconds, 1.0))


async def _first_of(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Wait until ``stop`` or ``wake`` is set, or ``seconds`` pass."""
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())}
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()

