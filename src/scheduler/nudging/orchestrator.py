"""The orchestrator: deduplication, preferences, the daily cap and delivery.

Everything here writes inside the caller's transaction; nothing leaves the process until
that transaction commits (the caller hands ``DispatchResult.outbound`` to a publisher).

Concurrency. Every decision about one participant happens under that participant's
transaction-level advisory lock. The cap (count today's sent deliveries, then add one)
is therefore exact across replicas, and because a deduplication key names its
participant, two writers of one key are serialised by the same lock; the key's primary
key remains the arbiter all the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any, Protocol

from sqlalchemy.orm import Session

from scheduler.core.participant_locks import lock_participant
from scheduler.database.queries import statement
from scheduler.nudging.rule_engine import Candidate
from scheduler.types import DigitalTwinEvent, NotificationStatus, OutboundMessage

DEFAULT_MAX_PER_DAY = 3


@dataclass(frozen=True)
class Preferences:
    enabled_kinds: frozenset[str] | None
    max_per_day: int

    def allows(self, kind: str) -> bool:
        return self.enabled_kinds is None or kind in self.enabled_kinds


def utc_day(now: datetime) -> tuple[datetime, datetime]:
    """The UTC day containing ``now`` (in whatever zone it is given): the window the daily cap counts (DEC-4)."""
    utc = now.astimezone(UTC)
    start = datetime.combine(utc.date(), time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


@dataclass(frozen=True)
class KeyClaim:
    """A deduplication key claimed (or found taken), with what the cap and preferences need."""

    claimed: bool
    preferences: Preferences
    sent_today: int


def claim_key_with_limits(session: Session, key: str, notification_id: str, user_id: str, now: datetime) -> KeyClaim:
    """Claim ``key`` for ``notification_id`` and read the participant's preferences and
    today's sent deliveries, in one round trip (the caller holds the participant's lock)."""
    day_start, day_end = utc_day(now)
    row = session.execute(
        statement("claim_dedup_key_with_limits"),
        {"key": key, "notification_id": notification_id, "now": now, "user_id": user_id,
         "day_start": day_start, "day_end": day_end},
    ).one()
    if row.has_preferences:
        kinds = row.enabled_kinds
        preferences = Preferences(None if kinds is None else frozenset(kinds), int(row.max_per_day))
    else:
        preferences = Preferences(None, DEFAULT_MAX_PER_DAY)
    return KeyClaim(bool(row.claimed), preferences, int(row.sent_today))


class Channel(Protocol):
    """Writes one delivery of a notification inside the dispatch transaction."""

    name: str

    def deliver(self, session: Session, notification: dict[str, Any], now: datetime) -> OutboundMessage | None: ...


class WebChannel:
    """The in-app channel: the notification row is the message; the delivery log records it."""

    name = "web"

    def deliver(self, session: Session, notification: dict[str, Any], now: datetime) -> OutboundMessage | None:
        session.execute(
            statement("insert_delivery"),
            {
                "notification_id": notification["id"],
                "user_id": notification["user_id"],
                "channel": self.name,
                "status": NotificationStatus.SENT,
                "detail": None,
                "now": now,
            },
        )
        return self.message(notification)

    def message(self, notification: dict[str, Any]) -> OutboundMessage:
        """The push for a notification whose delivery row is already written."""
        return OutboundMessage(
            notification_id=notification["id"],
            user_id=notification["user_id"],
            community_id=notification["community_id"],
            channel=self.name,
            kind=notification["kind"],
            title=notification["title"],
            body=notification["body"],
            rule_id=notification["rule_id"],
        )


def notification_row(event: DigitalTwinEvent, candidate: Candidate, key: str, now: datetime,
                     status: NotificationStatus, reason: str | None, notification_id: str) -> dict[str, Any]:
    """The ``insert_notification`` parameters of one decision (the set-based path writes the same)."""
    return {
        "id": notification_id,
        "user_id": event.user_id,
        "community_id": event.community_id,
        "rule_id": candidate.rule.id,
        "kind": candidate.rule.kind,
        "scenario": candidate.scenario,
        "time_scope": candidate.scope.value,
        "dedup_key": key,
        "title": candidate.title,
        "body": candidate.body,
        "status": status,
        "reason": reason,
        "source": "scheduled" if event.scheduled_event_id else "live",
        "scheduled_event_id": event.scheduled_event_id,
        "now": now,
    }


def as_recorded(row: dict[str, Any]) -> dict[str, Any]:
    """A notification as it was recorded: the insert's ``now`` parameter is its ``created_at``."""
    notification = {k: v for k, v in row.items() if k != "now"}
    notification["created_at"] = row["now"]
    return notification


@dataclass
class Decision:
    """What became of one candidate."""

    notification: dict[str, Any] | None
    duplicate: bool
    outbound: list[OutboundMessage]


class Orchestrator:
    """Turns the engine's candidates into notifications, honouring dedup, preferences and cap."""

    def __init__(self, channels: Iterable[Channel] | None = None) -> None:
        self.channels: tuple[Channel, ...] = tuple(channels) if channels is not None else (WebChannel(),)
        # The in-app channel's delivery row is written by the statement that records its
        # notification (one round trip instead of two); other channels deliver themselves.
        self.web = next((c for c in self.channels if type(c) is WebChannel), None)

    def _record(
        self,
        session: Session,
        event: DigitalTwinEvent,
        candidate: Candidate,
        key: str,
        now: datetime,
        status: NotificationStatus,
        reason: str | None,
        notification_id: str | None = None,
        web: WebChannel | None = None,
    ) -> dict[str, Any]:
        row = notification_row(event, candidate, key, now, status, reason, notification_id or str(uuid.uuid4()))
        if web is None:
            session.execute(statement("insert_notification"), row)
        else:
            session.execute(statement("insert_notification_with_delivery"), {**row, "channel": web.name})
        return row

    def decide(self, session: Session, event: DigitalTwinEvent, candidate: Candidate, now: datetime) -> Decision:
        """Deduplicate, filter by preference and cap, then deliver one candidate."""
        lock_participant(session, event.user_id)
        key = candidate.dedup_key(event)
        notification_id = str(uuid.uuid4())
        claim = claim_key_with_limits(session, key, notification_id, event.user_id, now)
        if not claim.claimed:
            repeat = session.execute(statement("record_duplicate"), {"key": key, "now": now}).one()
            # A duplicate is recorded once per key; later repeats only bump the counter.
            if repeat.duplicate_notification_id is None:
                row = self._record(session, event, candidate, key, now, NotificationStatus.SUPPRESSED, "suppressed_dedup")
                session.execute(
                    statement("link_duplicate_notification"), {"key": key, "notification_id": row["id"]}
                )
            return Decision(None, True, [])

        if not claim.preferences.allows(candidate.rule.kind):
            row = self._record(session, event, candidate, key, now, NotificationStatus.SUPPRESSED, "kind_disabled", notification_id)
            return Decision(row, False, [])
        if claim.sent_today >= claim.preferences.max_per_day:
            row = self._record(session, event, candidate, key, now, NotificationStatus.SUPPRESSED, "rate_limited", notification_id)
            return Decision(row, False, [])

        row = self._record(session, event, candidate, key, now, NotificationStatus.SENT, None, notification_id, self.web)
        outbound = []
        for channel in self.channels:
            if channel is self.web:
                message: OutboundMessage | None = self.web.message(row)
            else:
                message = channel.deliver(session, row, now)
            if message is not None:
                outbound.append(message)
        return Decision(row, False, outbound)
