"""A poll's data: the claimed rows, the open batch, each event's outcome, the poll's report."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.orm import Session

from scheduler.database.events import EventRepository
from scheduler.types import DigitalTwinEvent, EventStatus, OutboundMessage

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
    status: EventStatus  # dispatched or failed; expired for a row the claim ended (EXP-2)
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


def dispatched(event: ClaimedEvent, now: datetime) -> EventOutcome:
    """The outcome of an event its dispatcher ran through."""
    return EventOutcome(event.id, EventStatus.DISPATCHED, None, event.event_type, event.trigger_at, now)


def failed(event: ClaimedEvent, error: str, now: datetime) -> EventOutcome:
    """A failed outcome; its row is written with the others when the batch finishes."""
    return EventOutcome(event.id, EventStatus.FAILED, error, event.event_type, event.trigger_at, now)


def expired(row_id: str, event_type: str, trigger_at: datetime, error: str, now: datetime) -> EventOutcome:
    """A row the claim found past its ``expires_at`` and ended ``expired`` in its own statement
    (never dispatched, nothing to record at the batch's end)."""
    return EventOutcome(row_id, EventStatus.EXPIRED, error, event_type, trigger_at, now)


def outcome_parameters(outcomes: list[EventOutcome]) -> dict[str, list[Any]]:
    """The ``record_outcomes`` arrays: one element per event, in the batch's order."""
    return {
        "ids": [o.id for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "errors": [o.error for o in outcomes],
        "times": [o.finished_at for o in outcomes],
    }


class BatchStrategy(Protocol):
    """How a batch's events run and how it commits: the batch's one owner, chosen at its first
    dispatch (``core.isolation.choose_strategy``), keeping its working state to itself."""

    # whether the batch was decided whole at its first dispatch (``core.set_based``)
    decided_whole: bool

    def dispatch_next(self, batch: Batch) -> EventOutcome | None:
        """Run the batch's next event (there is one), recording its outcome in ``batch``."""

    def commit(self, batch: Batch) -> None:
        """Write what the batch has not written yet and COMMIT (the caller closes the session)."""

    def former_fields(self) -> dict[str, Any]:
        """What the batch's deprecated fields of strategy state read now (``Batch.checkpoint``...):
        the values the shared batch held when this strategy's state lived there."""


# The batch's fields of strategy state before a strategy owned them (deprecated), as they read
# before its first dispatch; each strategy's ``former_fields`` overrides those it holds.
FORMER_FIELDS: dict[str, Any] = {"checkpoint": None, "checkpoint_position": 0, "checkpoint_outbound": 0,
                                  "planned": None, "set_write": None, "recorded": 0, "per_event": None}


@dataclass
class Batch:
    """An open poll: a transaction holding the claimed rows' locks, and what its events became."""

    session: Session
    events: list[ClaimedEvent]
    claimed_at: datetime
    # Rows the claim locked but left alone because their participant was busy elsewhere:
    # untouched (still pending, no error); the commit releases them for a later poll.
    skipped: list[str] = field(default_factory=list)
    # Rows the claim ended ``expired`` (claimed after their expires_at, EXP-2): written by the
    # claim's own statement, they take no batch slot and commit (or roll back) with the batch.
    expired: list[EventOutcome] = field(default_factory=list)
    position: int = 0  # the next event to dispatch
    outcomes: list[EventOutcome] = field(default_factory=list)
    outbound: list[OutboundMessage] = field(default_factory=list)  # leaves after the commit
    closed: bool = False
    replayed: int = 0  # dispatcher calls repeated after a failure rolled back to the checkpoint
    # The poll's stop (``Scheduler.poll_once``): asked between events on every path (DEC-7.1).
    should_stop: Callable[[], bool] | None = None
    # The stop was honoured: the events from ``position`` on were never reached (or were
    # rolled back unrecorded) and the commit releases them pending; nothing more runs.
    stopped: bool = False
    # Who runs the events and commits (``None`` until the first dispatch: the commit of a
    # batch never dispatched writes its outcomes, if any, and commits).
    strategy: BatchStrategy | None = None
    # The statements the batch's commit sends (its outcomes, a set-based write), naming the
    # schema of the loop's ``Database`` (the claim passes it; the default schema's otherwise).
    events_repository: EventRepository = field(default_factory=EventRepository.of)

    @property
    def remaining(self) -> int:
        """Events still to dispatch: none once the batch stopped."""
        return 0 if self.stopped else len(self.events) - self.position

    @property
    def decided_whole(self) -> bool:
        """Whether the batch was decided whole at its first dispatch and still is (set-based,
        not fallen back to the per-event path)."""
        return self.strategy is not None and self.strategy.decided_whole

    # -- deprecated: the strategy's working state, read through the batch (CHANGELOG.md) ------

    def _former(self, name: str) -> Any:
        warnings.warn(f"Batch.{name} is deprecated: a batch's working state is its strategy's "
                      f"(Batch.strategy, Batch.decided_whole)", DeprecationWarning, stacklevel=3)
        fields = FORMER_FIELDS if self.strategy is None else self.strategy.former_fields()
        return fields[name]

    @property
    def checkpoint(self) -> Any:
        """Deprecated: the transaction the optimistic checkpoint was taken in, if one is open."""
        return self._former("checkpoint")

    @property
    def checkpoint_position(self) -> int:
        """Deprecated: the first event the optimistic checkpoint covers."""
        return int(self._former("checkpoint_position"))

    @property
    def checkpoint_outbound(self) -> int:
        """Deprecated: how much outbound the batch had when the checkpoint was taken."""
        return int(self._former("checkpoint_outbound"))

    @property
    def planned(self) -> list[tuple[EventOutcome, list[OutboundMessage]]] | None:
        """Deprecated: the set-based decisions (empty once the batch runs per event)."""
        value: list[tuple[EventOutcome, list[OutboundMessage]]] | None = self._former("planned")
        return value

    @property
    def set_write(self) -> tuple[str, dict[str, Any]] | None:
        """Deprecated: the set-based write, until it was sent."""
        value: tuple[str, dict[str, Any]] | None = self._former("set_write")
        return value

    @property
    def recorded(self) -> int:
        """Deprecated: how many outcomes the set-based write records."""
        return int(self._former("recorded"))

    @property
    def per_event(self) -> tuple[Any, Any, str] | None:
        """Deprecated: the dispatcher, clock and replica name of the set-based batch's fallback."""
        value: tuple[Any, Any, str] | None = self._former("per_event")
        return value


@dataclass(frozen=True)
class PollReport:
    claimed: int
    outcomes: tuple[EventOutcome, ...]
    skipped: int = 0  # rows of busy participants, left pending
    # rows the claim ended expired (no batch slot, never dispatched: EXP-2, DEC-EXPIRY)
    expired: tuple[EventOutcome, ...] = ()

    @property
    def dispatched(self) -> int:
        return sum(o.status == EventStatus.DISPATCHED for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == EventStatus.FAILED for o in self.outcomes)
