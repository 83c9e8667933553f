"""One poll (REQ-0065 to REQ-0067): claim, dispatch each event through the batch's strategy,
commit, publish what was delivered.

- ``claim_rounds``: lock up to a batch of due pending rows whose participants are free
  (DEC-2). A row whose participant's advisory lock is held elsewhere (another batch, a live
  event, an operator) is left exactly as it is: still pending, no error, no effect; the claim
  takes a further round past such rows, so a busy participant at the head of the queue does
  not empty the batch. One round is one statement, the row locks and the participants'
  try-locks together (``claim_due_events``), sent with the transaction's BEGIN in one round
  trip (DEC-1, ``database.pipeline``); it ends rows claimed after their ``expires_at``
  ``expired`` (EXP-2): they come back marked, take no batch slot, and are never dispatched;
- ``open_batch``: the claim's transaction, holding the rows it locked;
- ``Batch``: the poll's private object, the claim and the record of what its events became;
  its strategy (``core.strategies``) returns what each step did and the batch keeps it, and
  the batch alone asks the poll's stop (``stop_requested``, DEC-7.1);
- ``Batch.commit`` and ``Batch.abort``: the batch's end, releasing its locks;
- ``publish_committed``: what a committed batch delivered leaves the process;
- ``SchedulerHealth``: the counters ``GET /health/scheduler`` reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from scheduler.core.store import BEFORE_EVERY_TRIGGER
from scheduler.core.strategies import Done, Ran, Strategy, choose_strategy, commit_outcomes
from scheduler.database.engine import polling
from scheduler.database.events import EventRepository
from scheduler.types import (
    BulkPublisher,
    ClaimedEvent,
    Clock,
    Dispatcher,
    EventOutcome,
    OutboundMessage,
    PollReport,
    Publisher,
)

logger = logging.getLogger(__name__)

# The start of the claim's keyset: before every row, whatever its trigger_at (the storable
# range starts long after it, and no row Python can read sorts before it), so every due row
# is claimable (DEC-TRIGGER).
_BEFORE_ALL = (BEFORE_EVERY_TRIGGER, "")


def claim_params(now: datetime, batch_size: int) -> dict[str, Any]:
    """The bind parameters of a claim's first round (benchmarks and plan tests use them too)."""
    return {"now": now, "batch_size": batch_size, "after_due": _BEFORE_ALL[0],
            "after_id": _BEFORE_ALL[1], "busy": []}


def claim_rounds(session: Session, now: datetime, batch_size: int,
                 events_repository: EventRepository) -> tuple[list[ClaimedEvent], list[str], list[EventOutcome]]:
    """Lock up to ``batch_size`` rows due at ``now``, oldest first, in ``session``'s
    transaction, never waiting for a lock; return them, the ids of the rows skipped
    because their participant was busy, and the rows the claim ended expired."""
    busy: set[str] = set()
    events: list[ClaimedEvent] = []
    skipped: list[str] = []
    ended: list[EventOutcome] = []
    after = _BEFORE_ALL
    # Rounds go on until the batch is full or nothing more is due: however many participants
    # are busy at the head of the queue, the rest of the batch goes ahead (BUSY-1, DEC-2).
    # This ends: each further round starts after the last row seen (no row is read twice) and
    # follows a round that skipped rows, i.e. found at least one participant busy for the first
    # time (rows of known busy participants are excluded), so a poll takes at most one round
    # per busy participant, plus one.
    while True:
        wanted = batch_size - len(events)
        params = {**claim_params(now, wanted), "after_due": after[0], "after_id": after[1],
                  "busy": sorted(busy)}
        returned = events_repository.claim(session, params)
        ended.extend(EventOutcome.expired(r["id"], r["event_type"], r["trigger_at"], r["last_error"], now)
                     for r in returned if r["expired"])
        rows = [r for r in returned if not r["expired"]]
        if not rows:
            break
        # the keyset is the claim's order: due_at (trigger_at, or a held row's not_before)
        after = (rows[-1]["due_at"], rows[-1]["id"])
        round_skipped = 0
        for r in rows:
            if not r["held"]:
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
                    not_before=r["not_before"],
                )
            )
        # Fewer rows than asked: nothing more is due. None skipped: the batch is full.
        if len(rows) < wanted or round_skipped == 0:
            break
    return events, skipped, ended


