"""Set-based dispatch: a whole batch's decisions read in one statement and written in one.

The rules run in Python for each event, exactly as ``NudgingPlatform.__call__`` runs them.
What the per-event path asks the database one candidate at a time (is the key taken? the
participant's preferences, today's sent count) is read once for the batch
(``read_batch_limits``); the decisions are then taken in Python in batch order, by the
same rules as ``Orchestrator.decide``, carrying forward what earlier events of the batch
did (a key they claimed, a delivery they sent); and everything is written by one statement
(``write_batch_decisions``), the batch's outcomes included, sent with the batch's COMMIT.

Exactness rests on the claim: every participant of the batch is locked by it (DEC-2), and
a deduplication key names its participant, so nothing another transaction commits can
change what was read until the batch ends. The write statement still counts every row it
wrote and fails on any difference from what was decided, and the caller rolls back to its
checkpoint and takes the per-event path (DEC-1).

Only the built-in in-app channel is written set-based; an orchestrator with other
channels returns ``None`` from ``plan`` and the caller takes the per-event path.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler.database import pipeline
from scheduler.nudging.orchestrator import (
    DEFAULT_MAX_PER_DAY,
    Orchestrator,
    Preferences,
    WebChannel,
    as_recorded,
    notification_row,
    utc_day,
)
from scheduler.nudging.rule_engine import Candidate, RuleRefusal, evaluate
from scheduler.nudging.rules import Catalogue
from scheduler.types import DigitalTwinEvent, DispatchOutcome, DispatchResult, NotificationStatus


@dataclass
class _Key:
    """A deduplication key as the batch sees it: taken before the batch, or claimed by it."""

    taken_before: bool
    duplicate_notification_id: str | None = None
    notification_id: str | None = None  # the claiming notification (claimed by the batch)
    created_at: datetime | None = None
    duplicates: int = 0  # the batch's duplicates of this key
    last_duplicate_at: datetime | None = None
    new_duplicate_notification_id: str | None = None  # the suppressed_dedup row this batch wrote


@dataclass
class _Writes:
    """Everything the batch writes, in batch order, as the write statement's arrays."""

    notifications: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class BatchDecisions:
    """One result per event (a ``DispatchResult``, or the ``Exception`` its rules raised),
    and the writes that make them true, not yet sent."""

    results: list[DispatchResult | Exception]
    channel: str
    keys: dict[str, _Key]
    writes: _Writes

    def write_statement(self, outcomes: dict[str, list[Any]]) -> tuple[str, dict[str, Any]]:
        """The batch's one write statement and its parameters, with ``outcomes``
        (``record_outcomes``'s arrays): every part as one JSON document, whose array lengths
        are what was decided; the statement fails when it writes other rows than these (the
        caller sends it with the batch's COMMIT)."""
        new = [(k, s) for k, s in self.keys.items() if not s.taken_before]
        repeated = [(k, s) for k, s in self.keys.items() if s.taken_before and s.duplicates]
        batch = {
            "new_keys": [{"key": k, "notification_id": s.notification_id, "at": s.created_at,
                          "duplicates": s.duplicates, "last_duplicate_at": s.last_duplicate_at,
                          "duplicate_notification_id": s.new_duplicate_notification_id} for k, s in new],
            "repeated_keys": [{"key": k, "duplicates": s.duplicates, "at": s.last_duplicate_at,
                               "notification_id": s.new_duplicate_notification_id} for k, s in repeated],
            "notifications": self.writes.notifications,
            "deliveries": self.writes.deliveries,
            "outcomes": [{"id": i, "status": st, "error": er, "at": at} for i, st, er, at in
                         zip(outcomes["ids"], outcomes["statuses"], outcomes["errors"], outcomes["times"],
                             strict=True)],
        }
        return "write_batch_decisions", {"batch": json.dumps(batch, default=_json_time), "channel": self.channel,
                                         "outcome_ids": list(outcomes["ids"])}


def _json_time(value: object) -> str:
    """A time in the write's JSON: ISO 8601 with its offset and microseconds (exact as timestamptz)."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} in a set-based write")


def web_only(orchestrator: Orchestrator) -> WebChannel | None:
    """The orchestrator's in-app channel when it is its only channel (the set-based case)."""
    channels = orchestrator.channels
    if len(channels) == 1 and orchestrator.web is not None and channels[0] is orchestrator.web:
        return orchestrator.web
    return None


