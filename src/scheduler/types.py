"""Aliases and protocols shared across the package (one place, as Starlette does).

Everything that crosses a seam lives here: the clock the loop reads, the
publisher that pushes a delivered notification out of the process, the
dispatcher that runs one stored event through the platform (with the checks of
what it must be and return), and what a poll hands back (``ClaimedEvent``,
``EventOutcome``, ``PollReport``).

What an implementation may do beyond its protocol is *declared*, never probed: a dispatcher
that may be called again after a rollback, or that decides a claimed batch whole, subclasses
``DeclaredDispatcher`` or ``BatchDispatcher``; a publisher that takes a batch's messages in one
call subclasses ``BulkPublisher``. Anything else that has the protocol's one method (a plain
function for a dispatcher, any object with ``publish`` for a publisher) declares nothing: it
is called once per event, or once per message (``capabilities_of``).
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.orm import Session

JSONObject = dict[str, Any]


class EventStatus(StrEnum):
    """A scheduled event's status, the row's own record of what became of it. A new
    member here is all it takes to reach the API schema, the status filters and the CLI."""

    PENDING = "pending"
    DISPATCHED = "dispatched"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # claimed after its expires_at: not dispatched, its engine never ran (EXP-2, DEC-EXPIRY)
    EXPIRED = "expired"


EVENT_STATUSES: tuple[EventStatus, ...] = tuple(EventStatus)


class NotificationStatus(StrEnum):
    """A notification's status: delivered, recorded but not delivered (with a reason), or failed."""

    SENT = "sent"
    SUPPRESSED = "suppressed"
    FAILED = "failed"


class DispatchOutcome(StrEnum):
    """What the shared dispatch path decided for one event, in the domain's words.

    Only the live ingest route turns it into an HTTP status (``LIVE_STATUS``, the live answers); a
    scheduled event records a refusal as ``failed`` with the reason in ``last_error``.
    """

    DELIVERED = "delivered"  # at least one delivery
    SUPPRESSED = "suppressed"  # notifications recorded, every delivery suppressed
    DUPLICATE = "duplicate"  # every rule that would fire already notified for the period
    NO_RULE_TRIGGERED = "no_rule_triggered"  # the rules ran and wanted nothing
    NO_RULE_FOR_SCENARIO = "no_rule_for_scenario"  # refused: no enabled rule claims it
    INVALID_EVENT = "invalid_event"  # refused: the facts, time scope or templates do not fit
    # held: its participant is in quiet hours; nothing decided or written until ``not_before``
    # (QUIET-2, DEC-LOCAL-TIME): a scheduled row stays pending, a live event becomes one
    DEFERRED = "deferred"

    @property
    def refused(self) -> bool:
        """The event is the sender's fault: nothing it wrote stays."""
        return self in (DispatchOutcome.NO_RULE_FOR_SCENARIO, DispatchOutcome.INVALID_EVENT)


class SchedulerMode(StrEnum):
    """How the loop paces its polls (DEC-9 in specs/decisions.md).

    ``literal`` is REQ-0065 to the letter: one poll, then a full ``SCHEDULER_POLL_SECONDS``
    wait, whatever the poll found. ``prompt`` polls again at once after a full batch and
    otherwise waits until the earliest of the interval, the next pending ``trigger_at``
    and a wake-up from any replica that stored an event due before then.
    """

    LITERAL = "literal"
    PROMPT = "prompt"


@runtime_checkable
class Clock(Protocol):
    """Where time comes from. Production reads the database server's clock (``DatabaseClock``,
    DEC-10); tests and the simulation inject one they control."""

    def now(self) -> datetime:
        """An aware UTC datetime."""
        ...


