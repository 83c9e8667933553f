"""The scheduler loop (REQ-0065 to REQ-0067), split into phases a harness can step.

A poll is ``claim`` → ``dispatch_next`` (once per claimed event) → ``finish``.
Production runs them back to back; the simulation interleaves them across replicas.

Isolation. The claim's row locks (``FOR UPDATE SKIP LOCKED``) must be held until each
row's new status commits, and that status must commit together with the event's effects
(notifications, deliveries, deduplication keys). So a batch is one transaction and every
event runs inside its own SAVEPOINT: whatever an event raises, a Python error or a
database error that aborts the statement, only its savepoint is rolled back, the row is
marked ``failed`` by id, and the next event starts on a healthy transaction. One event
cannot poison the batch, because no event ever runs outside its own savepoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import anyio.to_thread
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from scheduler.orchestrator import lock_participants
from scheduler.queries import statement
from scheduler.types import Clock, DigitalTwinEvent, Dispatcher, OutboundMessage, Publisher

logger = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 4000


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
    status: str  # "dispatched" or "failed"
    error: str | None = None
    event_type: str = ""
    trigger_at: datetime | None = None
    finished_at: datetime | None = None  # the injected clock's time of the outcome

    @property
    def lateness(self) -> timedelta | None:
        """``dispatched_at - trigger_at`` for a dispatched event (the user's measure)."""
        if self.status != "dispatched" or self.trigger_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.trigger_at


@dataclass
class Batch:
    """An open poll: a transaction holding the claimed rows' locks."""

    session: Session
    events: list[ClaimedEvent]
    claimed_at: datetime
    position: int = 0
    outcomes: list[EventOutcome] = field(default_factory=list)
    outbound: list[OutboundMessage] = field(default_factory=list)
    closed: bool = False

    @property
    def remaining(self) -> int:
        return len(self.events) - self.position


@dataclass(frozen=True)
class PollReport:
    claimed: int
    outcomes: tuple[EventOutcome, ...]

    @property
    def dispatched(self) -> int:
        return sum(o.status == "dispatched" for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)


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
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
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
        self.last_poll_seconds: float | None = None  # how long the last poll of the loop took

    # -- phases -------------------------------------------------------------------------

    def claim(self) -> Batch:
        """Open a transaction and lock up to ``batch_size`` due pending rows, oldest first."""
        now = self.clock.now()
        session = self.sessions()
        try:
            rows = session.execute(
                statement("claim_due_events"), {"now": now, "batch_size": self.batch_size}
            ).mappings().all()
            events = [
                ClaimedEvent(
                    id=r["id"],
                    event_type=r["event_type"],
                    user_id=r["user_id"],
                    community_id=r["community_id"],
                    trigger_at=r["trigger_at"],
                    facts=dict(r["facts"]),
                )
                for r in rows
            ]
            # Take every participant lock the batch may need now, in one global order:
            # two replicas whose batches share participants then never deadlock.
            lock_participants(session, (e.user_id for e in events))
        except BaseException:
            session.rollback()
            session.close()
            raise
        return Batch(session=session, events=events, claimed_at=now)

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        """Dispatch the next claimed event inside its own savepoint; ``None`` when none is left."""
        if batch.closed:
            raise RuntimeError("batch already finished")
        if batch.remaining == 0:
            return None
        event = batch.events[batch.position]
        batch.position += 1
        now = self.clock.now()
        session = batch.session
        savepoint = session.begin_nested()
        try:
            result = self.dispatcher(session, event.as_event(), now)
            if not savepoint.is_active:
                raise RuntimeError("the dispatcher ended the transaction it was handed")
            if result.refusal is not None:
                # The sender's error: a live request would get 400/422. Nothing it wrote stays.
                savepoint.rollback()
                outcome = self._mark_failed(session, event, result.refusal, now)
            else:
                session.execute(statement("mark_dispatched"), {"id": event.id, "now": now})
                savepoint.commit()
                batch.outbound.extend(result.outbound)
                outcome = EventOutcome(event.id, "dispatched", None, event.event_type, event.trigger_at, now)
        except Exception as exc:
            if isinstance(exc, DBAPIError) and exc.connection_invalidated:
                # The connection is gone (a database restart, a terminated backend): this is
                # no fault of the event, and nothing can be recorded on this transaction. Let
                # the poll fail whole with the real cause; the rows are pending again.
                raise
            logger.exception("%s: dispatch of scheduled event %s failed", self.name, event.id)
            if savepoint.is_active:
                savepoint.rollback()
            outcome = self._mark_failed(session, event, error_text(exc), now)
        batch.outcomes.append(outcome)
        return outcome

    def _mark_failed(self, session: Session, event: ClaimedEvent, error: str, now: datetime) -> EventOutcome:
        session.execute(statement("mark_failed"), {"id": event.id, "error": error, "now": now})
        return EventOutcome(event.id, "failed", error, event.event_type, event.trigger_at, now)

    def finish(self, batch: Batch) -> PollReport:
        """Commit the batch (releasing its locks), then publish what it delivered.

        Events not yet dispatched (a stop arrived mid-batch) were never touched, so
        committing releases them still ``pending`` for the next poll.
        """
        if batch.closed:
            raise RuntimeError("batch already finished")
        batch.closed = True
        try:
            batch.session.commit()
        except BaseException:
            batch.session.rollback()
            raise
        finally:
            batch.session.close()
        report = PollReport(len(batch.events), tuple(batch.outcomes))
        self.health.polls += 1
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
        if self.publisher is None:
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
                self.dispatch_next(batch)
            return self.finish(batch)
        finally:
            self.abort(batch)

    def _poll_guarded(self, should_stop: Callable[[], bool]) -> None:
        started = time.perf_counter()
        try:
            self.poll_once(should_stop)
        except Exception as exc:
            # REQ-0067: an exception escaping the poll is caught here and the loop goes on.
            logger.exception("%s: poll failed; the loop continues", self.name)
            self.health.last_error = error_text(exc)
            self.health.last_error_at = self.clock.now()
            self.health.consecutive_failures += 1
        else:
            self.health.consecutive_failures = 0
        self.last_poll_seconds = time.perf_counter() - started  # wall time, for the metrics
        self._run_poll_hooks()

    def _run_poll_hooks(self) -> None:
        for hook in self.poll_hooks:
            try:
                hook(self)
            except Exception:
                logger.exception("%s: a poll hook failed", self.name)

    def _started(self) -> None:
        self.health.running = True
        self.health.started_at = self.clock.now()

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``poll_seconds`` until ``stop`` is set; the wait is on ``stop`` itself,
        so shutdown is immediate however long the interval (REQ-0065)."""
        self._started()
        try:
            while not stop.is_set():
                await anyio.to_thread.run_sync(self._poll_guarded, stop.is_set)
                if stop.is_set():
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_seconds)
        finally:
            self.health.running = False

    def run_blocking(self, stop: threading.Event) -> None:
        """The same loop for a thread of its own (benchmarks, worker processes)."""
        self._started()
        try:
            while not stop.is_set():
                self._poll_guarded(stop.is_set)
                stop.wait(self.poll_seconds)
        finally:
            self.health.running = False

    def is_stale(self, now: datetime) -> bool:
        """True when no poll completed within three poll intervals."""
        reference = self.health.last_poll_at or self.health.started_at
        if reference is None:
            return False
        return now - reference > timedelta(seconds=3 * max(self.poll_seconds, 1.0))