def plan(catalogue: Catalogue, orchestrator: Orchestrator, session: Session,
         events: Sequence[DigitalTwinEvent], now: datetime,
         stop: Callable[[], bool] | None = None) -> BatchDecisions | None:
    """Decide every event of a batch as ``NudgingPlatform`` would one by one, in order, at
    ``now``, with one read; ``None`` when the orchestrator has channels other than web.

    ``stop`` is asked after each event's rules ran: when it says so (a stop arrived), only
    the events evaluated so far are decided, as the per-event path would have stopped after
    the event in hand (DEC-7); ``results`` is then shorter than ``events``.

    A rule that raises fails its own event only (its result is the exception); a database
    error propagates (the caller falls back to the per-event path).
    """
    web = web_only(orchestrator)
    if web is None:
        return None
    evaluated: list[list[tuple[Candidate, str]] | DispatchResult | Exception] = []
    for event in events:
        try:
            candidates = evaluate(catalogue, event)
            evaluated.append([(c, c.dedup_key(event)) for c in candidates])
        except RuleRefusal as refusal:
            evaluated.append(DispatchResult(outcome=refusal.outcome, refusal=str(refusal),
                                            detail={"error": refusal.reason, "detail": refusal.detail}))
        except Exception as exc:  # noqa: BLE001 - an evaluator's own error: this event fails, alone (REQ-0067)
            evaluated.append(exc)
        if stop is not None and len(evaluated) < len(events) and stop():
            break
    events = events[:len(evaluated)]
    day_start, day_end = utc_day(now)
    users = sorted({e.user_id for e, ev in zip(events, evaluated, strict=True) if isinstance(ev, list) and ev})
    keys = sorted({key for ev in evaluated if isinstance(ev, list) for _, key in ev})
    preferences, sent_today, taken = _read(session, users, keys, day_start, day_end)
    state = {key: _Key(True, duplicate_notification_id=dup) for key, dup in taken.items()}
    writes = _Writes()
    results: list[DispatchResult | Exception] = []
    for event, ev in zip(events, evaluated, strict=True):
        if not isinstance(ev, list):
            results.append(ev)
            continue
        if not ev:
            results.append(DispatchResult(outcome=DispatchOutcome.NO_RULE_TRIGGERED))
            continue
        result = DispatchResult(outcome=DispatchOutcome.SUPPRESSED)
        duplicates = 0
        for candidate, key in ev:
            prefs = preferences.get(event.user_id, Preferences(None, DEFAULT_MAX_PER_DAY))
            duplicates += _decide(web, writes, state, sent_today, prefs, result, event, candidate, key, now)
        if result.outbound:
            result.outcome = DispatchOutcome.DELIVERED
        elif duplicates == len(ev):
            result.outcome = DispatchOutcome.DUPLICATE
        results.append(result)
    return BatchDecisions(results, web.name, state, writes)


def _decide(web: WebChannel, writes: _Writes, state: dict[str, _Key], sent_today: dict[str, int],
            prefs: Preferences, result: DispatchResult, event: DigitalTwinEvent, candidate: Candidate,
            key: str, now: datetime) -> bool:
    """``Orchestrator.decide`` for one candidate on the batch's state; True for a duplicate."""
    known = state.get(key)
    if known is not None:
        known.duplicates += 1
        known.last_duplicate_at = now
        # A duplicate is recorded once per key; later repeats only bump the counter.
        if known.duplicate_notification_id is None:
            row = notification_row(event, candidate, key, now, NotificationStatus.SUPPRESSED, "suppressed_dedup",
                                   str(uuid.uuid4()))
            writes.notifications.append(row)
            known.duplicate_notification_id = known.new_duplicate_notification_id = row["id"]
        return True
    notification_id = str(uuid.uuid4())
    state[key] = _Key(False, notification_id=notification_id, created_at=now)
    if not prefs.allows(candidate.rule.kind):
        status, reason = NotificationStatus.SUPPRESSED, "kind_disabled"
    elif sent_today.get(event.user_id, 0) >= prefs.max_per_day:
        status, reason = NotificationStatus.SUPPRESSED, "rate_limited"
    else:
        status, reason = NotificationStatus.SENT, None
    row = notification_row(event, candidate, key, now, status, reason, notification_id)
    writes.notifications.append(row)
    result.notifications.append(as_recorded(row))
    if status == NotificationStatus.SENT:
        # the batch's own sends count for its later events of the same participant
        sent_today[event.user_id] = sent_today.get(event.user_id, 0) + 1
        writes.deliveries.append({"notification_id": notification_id, "user_id": event.user_id, "now": now})
        result.outbound.append(web.message(row))
    return False


def _read(session: Session, users: list[str], keys: list[str], day_start: datetime, day_end: datetime
          ) -> tuple[dict[str, Preferences], dict[str, int], dict[str, str | None]]:
    """The batch's one read: preferences by participant, today's sent count by participant,
    the keys already taken (with their suppressed_dedup notification, if any)."""
    if not users:
        return {}, {}, {}
    # sent with the checkpoint's SAVEPOINT deferred ahead of it: one round trip for both
    [rows] = pipeline.send(session, [pipeline.named("read_batch_limits", {
        "user_ids": users, "day_start": day_start, "day_end": day_end, "keys": keys,
    })])
    row = (rows or [{}])[0]
    preferences = {
        str(user): Preferences(None if kinds is None else frozenset(kinds), int(cap))
        for user, kinds, cap in row["preferences"]
    }
    sent_today = {users[int(n) - 1]: int(count) for n, count in row["sent_today"]}
    taken = {str(key): (None if dup is None else str(dup)) for key, dup in row["taken_keys"]}
    return preferences, sent_today, taken

