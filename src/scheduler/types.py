"""The protocols and the values that cross a seam, in one place (as Starlette does): the
``Clock``, the ``Dispatcher`` (and the checks of what it is and returns), the ``Publisher``, a
channel's ``Sender``, what a poll hands back. What an implementation may do beyond its protocol
is declared by a base here (``DeclaredDispatcher``, ``BatchDispatcher``, ``BulkPublisher``)."""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.orm import Session


class EventStatus(StrEnum):
    """A scheduled event's status; a new member reaches the API schema, the filters and the CLI."""

    PENDING = "pending"
    DISPATCHED = "dispatched"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # claimed after its expires_at, never dispatched (EXP-2, DEC-EXPIRY)


class NotificationStatus(StrEnum):
    """A notification's status: delivered, recorded but not delivered (with a reason), or failed."""

    SENT = "sent"
    SUPPRESSED = "suppressed"
    FAILED = "failed"


class DispatchOutcome(StrEnum):
    """What the dispatch path decided for an event (only the live route makes it an HTTP status)."""

    DELIVERED = "delivered"  # at least one delivery
    SUPPRESSED = "suppressed"  # notifications recorded, every delivery suppressed
    DUPLICATE = "duplicate"  # every rule that would fire already notified for the period
    NO_RULE_TRIGGERED = "no_rule_triggered"  # the rules ran and wanted nothing
    NO_RULE_FOR_SCENARIO = "no_rule_for_scenario"  # refused: no enabled rule claims it
    INVALID_EVENT = "invalid_event"  # refused: the facts, time scope or templates do not fit
    DEFERRED = "deferred"  # held in quiet hours until ``not_before``, nothing written (QUIET-2)

    @property
    def refused(self) -> bool:
        """The event is the sender's fault: nothing it wrote stays."""
        return self in (DispatchOutcome.NO_RULE_FOR_SCENARIO, DispatchOutcome.INVALID_EVENT)


class SchedulerMode(StrEnum):
    """How the loop paces its polls (DEC-9): ``literal``, a full interval after each (REQ-0065);
    ``prompt``, again after a full batch, else at the next trigger or a replica's wake-up."""

    LITERAL = "literal"
    PROMPT = "prompt"


@runtime_checkable
class Clock(Protocol):
    """Where time comes from: the database server's in production (DEC-10), or an injected one."""

    def now(self) -> datetime:
        """An aware UTC datetime."""


@dataclass(frozen=True)
class DigitalTwinEvent:
    """An event as the rule engine sees it, whether it arrived live or from a stored row."""

    event_type: str
    user_id: str
    community_id: str | None
    facts: Mapping[str, Any]
    scheduled_event_id: str | None = None  # a stored row's, which its notifications point back to


@dataclass(frozen=True)
class OutboundMessage:
    """What a publisher pushes after commit: a notification that was delivered."""

    notification_id: str
    user_id: str
    community_id: str | None
    channel: str
    kind: str
    title: str
    body: str
    rule_id: str


@runtime_checkable
class Publisher(Protocol):
    """Pushes a notification out of the process once its transaction committed: one message at
    a time, at most once (a ``publish`` that raises is logged, never retried)."""

    def publish(self, message: OutboundMessage) -> None: ...


class BulkPublisher(Publisher):
    """A ``Publisher`` that declares it takes a committed batch's messages in one call, in order,
    and isolates its own per-message failures; ``publish`` is a batch of one unless overridden."""

    @abstractmethod
    def publish_many(self, messages: Sequence[OutboundMessage]) -> None:
        """Push a committed batch's messages, in order."""

    def publish(self, message: OutboundMessage) -> None:
        self.publish_many([message])


@dataclass
class DispatchResult:
    """What the dispatch path decided for one event: ``refusal`` (a row's ``last_error``) exactly
    when ``outcome.refused``, ``not_before`` exactly when ``DEFERRED``; ``outbound`` is published
    after the commit (at most once), ``outbox`` queued in it (at least once: OUTBOX-7)."""

    outcome: DispatchOutcome
    refusal: str | None = None
    detail: Any = None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    outbound: list[OutboundMessage] = field(default_factory=list)
    not_before: datetime | None = None
    outbox: list[OutboundMessage] = field(default_factory=list)


@runtime_checkable
class Dispatcher(Protocol):
    """Decides and records what one event becomes, in the caller's transaction (the built-in
    ``NudgingPlatform`` or a host's callable). The contract (docs/embedding.md): a plain ``def``
    in a worker thread; ``session`` is the scheduler's transaction, never committed, rolled back
    or closed by it; a ``DispatchResult`` back (anything else, or raising, fails the event alone:
    REQ-0067); once per event per poll unless declared; what leaves the process, ``outbound``."""

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult: ...


