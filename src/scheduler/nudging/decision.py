"""The one decision (REQ-0066, DEC-1.5): deduplication, preferences, the daily cap and delivery.

A live event, an event of the scheduler's per-event path and a whole claimed batch are
decided by the same code. The decision itself is pure (ARCH-11): ``decide`` gets each
event's rules' candidates and what was read (``BatchState``: the keys already taken, the
participants' preferences, today's sent counts), decides every event in order over that
state, carrying forward what the earlier events did (a key they claimed, a delivery they
sent), and returns what to write (``BatchDecisions``: one statement writes it all). Its
dispatcher, ``NudgingPlatform``, runs in the session: it runs the rules, asks its
``DecisionRepository`` for the one read, and sends the one write. A live event is a batch of one.

Exactness rests on the participant lock: every participant decided for is locked until the
transaction ends (the claim took it, DEC-2, or ``decide`` takes it first), and a
deduplication key names its participant, so nothing another transaction commits can change
what was read. The write still counts the rows it wrote and fails on any difference from
the decisions (the scheduler then falls back to batches of one, DEC-1.2).

``NudgingPlatform`` is the production ``Dispatcher`` that runs it, the one dispatch path of
live ingest and the scheduler (REQ-0066): the rules say what they want, the decision what is
delivered, and the result carries the outcome in the domain's words (``DispatchOutcome``),
the same for a live and a scheduled event; only the live route maps it to an HTTP answer. A
live event (and an event of the scheduler's per-event path) is decided and written as a batch
of one; a claimed batch is decided whole (``decide_batch``), its write left to the scheduler,
who sends it with the COMMIT.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, time
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database.notifications import DecisionRepository
from scheduler.nudging.local_time import LocalTimeError, QuietHours
from scheduler.nudging.orchestrator import (
    CAP_WINDOW,
    DEFAULT_PREFERENCES,
    DeliveryRow,
    Orchestrator,
    Preferences,
    as_recorded,
    idempotency_key,
    notification_row,
    outbox_message,
)
from scheduler.nudging.rules import Candidate, Catalogue, RuleRefusal, evaluate
from scheduler.types import (
    BatchDispatcher,
    DigitalTwinEvent,
    DispatchOutcome,
    DispatchResult,
    NotificationStatus,
)

# What an event's rules gave: its candidates with their keys, a refusal's result, or the
# exception an evaluator raised (that event fails, alone: REQ-0067).
Evaluated = list[tuple[Candidate, str]] | DispatchResult | Exception

# Asked after each event's decision: an exception fails that event alone, as if it had never
# been decided (its effects leave the batch's state); ``None`` keeps the result.
Check = Callable[[int, DispatchResult], Exception | None]


def evaluated(catalogue: Catalogue, event: DigitalTwinEvent) -> Evaluated:
    """Run the event's rules: its candidates and their keys, or the refusal as a result."""
    try:
        return [(c, c.dedup_key(event)) for c in evaluate(catalogue, event)]
    except RuleRefusal as refusal:
        return DispatchResult(outcome=refusal.outcome, refusal=str(refusal),
                              detail={"error": refusal.reason, "detail": refusal.detail})
    except Exception as exc:  # noqa: BLE001 - an evaluator's own error: this event fails, alone (REQ-0067)
        return exc


@dataclass(frozen=True)
class KeyState:
    """A deduplication key as the batch sees it: taken before the batch, or claimed by it."""

    taken_before: bool
    duplicate_notification_id: str | None = None  # its one suppressed_dedup row, read or written
    notification_id: str | None = None  # the claiming notification (claimed by the batch)
    created_at: datetime | None = None
    duplicates: int = 0  # the batch's duplicates of this key
    last_duplicate_at: datetime | None = None
    new_duplicate_notification_id: str | None = None  # the suppressed_dedup row this batch wrote