@dataclass(frozen=True)
class DigitalTwinEvent:
    """An event as the rule engine sees it, whether it arrived live or from a stored row."""

    event_type: str
    user_id: str
    community_id: str | None
    facts: Mapping[str, Any]
    # Set when the event comes from a stored row, so its notifications can point back to it.
    scheduled_event_id: str | None = None


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
    """Pushes a committed notification out of the process (a browser, a queue).

    It is only ever called after the transaction that recorded the notification
    has committed, so nothing leaves the process for work that was rolled back. Anything with
    ``publish(message)`` is one: it is handed a committed batch's messages one at a time, and a
    message whose ``publish`` raises is logged alone, never retried. One that takes a whole
    batch in one call declares it by subclassing ``BulkPublisher``.
    """

    def publish(self, message: OutboundMessage) -> None: ...


class BulkPublisher(Publisher):
    """A ``Publisher`` that declares it takes a committed batch's messages in one call (the
    inbox's ``StreamPublisher`` numbers a whole batch in one transaction): ``publish_many`` is
    handed them all, in order, and isolates its own per-message failures (one that escapes is
    logged for the batch); ``publish`` is ``publish_many`` of one message unless overridden."""

    @abstractmethod
    def publish_many(self, messages: Sequence[OutboundMessage]) -> None:
        """Push a committed batch's messages, in order."""

    def publish(self, message: OutboundMessage) -> None:
        self.publish_many([message])


@dataclass
class DispatchResult:
    """What the shared dispatch path decided for one event.

    ``refusal`` (the text a scheduled row keeps in ``last_error``) is set exactly when
    ``outcome.refused``: the event is the sender's fault, and a scheduled event ends ``failed``.
    ``not_before`` is set exactly when ``outcome`` is ``DEFERRED``: the instant (UTC) the
    participant's quiet hours end, when the event is decided again (QUIET-2).
    ``outbound`` goes to the ``Publisher`` after the commit (at most once); ``outbox``, a host
    dispatcher's messages for the outbox (OUTBOX-7): each is queued as a ``deliveries`` row on
    its ``channel`` (a ``Sender`` of ``SchedulerService(senders=...)``, or the built-in
    ``webhook``) in the dispatch transaction and sent at least once by the delivery worker; a
    channel without a sender is recorded ``undeliverable`` on its row (OUTBOX-8). The built-in
    platform queues its own deliveries and leaves ``outbox`` empty.
    """

    outcome: DispatchOutcome
    refusal: str | None = None
    detail: Any = None
    notifications: list[JSONObject] = field(default_factory=list)
    outbound: list[OutboundMessage] = field(default_factory=list)
    not_before: datetime | None = None
    outbox: list[OutboundMessage] = field(default_factory=list)


@runtime_checkable
class Dispatcher(Protocol):
    """Decides and records what one event becomes, inside the caller's transaction: the
    built-in ``NudgingPlatform`` (engine and orchestrator), or a host's own: any callable with
    this signature, a plain ``def`` included.

    The contract a host's dispatcher can rely on, and must keep (docs/embedding.md):

    - **Where it runs.** Called synchronously: by the loop in its worker thread (never on the
      event loop), and by the live ingest route in a request's worker thread. It must be a
      plain ``def`` (an ``async def`` is refused when the service is built).
    - **In which transaction.** ``session`` is a sync SQLAlchemy ``Session`` inside the
      scheduler's transaction, which holds the claimed row's lock. Write through it (your own
      tables too: unqualified names resolve in your ``search_path``); never commit, roll back
      or close it. Everything written commits with the row's new status, or not at all.
    - **What it returns.** A ``DispatchResult``: ``outcome`` in the domain's words, and
      ``refusal`` (text) when the event is the sender's fault: the row ends ``failed`` with it
      in ``last_error`` and nothing the call wrote stays. Raising fails the event alone with
      the error's text, and so does returning anything else (REQ-0067).
    - **How often.** Once per event per poll, each event in a savepoint of its own: a failure
      rolls back that event's work only, and nothing is replayed. A dispatcher that declares
      itself safe to repeat (a ``DeclaredDispatcher`` with ``safe_to_repeat = True``: every
      effect a row in ``session``, nothing sent from inside, as the built-in platform) lets a
      batch run optimistically, and may then be called again for an event whose first call was
      rolled back (DEC-1, DEC-1.4). A plain callable declares nothing.
    - **Side effects that leave the process** (a push, an e-mail, a call to another service)
      do not belong inside: return them as ``outbox`` messages, each naming its channel, which
      ``SchedulerService`` queues in this transaction and its delivery worker sends at least
      once (OUTBOX-7), or as ``outbound`` messages, which a ``Publisher`` sends after the
      commit, at most once.
    """

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult: ...