@runtime_checkable
class BatchDecisions(Protocol):
    """A batch decided set-based: one result per event (or the ``Exception`` of one that fails
    alone), and the one write that makes them true, sent with the batch's COMMIT."""

    results: list[DispatchResult | Exception]

    def write_statement(self, outcomes: dict[str, list[Any]]) -> tuple[str, dict[str, Any]]:
        """The statement (its name and parameters) that writes every decision and the batch's
        outcomes, and fails if that differs from what was decided (the caller falls back)."""


class DeclaredDispatcher(Dispatcher):
    """A ``Dispatcher`` that declares more than one call per event per poll: ``safe_to_repeat``
    (exactly ``True``: a call again after a rollback is harmless, so a batch runs under one
    checkpoint with a replay, DEC-1.4), or deciding a batch whole (``BatchDispatcher``)."""

    safe_to_repeat: bool = False

    @abstractmethod
    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult: ...


class BatchDispatcher(DeclaredDispatcher):
    """A ``DeclaredDispatcher`` that decides a claimed batch whole (DEC-1): exactly the results
    of calling it once per event, in order; ``None`` runs this batch per event."""

    @abstractmethod
    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None) -> BatchDecisions | None: ...


@dataclass(frozen=True)
class Capabilities:
    """What a dispatcher declares: safe to repeat (DEC-1.4), and whether it decides batches whole."""

    safe_to_repeat: bool = False
    batch: BatchDispatcher | None = None


UNDECLARED = Capabilities()


def capabilities_of(dispatcher: Dispatcher) -> Capabilities:
    """Read from its class: what is not a ``DeclaredDispatcher`` declares nothing (DEC-1.6)."""
    if not isinstance(dispatcher, DeclaredDispatcher):
        return UNDECLARED
    return Capabilities(safe_to_repeat=dispatcher.safe_to_repeat is True,
                        batch=dispatcher if isinstance(dispatcher, BatchDispatcher) else None)


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
    not_before: datetime | None = None  # held by an earlier claim until then (QUIET-2)

    def as_event(self) -> DigitalTwinEvent:
        """The stored facts become a DigitalTwinEvent, exactly as a live event would (REQ-0066)."""
        return DigitalTwinEvent(self.event_type, self.user_id, self.community_id, self.facts, self.id)


@dataclass(frozen=True)
class EventOutcome:
    """What one claimed event became (pending: held until ``not_before``, QUIET-2), and its lateness."""

    id: str
    status: EventStatus
    error: str | None = None
    event_type: str = ""
    trigger_at: datetime | None = None
    finished_at: datetime | None = None  # the injected clock's time of the outcome
    not_before: datetime | None = None  # a held row's: when it is due again (or was, once dispatched)

    @property
    def lateness(self) -> timedelta | None:
        """A dispatched event's ``dispatched_at - due_at``: trigger_at or its quiet hours' end (QUIET-3)."""
        if self.status != EventStatus.DISPATCHED or self.trigger_at is None or self.finished_at is None:
            return None
        return self.finished_at - (self.not_before or self.trigger_at)

    @classmethod
    def dispatched(cls, event: ClaimedEvent, now: datetime) -> EventOutcome:  # keeps its not_before
        return cls(event.id, EventStatus.DISPATCHED, None, event.event_type, event.trigger_at, now, event.not_before)

    @classmethod
    def deferred(cls, event: ClaimedEvent, not_before: datetime, now: datetime) -> EventOutcome:  # QUIET-2
        return cls(event.id, EventStatus.PENDING, None, event.event_type, event.trigger_at, now, not_before)

    @classmethod
    def decided(cls, event: ClaimedEvent, result: DispatchResult, now: datetime) -> EventOutcome:
        """Failed with a refusal, held when deferred, else dispatched."""
        if result.refusal is not None:
            return cls.failed(event, result.refusal, now)
        if result.outcome is DispatchOutcome.DEFERRED and result.not_before is not None:
            return cls.deferred(event, result.not_before, now)
        return cls.dispatched(event, now)

    @classmethod
    def failed(cls, event: ClaimedEvent, error: str, now: datetime) -> EventOutcome:
        return cls(event.id, EventStatus.FAILED, error, event.event_type, event.trigger_at, now)

    @classmethod
    def expired(cls, row_id: str, event_type: str, trigger_at: datetime, error: str, now: datetime) -> EventOutcome:
        return cls(row_id, EventStatus.EXPIRED, error, event_type, trigger_at, now)