@dataclass
class BatchState:
    """What was read, and what the batch did so far: the decisions' whole input, and the
    rows they write. Changes are journaled so that an event can be undone (``Check``)."""

    preferences: dict[str, Preferences]
    sent_today: dict[str, int]  # sent notifications in each participant's own day (QUIET-4)
    keys: dict[str, KeyState]
    # participants whose stored zone no longer loads: their events fail, alone (QUIET-6)
    broken_zones: dict[str, Exception] = field(default_factory=dict)
    notifications: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    _journal: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)

    def preferences_of(self, user_id: str) -> Preferences:
        return self.preferences.get(user_id, DEFAULT_PREFERENCES)

    def put_key(self, key: str, state: KeyState) -> None:
        self._set(self.keys, key, state)

    def count_sent(self, user_id: str, sent: int) -> None:
        if sent:
            self._set(self.sent_today, user_id, self.sent_today.get(user_id, 0) + sent)

    def _set(self, table: dict[str, Any], key: str, value: Any) -> None:
        self._journal.append((table, key, table.get(key)))
        table[key] = value

    def mark(self) -> tuple[int, int, int]:
        return len(self.notifications), len(self.deliveries), len(self._journal)

    def undo(self, mark: tuple[int, int, int]) -> None:
        """Forget everything done since ``mark``."""
        notifications, deliveries, journal = mark
        del self.notifications[notifications:], self.deliveries[deliveries:]
        while len(self._journal) > journal:
            table, key, old = self._journal.pop()
            if old is None:
                table.pop(key, None)
            else:
                table[key] = old

    @property
    def writes_anything(self) -> bool:
        """Every candidate claims a key or counts a duplicate of one: the write has work."""
        return any(not s.taken_before or s.duplicates for s in self.keys.values())


def decide_event(orchestrator: Orchestrator, state: BatchState, event: DigitalTwinEvent,
                 candidates: Evaluated, now: datetime) -> DispatchResult | Exception:
    """One event's result over the batch's state (changed by what it decides), and the
    outcome in the domain's words: delivered when a message leaves, duplicate when every
    candidate was one, else suppressed."""
    if not isinstance(candidates, list):
        return candidates
    if not candidates:
        return DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED)
    broken = state.broken_zones.get(event.user_id)
    if broken is not None:
        return broken
    # In quiet hours: held before deduplication, preferences and the cap, nothing written; it
    # is decided afresh at not_before (QUIET-2, DEC-LOCAL-TIME)
    not_before = state.preferences_of(event.user_id).hold_until(now)
    if not_before is not None:
        return DispatchResult(outcome=DispatchOutcome.DEFERRED, not_before=not_before)
    result = DispatchResult(outcome=DispatchOutcome.SUPPRESSED)
    duplicates = sum(_decide(orchestrator, state, result, event, candidate, key, now) for candidate, key in candidates)
    if result.outbound:
        result.outcome = DispatchOutcome.DELIVERED
    elif duplicates == len(candidates):
        result.outcome = DispatchOutcome.DUPLICATE
    return result


def _decide(orchestrator: Orchestrator, state: BatchState, result: DispatchResult, event: DigitalTwinEvent,
            candidate: Candidate, key: str, now: datetime) -> bool:
    """Deduplicate, filter by preference and cap, then deliver one candidate; True for a duplicate."""
    known = state.keys.get(key)
    if known is not None:
        known = replace(known, duplicates=known.duplicates + 1, last_duplicate_at=now)
        # A duplicate is recorded once per key; later repeats only bump the counter.
        if known.duplicate_notification_id is None:
            row = notification_row(event, candidate, key, now, NotificationStatus.SUPPRESSED, "suppressed_dedup",
                                   str(uuid.uuid4()))
            state.notifications.append(row)
            known = replace(known, duplicate_notification_id=row["id"], new_duplicate_notification_id=row["id"])
        state.put_key(key, known)
        return True
    notification_id = str(uuid.uuid4())
    state.put_key(key, KeyState(False, notification_id=notification_id, created_at=now))
    prefs = state.preferences_of(event.user_id)
    if not prefs.allows(candidate.rule.kind):
        status, reason = NotificationStatus.SUPPRESSED, "kind_disabled"
    elif state.sent_today.get(event.user_id, 0) >= prefs.max_per_day:
        status, reason = NotificationStatus.SUPPRESSED, "rate_limited"
    else:
        status, reason = NotificationStatus.SENT, None
    row = notification_row(event, candidate, key, now, status, reason, notification_id)
    state.notifications.append(row)
    notification = as_recorded(row)
    result.notifications.append(notification)
    if status == NotificationStatus.SENT:
        rows, outbound = orchestrator.deliver(notification, now)
        state.deliveries.extend(delivery_row(notification, r, now) for r in rows)
        # the batch's own sent notification counts for its later decisions about this
        # participant, as read_batch_limits counts the sent notifications (QUIET-4): the
        # decision's own record, never a delivery's progress (DEC-OUTBOX)
        state.count_sent(event.user_id, 1)
        result.outbound.extend(outbound)
    return False