@runtime_checkable
class BatchDecisions(Protocol):
    """A batch decided set-based: one result per event (the ``Exception`` its rules raised,
    for an event that fails alone), and the one write that makes them true, sent with the
    batch's COMMIT."""

    results: list[DispatchResult | Exception]

    def write_statement(self, outcomes: dict[str, list[Any]]) -> tuple[str, dict[str, Any]]:
        """The one statement (its name in ``queries.sql`` and its parameters) that writes every
        decision and the batch's outcomes (``record_outcomes``'s arrays), and fails if what it
        writes differs from what was decided (the caller then falls back)."""
        ...


class DeclaredDispatcher(Dispatcher):
    """A ``Dispatcher`` that declares what the scheduler may do beyond calling it once per event
    per poll: subclass it and say so. The declarations and their defaults:

    - ``safe_to_repeat`` (default ``False``): calling it again for an event whose first call
      was rolled back is harmless (every effect a row in the session it is handed, nothing sent
      from inside), so a batch runs under one checkpoint with a replay after a failure (DEC-1,
      DEC-1.4). Only exactly ``True`` declares it;
    - deciding a claimed batch whole: subclass ``BatchDispatcher`` instead (DEC-1, DEC-1.6).

    A dispatcher that is not one of these (a plain function, a host's own class) declares
    neither: it is called once per event, in a savepoint of its own.
    """

    safe_to_repeat: bool = False

    @abstractmethod
    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult: ...


class BatchDispatcher(DeclaredDispatcher):
    """A ``DeclaredDispatcher`` that can also decide a whole claimed batch set-based (DEC-1): the
    results must be exactly those of calling it once per event, in order, at ``now``. ``None``
    (this batch has no set-based path) runs the batch per event."""

    @abstractmethod
    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None) -> BatchDecisions | None: ...


@dataclass(frozen=True)
class Capabilities:
    """What a dispatcher declares (``capabilities_of``): whether it is safe to call again after a
    rollback (DEC-1.4), and the dispatcher that decides a claimed batch whole, if it is one."""

    safe_to_repeat: bool = False
    batch: BatchDispatcher | None = None


# What a dispatcher that is not a ``DeclaredDispatcher`` (a plain callable) declares: nothing.
UNDECLARED = Capabilities()


def capabilities_of(dispatcher: Dispatcher) -> Capabilities:
    """What ``dispatcher`` declares, read from its class: a ``DeclaredDispatcher``'s
    ``safe_to_repeat`` (exactly ``True``) and whether it is a ``BatchDispatcher``. Any other
    dispatcher, a plain callable, declares nothing (``UNDECLARED``): an attribute or a method of
    the same name on it is not a declaration, and is not read (DEC-1.4, DEC-1.6)."""
    if not isinstance(dispatcher, DeclaredDispatcher):
        return UNDECLARED
    return Capabilities(safe_to_repeat=dispatcher.safe_to_repeat is True,
                        batch=dispatcher if isinstance(dispatcher, BatchDispatcher) else None)