@dataclass(frozen=True)
class PollReport:
    """What one poll's committed batch became."""

    claimed: int
    outcomes: tuple[EventOutcome, ...]
    skipped: int = 0  # rows of busy participants, left pending
    expired: tuple[EventOutcome, ...] = ()  # rows the claim ended expired (EXP-2, DEC-EXPIRY)

    @property
    def dispatched(self) -> int:
        return sum(o.status == EventStatus.DISPATCHED for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == EventStatus.FAILED for o in self.outcomes)

    @property
    def held(self) -> int:
        """Rows held in their participants' quiet hours, pending until their not_before (QUIET-2)."""
        return sum(o.status == EventStatus.PENDING for o in self.outcomes)


class NotADispatchResult(TypeError):
    """A dispatcher returned something other than a ``DispatchResult``."""


class AsyncDispatcherRefused(TypeError):
    """A dispatcher that is a coroutine function (``async def``) was handed to the service."""


def checked_result(value: object) -> DispatchResult:
    """``value`` if a ``DispatchResult``, else ``NotADispatchResult`` naming it (a coroutine closed)."""
    if isinstance(value, DispatchResult):
        return value
    description = "None" if value is None else f"a {type(value).__name__}"
    if inspect.iscoroutine(value):
        description = "a coroutine (is it an async def? dispatchers are called synchronously)"
        value.close()
    raise NotADispatchResult(f"dispatcher returned {description}; expected a DispatchResult")


def refuse_async_dispatcher(dispatcher: object) -> None:
    """Raise ``AsyncDispatcherRefused`` when calling ``dispatcher`` (or its ``decide_batch``)
    would return a coroutine; an object's ``__call__`` is looked up on its type, as a call does."""
    call = None if inspect.isroutine(dispatcher) else next(
        (vars(base)["__call__"] for base in type(dispatcher).__mro__ if "__call__" in vars(base)), None)
    decide = dispatcher.decide_batch if isinstance(dispatcher, BatchDispatcher) else None
    if (inspect.iscoroutinefunction(dispatcher) or inspect.iscoroutinefunction(call)
            or inspect.iscoroutinefunction(decide)):
        raise AsyncDispatcherRefused(
            f"the dispatcher {dispatcher!r} is asynchronous (async def); a dispatcher is called "
            "synchronously, in the loop's worker thread on a sync Session, and must return a "
            "DispatchResult: make it a plain def (run async work after the commit, in a Publisher)")


# -- outbound delivery (specs/delivery.md): what a channel's Sender is handed and answers
class DeliveryRowStatus(StrEnum):
    """A ``deliveries`` row: an in-app row's decision, or an outbox row's progress (DEC-OUTBOX)."""

    SENT = "sent"
    SUPPRESSED = "suppressed"
    FAILED = "failed"
    QUEUED = "queued"
    RETRYING = "retrying"
    DELIVERED = "delivered"
    UNDELIVERABLE = "undeliverable"


@dataclass(frozen=True)
class PushTarget:
    """A participant's push subscription (the W3C ``PushSubscription``, decoded)."""

    endpoint: str
    p256dh: bytes = field(repr=False)  # the browser's P-256 public key, 65 bytes uncompressed
    auth: bytes = field(repr=False)  # its 16-byte authentication secret
    subscription_id: str | None = None


@dataclass(frozen=True)
class OutboundDelivery:
    """A sent notification's delivery on one channel; the same ``idempotency_key`` every attempt."""

    delivery_id: str
    idempotency_key: str
    channel: str
    notification_id: str
    user_id: str
    community_id: str | None
    kind: str
    title: str
    body: str
    created_at: datetime
    attempt: int = 1
    push: PushTarget | None = None  # set for the web-push channel


@dataclass(frozen=True)
class Delivered:
    """The provider took it: its HTTP status (or None) and an excerpt of its answer."""

    status: int | None
    answer: str = ""


@dataclass(frozen=True)
class Retry:
    """Not this time (5xx, 408, 429, a timeout): again, no sooner than ``retry_after``."""

    reason: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Undeliverable:
    """Never (any other 4xx, a redirect): retrying would not help."""

    reason: str


@dataclass(frozen=True)
class Gone:
    """A push service answered 404 or 410: the subscription is removed, the delivery undeliverable."""

    status: int
    reason: str


SendResult = Delivered | Retry | Undeliverable | Gone


@runtime_checkable
class Sender(Protocol):
    """A channel (webhook, web push, a host's own by name): sends one delivery and answers what
    happened; a failed send is a ``Retry`` or ``Undeliverable``, and anything it raises a ``Retry``."""

    async def send(self, delivery: OutboundDelivery) -> SendResult: ...