def delivery_row(notification: dict[str, Any], row: DeliveryRow, now: datetime) -> dict[str, Any]:
    """One delivery as the write statement takes it: an outbox row ``queued`` and due at once,
    with its idempotency key and message (DEC-OUTBOX)."""
    written: dict[str, Any] = {"notification_id": notification["id"], "user_id": notification["user_id"],
                               "channel": row.channel, "status": row.status, "detail": row.detail, "now": now}
    if row.outbox:
        written |= {"status": "queued", "idempotency_key": idempotency_key(notification["id"], row.channel),
                    "message": outbox_message(notification), "next_attempt_at": now}
    if row.per_subscription:
        written["per_subscription"] = True  # the write makes one row per push subscription (PUSH-6)
    return written


@dataclass
class BatchDecisions:
    """One result per event decided (a ``DispatchResult``, or the ``Exception`` that fails it
    alone), and the state whose rows the write statement writes, not yet sent."""

    results: list[DispatchResult | Exception]
    state: BatchState

    @property
    def writes_anything(self) -> bool:
        return self.state.writes_anything

    def write_statement(self, outcomes: dict[str, list[Any]] | None = None) -> tuple[str, dict[str, Any]]:
        """The batch's one write statement and its parameters, with ``outcomes``
        (``record_outcomes``'s arrays; none for a live event or the per-event path): every
        part as one JSON document whose array lengths are what was decided; the statement
        fails when it writes other rows than these."""
        outcomes = outcomes or {"ids": [], "statuses": [], "errors": [], "times": [], "not_befores": []}
        keys = self.state.keys
        document = {
            "new_keys": [{"key": k, "notification_id": s.notification_id, "at": s.created_at,
                          "duplicates": s.duplicates, "last_duplicate_at": s.last_duplicate_at,
                          "duplicate_notification_id": s.new_duplicate_notification_id}
                         for k, s in keys.items() if not s.taken_before],
            "repeated_keys": [{"key": k, "duplicates": s.duplicates, "at": s.last_duplicate_at,
                               "notification_id": s.new_duplicate_notification_id}
                              for k, s in keys.items() if s.taken_before and s.duplicates],
            "notifications": self.state.notifications,
            "deliveries": [d for d in self.state.deliveries if not d.get("per_subscription")],
            # web push: one row per subscription of each participant, however many (PUSH-6)
            "push_deliveries": [d for d in self.state.deliveries if d.get("per_subscription")],
        }
        # the outcomes are record_outcomes' own arrays, written by the same fragment (DEC-1.7)
        arrays = {name: list(outcomes[name]) for name in ("ids", "statuses", "errors", "times")}
        # a held row's end of quiet hours (QUIET-2); None keeps the row's own
        arrays["not_befores"] = list(outcomes.get("not_befores") or [None] * len(arrays["ids"]))
        return "write_batch_decisions", {"batch": json.dumps(document, default=_json_time), **arrays}