def open_batch(sessions: sessionmaker[Session], now: datetime, batch_size: int,
               events_repository: EventRepository) -> Batch:
    """The claim's transaction (its connection, used a moment ago, not pinged first) holding
    the rows ``claim_rounds`` locked, as the poll's ``Batch``; rolled back if the claim fails."""
    session = sessions()
    try:
        with polling():
            session.connection()
        events, skipped, ended = claim_rounds(session, now, batch_size, events_repository)
    except BaseException:
        session.rollback()
        session.close()
        raise
    return Batch(session=session, events=events, claimed_at=now, skipped=skipped, expired=ended,
                 events_repository=events_repository)


@dataclass(eq=False)
class Batch:
    """An open poll: a transaction holding the claimed rows' locks, and what its events became.
    The poll's own object (``Scheduler``'s phases hand it around): nothing outside the poll
    writes into it."""

    session: Session
    events: list[ClaimedEvent]
    claimed_at: datetime
    # Rows the claim locked but left alone because their participant was busy elsewhere:
    # untouched (still pending, no error); the commit releases them for a later poll.
    skipped: list[str] = field(default_factory=list)
    # Rows the claim ended ``expired`` (claimed after their expires_at, EXP-2): written by the
    # claim's own statement, they take no batch slot and commit (or roll back) with the batch.
    expired: list[EventOutcome] = field(default_factory=list)
    # The poll's stop (``Scheduler.poll_once``), asked by ``stop_requested`` only.
    should_stop: Callable[[], bool] | None = None
    position: int = 0  # the next event to dispatch
    replayed: int = 0  # dispatcher calls repeated after a failure rolled back to the checkpoint
    # The stop was honoured: the events from ``position`` on were never reached (or were
    # rolled back unrecorded) and the commit releases them pending; nothing more runs.
    stopped: bool = False
    closed: bool = False
    # Who runs the events and commits (``None`` until the first dispatch: the commit of a
    # batch never dispatched commits, with the outcomes of its record if any).
    strategy: Strategy | None = None
    record: list[Done] = field(default_factory=list)  # each event's outcome and outbound, in order
    # The statements the batch's commit sends (its outcomes, a set-based write), naming the
    # schema of the loop's ``Database`` (the claim passes it; the default schema's otherwise).
    events_repository: EventRepository = field(default_factory=EventRepository.of)

    @property
    def outcomes(self) -> list[EventOutcome]:
        return [outcome for outcome, _ in self.record]

    @property
    def outbound(self) -> list[OutboundMessage]:
        """What the batch delivered: it leaves after the commit."""
        return [message for _, messages in self.record for message in messages]

    @property
    def remaining(self) -> int:
        """Events still to dispatch: none once the batch stopped."""
        return 0 if self.stopped else len(self.events) - self.position

    @property
    def decided_whole(self) -> bool:
        """Whether the batch was decided whole at its first dispatch and still is (set-based,
        not fallen back to the per-event path)."""
        return self.strategy is not None and self.strategy.decided_whole

    def stop_requested(self) -> bool:
        """Whether the poll's stop has arrived: the one place it is asked, between every two
        events of the first pass (``Scheduler.poll_once``), of a replay and of a fallback, and
        between the events' rules of a batch decided whole (DEC-7, DEC-7.1)."""
        return self.should_stop is not None and self.should_stop()

    def dispatch_next(self, dispatcher: Dispatcher, clock: Clock, name: str) -> EventOutcome | None:
        """Dispatch the next claimed event, isolated from the others; ``None`` when none is left
        (a stop may end the batch early: the events not reached stay pending, DEC-7).

        The strategy, with ``dispatcher``, ``clock`` and ``name``, is chosen at the batch's first
        dispatch and runs the batch to its end: a dispatcher set on the scheduler mid-batch takes
        effect from the next batch."""
        if self.closed:
            raise RuntimeError("batch already finished")
        if self.remaining == 0:
            return None
        if self.strategy is None:
            self.strategy = choose_strategy(self.session, self.events, dispatcher, clock, name, self.stop_requested,
                                            self.events_repository)
        ran = self.strategy.run(self.session, self.events, self.position, self.stop_requested)
        self._keep(ran)
        return None if ran.stopped or not ran.done else ran.done[-1][0]

    def _keep(self, ran: Ran) -> None:
        del self.record[ran.start:]
        self.record.extend(ran.done)
        self.position = ran.start + len(ran.done)
        self.stopped = ran.stopped
        self.replayed += ran.replayed
        if ran.owner is not None:
            self.strategy = ran.owner

    def commit(self) -> PollReport:
        """Record the batch's outcomes and commit, releasing its locks.

        Events not yet dispatched (a stop arrived mid-batch) were never touched, so committing
        releases them still ``pending`` for the next poll."""
        if self.closed:
            raise RuntimeError("batch already finished")
        self.closed = True
        try:
            if self.strategy is None:
                commit_outcomes(self.session, self.outcomes, self.events_repository)
            else:
                self._keep(self.strategy.commit(self.session, self.events, self.record, self.stop_requested))
        except BaseException:
            self.session.rollback()
            raise
        finally:
            self.session.close()
        return PollReport(len(self.events), tuple(self.outcomes), len(self.skipped), tuple(self.expired))

    def abort(self) -> None:
        """Roll the batch back: every claimed row is pending again and its effects vanish."""
        if self.closed:
            return
        self.closed = True
        try:
            self.session.rollback()
        finally:
            self.session.close()