# -- what a poll hands back ----------------------------------------------------------------

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
    # held in quiet hours until this instant by an earlier claim (QUIET-2): when it was due
    not_before: datetime | None = None

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
    status: EventStatus  # dispatched or failed; expired for a row the claim ended (EXP-2);
    # pending for a row held in its participant's quiet hours until ``not_before`` (QUIET-2)
    error: str | None = None
    event_type: str = ""
    trigger_at: datetime | None = None
    finished_at: datetime | None = None  # the injected clock's time of the outcome
    not_before: datetime | None = None  # a held row's: when it is due again (or was, once dispatched)

    @property
    def lateness(self) -> timedelta | None:
        """``dispatched_at - due_at`` for a dispatched event (the user's measure): from its
        trigger_at, or from the end of the quiet hours that held it (QUIET-3)."""
        if self.status != EventStatus.DISPATCHED or self.trigger_at is None or self.finished_at is None:
            return None
        return self.finished_at - (self.not_before or self.trigger_at)

    @classmethod
    def dispatched(cls, event: ClaimedEvent, now: datetime) -> EventOutcome:
        """The outcome of an event its dispatcher ran through (its row keeps its not_before)."""
        return cls(event.id, EventStatus.DISPATCHED, None, event.event_type, event.trigger_at, now, event.not_before)

    @classmethod
    def deferred(cls, event: ClaimedEvent, not_before: datetime, now: datetime) -> EventOutcome:
        """A row held in its participant's quiet hours: still pending, due again at ``not_before``
        (QUIET-2); nothing else it would have written is."""
        return cls(event.id, EventStatus.PENDING, None, event.event_type, event.trigger_at, now, not_before)

    @classmethod
    def decided(cls, event: ClaimedEvent, result: DispatchResult, now: datetime) -> EventOutcome:
        """What a result the dispatcher handed back makes of its row: failed with a refusal,
        held when deferred, else dispatched."""
        if result.refusal is not None:
            return cls.failed(event, result.refusal, now)
        if result.outcome is DispatchOutcome.DEFERRED and result.not_before is not None:
            return cls.deferred(event, result.not_before, now)
        return cls.dispatched(event, now)

    @classmethod
    def failed(cls, event: ClaimedEvent, error: str, now: datetime) -> EventOutcome:
        """A failed outcome; its row is written with the others when the batch finishes."""
        return cls(event.id, EventStatus.FAILED, error, event.event_type, event.trigger_at, now)

    @classmethod
    def expired(cls, row_id: str, event_type: str, trigger_at: datetime, error: str, now: datetime) -> EventOutcome:
        """A row the claim found past its ``expires_at`` and ended ``expired`` in its own statement
        (never dispatched, nothing to record at the batch's end)."""
        return cls(row_id, EventStatus.EXPIRED, error, event_type, trigger_at, now)


@dataclass(frozen=True)
class PollReport:
    """What one poll's committed batch became."""

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

    @property
    def held(self) -> int:
        """Rows held in their participants' quiet hours, pending until their not_before (QUIET-2)."""
        return sum(o.status == EventStatus.PENDING for o in self.outcomes)


# -- what a dispatcher must be and return, checked where it is handed in and called ---------
#
# A dispatcher is called synchronously, in the loop's worker thread (or a request's), on a
# sync Session: an ``async def`` one would hand back a coroutine nobody awaits, so it is
# refused when the service or scheduler is built (``refuse_async_dispatcher``). Whatever it
# returns goes through ``checked_result`` before anything reads it: a value that is not a
# DispatchResult raises ``NotADispatchResult`` inside the per-event isolation, so that one
# event fails with the reason in ``last_error`` (REQ-0067); on the live path it is a 500
# whose log line says why.


class NotADispatchResult(TypeError):
    """A dispatcher returned something other than a ``DispatchResult``."""


class AsyncDispatcherRefused(TypeError):
    """A dispatcher that is a coroutine function (``async def``) was handed to the service."""


def checked_result(value: object) -> DispatchResult:
    """``value`` if it is a ``DispatchResult``; else ``NotADispatchResult`` naming what it
    is. A coroutine is closed first, so no "never awaited" warning follows it."""
    if isinstance(value, DispatchResult):
        return value
    if value is None:
        description = "None"
    elif inspect.iscoroutine(value):
        description = "a coroutine (is it an async def? dispatchers are called synchronously)"
        value.close()
    else:
        description = f"a {type(value).__name__}"
    raise NotADispatchResult(f"dispatcher returned {description}; expected a DispatchResult")