def _json_time(value: object) -> str:
    """A time in the write's JSON: ISO 8601 with its offset and microseconds (exact as timestamptz)."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} in a batch's write")


def evaluated_in_order(catalogue: Catalogue, events: Sequence[DigitalTwinEvent],
                       stop: Callable[[], bool] | None = None) -> list[Evaluated]:
    """Each event's rules (``evaluated``), in order. ``stop`` is asked after each event's rules
    ran (the last's excepted): when it says so (a stop arrived), only the events evaluated so
    far are decided, as one by one they would have stopped after the event in hand (DEC-7);
    the list is then shorter than ``events``."""
    candidates: list[Evaluated] = []
    for event in events:
        candidates.append(evaluated(catalogue, event))
        if stop is not None and len(candidates) < len(events) and stop():
            break
    return candidates


def to_read(events: Sequence[DigitalTwinEvent], candidates: Sequence[Evaluated]) -> tuple[list[str], list[str]]:
    """What the decisions of ``events`` need read: the participants with a candidate, and the
    candidates' deduplication keys (sorted: the locks are taken in one order)."""
    users = sorted({e.user_id for e, c in zip(events, candidates, strict=True) if isinstance(c, list) and c})
    keys = sorted({key for c in candidates if isinstance(c, list) for _, key in c})
    return users, keys


def state_of(limits: Mapping[str, Any] | None, users: Sequence[str], now: datetime) -> BatchState:
    """The decisions' input from what ``DecisionRepository.read_limits`` read for ``users``
    (``None``: nothing was read, no participant had a candidate)."""
    if limits is None:
        return BatchState({}, {}, {})
    preferences = {
        str(user): Preferences(None if kinds is None else frozenset(kinds), int(cap), zone,
                               None if start is None
                               else QuietHours(time.fromisoformat(start), time.fromisoformat(end)))
        for user, kinds, cap, zone, start, end in limits["preferences"]
    }
    state = BatchState(preferences, {},
                       {str(key): KeyState(True, duplicate_notification_id=None if dup is None else str(dup))
                        for key, dup in limits["taken_keys"]})
    # a batch decides at one instant, so a zone's day is the same for each of its participants:
    # found once per zone (about 12 µs each; a burst's participants share a few zones)
    days: dict[str | None, tuple[datetime, datetime]] = {}
    for n, sent_at in limits["sent_recently"]:
        user = users[int(n) - 1]
        participant = state.preferences_of(user)
        day = days.get(participant.time_zone)
        if day is None:
            try:
                day = days[participant.time_zone] = participant.day(now)
            except LocalTimeError as exc:
                state.broken_zones[user] = exc
                continue
        # the participant's own day, in Python (zoneinfo's rules, DEC-LOCAL-TIME): every one of
        # their days lies within CAP_WINDOW of now, so the window read holds it whole
        day_start, day_end = day
        state.sent_today[user] = sum(day_start <= datetime.fromisoformat(t) < day_end for t in sent_at)
    return state


def decide(orchestrator: Orchestrator, events: Sequence[DigitalTwinEvent], candidates: Sequence[Evaluated],
           state: BatchState, now: datetime, *, check: Check | None = None) -> BatchDecisions:
    """Decide ``events`` (their rules' ``candidates``) in order at ``now`` over what was read
    (``state``), each as if it were alone after the ones before it; what to write is the
    result's ``write_statement``. Reads nothing and writes nothing (ARCH-11).

    A rule that raised fails its own event only (its result is the exception); ``check`` may
    fail an event after its decision (``Check``)."""
    results: list[DispatchResult | Exception] = []
    for index, (event, event_candidates) in enumerate(zip(events, candidates, strict=True)):
        mark = state.mark()
        result = decide_event(orchestrator, state, event, event_candidates, now)
        failure = check(index, result) if check is not None and isinstance(result, DispatchResult) else None
        if failure is not None:
            state.undo(mark)
            result = failure
        results.append(result)
    return BatchDecisions(results, state)


class NudgingPlatform(BatchDispatcher):
    """Engine plus orchestrator, run inside the caller's transaction. It declares both
    capabilities (``BatchDispatcher``): it decides a claimed batch whole, and it is safe to call
    again."""

    # Every effect is a row written in the session it is handed, and the outbound messages
    # leave only after the commit: calling it again for an event whose first call was rolled
    # back is safe, so a batch runs optimistically, with a replay after a failure (DEC-1.4).
    safe_to_repeat = True

    def __init__(self, catalogue: Catalogue, orchestrator: Orchestrator | None = None, *,
                 decisions: DecisionRepository | None = None) -> None:
        """``decisions``: the reads and writes of the service's ``Database`` (its schema's;
        ``SchedulerService`` passes its own); by default the default schema's, ``scheduler``."""
        self.catalogue = catalogue
        self.orchestrator = orchestrator or Orchestrator()
        self.decisions = decisions if decisions is not None else DecisionRepository.of()

    def __call__(self, session: Session, event: DigitalTwinEvent, now: datetime) -> DispatchResult:
        """Decide one event as a batch of one and write its decision (one read, one write;
        the participant's lock first unless this transaction holds it). An evaluator's own
        error propagates."""
        decided = self._decided(session, [event], now)
        [result] = decided.results
        if isinstance(result, Exception):
            raise result
        if decided.writes_anything:
            self.decisions.write(session, *decided.write_statement())
        return result

    def decide_batch(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                     stop: Callable[[], bool] | None = None, check: Check | None = None) -> BatchDecisions:
        """Decide a claimed batch: each event's result as ``__call__`` gives it, one after the
        other at ``now``. The rules run first (``stop``: see ``evaluated_in_order``), then the
        one read of what their decisions need (after the participants' locks, DEC-2), then the
        decision (``decide``, ``check`` too); the write (``BatchDecisions.write_statement``)
        is left to the caller. A database error propagates."""
        return self._decided(session, events, now, stop, check)

    def _decided(self, session: Session, events: Sequence[DigitalTwinEvent], now: datetime,
                 stop: Callable[[], bool] | None = None, check: Check | None = None) -> BatchDecisions:
        candidates = evaluated_in_order(self.catalogue, events, stop)
        events = events[:len(candidates)]
        users, keys = to_read(events, candidates)
        # every local day lies within CAP_WINDOW of now (LOCAL-5): the cap's day is counted in it
        limits = self.decisions.read_limits(session, users, keys, now - CAP_WINDOW, now + CAP_WINDOW) if users else None
        return decide(self.orchestrator, events, candidates, state_of(limits, users, now), now, check=check)