def publish_committed(publisher: Publisher | None, messages: Sequence[OutboundMessage], name: str) -> None:
    """Push ``messages`` (their batch has committed); a failure is logged, never retried. A
    ``BulkPublisher`` gets them in one call, any other publisher one message at a time."""
    if publisher is None or not messages:
        return
    if isinstance(publisher, BulkPublisher):
        # One call for the batch (the inbox numbers a whole batch in one transaction);
        # it isolates its own per-message failures.
        try:
            publisher.publish_many(messages)
        except Exception:
            logger.exception("%s: publishing %d notifications failed", name, len(messages))
        return
    for message in messages:
        try:
            publisher.publish(message)
        except Exception:
            # Already committed and recorded: a push that fails is logged, not retried.
            logger.exception("%s: publishing notification %s failed", name, message.notification_id)


@dataclass
class SchedulerHealth:
    """Counters and times of one replica's loop, updated by the loop's own thread; what
    ``GET /health/scheduler`` reports (the rows stay the real record)."""

    running: bool = False
    started_at: datetime | None = None
    last_poll_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    polls: int = 0
    dispatched: int = 0
    failed: int = 0
    expired: int = 0  # rows this replica's claims ended expired (EXP-2)
    consecutive_failures: int = 0  # polls that failed since the last one that completed
    skipped: int = 0  # rows left pending because their participant was busy

    def started(self, now: datetime) -> None:
        self.running = True
        self.started_at = now

    def committed(self, report: PollReport, now: datetime) -> None:
        """A poll's batch committed at ``now``."""
        self.polls += 1
        self.skipped += report.skipped
        self.last_poll_at = now
        self.dispatched += report.dispatched
        self.failed += report.failed
        self.expired += len(report.expired)

    def poll_failed(self, error: str, now: datetime) -> None:
        self.last_error = error
        self.last_error_at = now
        self.consecutive_failures += 1

    def poll_completed(self) -> None:
        self.consecutive_failures = 0

    def is_stale(self, now: datetime, poll_seconds: float) -> bool:
        """True when no poll completed within three poll intervals."""
        reference = self.last_poll_at or self.started_at
        if reference is None:
            return False
        return now - reference > timedelta(seconds=3 * max(poll_seconds, 1.0))

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
            "expired": self.expired,
            "consecutive_failures": self.consecutive_failures,
            "skipped_busy": self.skipped,
        }