def refuse_async_dispatcher(dispatcher: object) -> None:
    """Raise ``AsyncDispatcherRefused`` when calling ``dispatcher`` (or its ``decide_batch``)
    would return a coroutine: an ``async def`` function, or an object whose ``__call__`` is one."""
    # an object's own __call__, looked up on its type as the call itself does
    call = None if inspect.isroutine(dispatcher) else next(
        (vars(base)["__call__"] for base in type(dispatcher).__mro__ if "__call__" in vars(base)), None)
    decide = dispatcher.decide_batch if isinstance(dispatcher, BatchDispatcher) else None
    if (inspect.iscoroutinefunction(dispatcher) or inspect.iscoroutinefunction(call)
            or inspect.iscoroutinefunction(decide)):
        raise AsyncDispatcherRefused(
            f"the dispatcher {dispatcher!r} is asynchronous (async def); a dispatcher is called "
            "synchronously, in the loop's worker thread on a sync Session, and must return a "
            "DispatchResult: make it a plain def (run async work after the commit, in a Publisher)")


# -- outbound delivery (specs/delivery.md): what a channel's Sender is handed and answers ---


class DeliveryStatus(StrEnum):
    """A delivery's record: sent, to be tried again at ``next_attempt_at``, or given up on."""

    DELIVERED = "delivered"
    RETRYING = "retrying"
    UNDELIVERABLE = "undeliverable"


class DeliveryRowStatus(StrEnum):
    """What a row of ``deliveries`` says: an in-app row's decision (``sent``, ...) or an outbox
    row's progress (``queued``, then ``retrying``, ``delivered`` or ``undeliverable``: DEC-OUTBOX)."""

    SENT = "sent"
    SUPPRESSED = "suppressed"
    FAILED = "failed"
    QUEUED = "queued"
    RETRYING = "retrying"
    DELIVERED = "delivered"
    UNDELIVERABLE = "undeliverable"


@dataclass(frozen=True)
class PushTarget:
    """One push subscription of a participant (the W3C ``PushSubscription``, decoded): where
    to send and the keys to encrypt for (``scheduler.delivery.subscription`` parses it)."""

    endpoint: str
    p256dh: bytes = field(repr=False)  # the browser's P-256 public key, 65 bytes uncompressed
    auth: bytes = field(repr=False)  # its 16-byte authentication secret
    subscription_id: str | None = None


@dataclass(frozen=True)
class OutboundDelivery:
    """One delivery of a sent notification on one channel, as a ``Sender`` gets it.
    ``idempotency_key`` is the same on every attempt; ``attempt`` counts from 1."""

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
    """The provider took it: its status (None for a channel that is not HTTP) and a short
    excerpt of its answer."""

    status: int | None
    answer: str = ""


@dataclass(frozen=True)
class Retry:
    """Not this time (5xx, 408, 429, a timeout, a connection error): try again, no sooner than
    ``retry_after`` seconds when the provider said so."""

    reason: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Undeliverable:
    """Never (any other 4xx, a redirect): retrying would not help."""

    reason: str


@dataclass(frozen=True)
class Gone:
    """A push service answered 404 or 410: the subscription is dead; remove it, and the
    delivery ends undeliverable."""

    status: int
    reason: str


SendResult = Delivered | Retry | Undeliverable | Gone


@runtime_checkable
class Sender(Protocol):
    """A channel: sends one delivery and classifies what happened (the built-in webhook and
    web push, or a host's own, registered by channel name). It must not raise for a failed
    send: it answers ``Retry`` or ``Undeliverable`` (``scheduler.delivery.outcome`` classifies
    an HTTP answer or an exception); the worker treats anything it raises as a ``Retry``."""

    async def send(self, delivery: OutboundDelivery) -> SendResult: ...
