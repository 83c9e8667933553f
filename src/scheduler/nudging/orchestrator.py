"""The orchestrator's vocabulary: preferences and the daily cap's day, the channels a sent
notification is delivered through, the rows a decision writes, and the publishers that push
its messages once its transaction has committed.

The decision itself (deduplication, preferences, the cap, delivery) is ``nudging.decision``:
one function over a batch's state, for a live event and a scheduled batch alike (REQ-0066).
A channel takes part in it without a session: it says which delivery rows it writes and
which messages leave after the commit (``Channel.deliver``), and the batch's one write
statement writes its rows with everything else.
"""

from __future__ import annotations

import inspect
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo
from typing import Any, Protocol

from scheduler.nudging.local_time import (
    QuietHours,
    local_day_bounds,
    quiet_hours_end,
    zone_or_default,
)
from scheduler.nudging.rules import Candidate
from scheduler.types import DigitalTwinEvent, NotificationStatus, OutboundMessage

DEFAULT_MAX_PER_DAY = 3

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preferences:
    """A participant's enabled kinds (``None``: all), daily cap, time zone (its stored name,
    ``None``: UTC) and quiet hours (``None``: none), DEC-LOCAL-TIME."""

    enabled_kinds: frozenset[str] | None
    max_per_day: int
    time_zone: str | None = None
    quiet_hours: QuietHours | None = None

    def allows(self, kind: str) -> bool:
        return self.enabled_kinds is None or kind in self.enabled_kinds

    def zone(self) -> tzinfo:
        """The participant's zone; a stored name the installed tz database no longer holds
        raises ``LocalTimeError`` (that participant's events fail, alone: QUIET-6)."""
        return zone_or_default(self.time_zone)

    def hold_until(self, now: datetime) -> datetime | None:
        """When the quiet hours holding ``now`` end (the row's ``not_before``), or ``None``
        when the participant is not in quiet hours at ``now`` (QUIET-2, LOCAL-4)."""
        if self.quiet_hours is None:
            return None
        return quiet_hours_end(now, self.zone(), self.quiet_hours)

    def day(self, now: datetime) -> tuple[datetime, datetime]:
        """The participant's local calendar day holding ``now``: the window the daily cap
        counts (QUIET-4, LOCAL-5); the UTC day for the default zone (DEC-4)."""
        return local_day_bounds(now, self.zone())


# A participant without a preferences row: every kind enabled, the default cap, UTC, no quiet hours.
DEFAULT_PREFERENCES = Preferences(None, DEFAULT_MAX_PER_DAY)


def utc_day(now: datetime) -> tuple[datetime, datetime]:
    """The UTC day containing ``now`` (in whatever zone it is given): the window the daily cap counts (DEC-4)."""
    utc = now.astimezone(UTC)
    start = datetime.combine(utc.date(), time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


# Every local day lies within this much of each of its instants (LOCAL-5): the cap reads a
# participant's sent notifications in [now - CAP_WINDOW, now + CAP_WINDOW) and counts those in
# their day in Python (QUIET-4).
CAP_WINDOW = timedelta(hours=48)


@dataclass(frozen=True)
class DeliveryRow:
    """One row of the delivery log a channel writes for a sent notification. An ``outbox`` row
    (a channel with a ``Sender``, DEC-OUTBOX) is written ``queued`` instead, for the delivery
    worker to send: it records the delivery's progress. The daily cap counts sent
    notifications (the decision's own record), not delivery rows (QUIET-4)."""

    channel: str
    status: NotificationStatus
    detail: str | None = None
    outbox: bool = False
    # web push (PUSH-6): the write queues one outbox row per subscription of the participant
    per_subscription: bool = False


@dataclass(frozen=True)
class Delivery:
    """What a channel does with one sent notification: the delivery rows it contributes to
    the batch's one write, and the messages a publisher pushes after that write commits."""

    rows: tuple[DeliveryRow, ...] = ()
    outbound: tuple[OutboundMessage, ...] = ()


class Channel(Protocol):
    """Delivers a sent notification: decides its delivery rows and outbound messages without
    writing anything itself (the batch's write statement writes the rows, inside the dispatch
    transaction; nothing leaves the process before it commits).

    ``notification`` is the notification as recorded (``as_recorded``: its columns, with
    ``created_at``). A channel must decide the same way when asked again for the same
    notification (a failure elsewhere in a batch replays it)."""

    name: str

    def deliver(self, notification: Mapping[str, Any], now: datetime) -> Delivery: ...


class WebChannel:
    """The in-app channel: the notification row is the message; the delivery log records it."""

    name = "web"

    def deliver(self, notification: Mapping[str, Any], now: datetime) -> Delivery:
        return Delivery(rows=(DeliveryRow(self.name, NotificationStatus.SENT),), outbound=(self.message(notification),))

    def message(self, notification: Mapping[str, Any]) -> OutboundMessage:
        """The push for a notification delivered in-app."""
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


# The namespace of outbox idempotency keys: a delivery's key is a UUID 5 of its notification
# and channel, so a decision replayed for the same notification (DEC-1.4) keys it the same.
OUTBOX_KEYS = uuid.UUID("5b0c9d1e-4f57-4a55-9c55-6f75d3e1a0b7")


def idempotency_key(notification_id: str, channel: str) -> str:
    """The delivery's idempotency key, the same on every attempt (a webhook's ``webhook-id``)."""
    return str(uuid.uuid5(OUTBOX_KEYS, f"{notification_id}/{channel}"))


class OutboxChannel:
    """A channel whose message leaves through a ``Sender`` (the webhook, a host's own): its
    row is the outbox entry, written ``queued`` in the dispatch transaction and sent by the
    delivery worker after the commit, at least once (DEC-OUTBOX); no message for the publisher."""

    def __init__(self, name: str, *, per_subscription: bool = False) -> None:
        self.name = name
        # web push: one row per push subscription of the participant, found by the write (PUSH-6)
        self.per_subscription = per_subscription

    def __repr__(self) -> str:
        return f"OutboxChannel({self.name!r})"

    def deliver(self, notification: Mapping[str, Any], now: datetime) -> Delivery:
        return Delivery(rows=(DeliveryRow(self.name, NotificationStatus.SENT, outbox=True,
                                          per_subscription=self.per_subscription),))


def outbox_message(notification: Mapping[str, Any]) -> dict[str, Any]:
    """What an outbox row keeps of its notification for the sender (``OutboundDelivery``'s fields)."""
    created = notification["created_at"]
    return {"community_id": notification["community_id"], "kind": notification["kind"],
            "title": notification["title"], "body": notification["body"],
            "created_at": created.isoformat() if isinstance(created, datetime) else created}


def notification_row(event: DigitalTwinEvent, candidate: Candidate, key: str, now: datetime,
                     status: NotificationStatus, reason: str | None, notification_id: str) -> dict[str, Any]:
    """The notification one decision records, as the write statement takes it (``now`` is
    its ``created_at``)."""
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


def as_recorded(row: Mapping[str, Any]) -> dict[str, Any]:
    """A notification as it was recorded: the row's ``now`` is its ``created_at``."""
    notification = {k: v for k, v in row.items() if k != "now"}
    notification["created_at"] = row["now"]
    return notification


class Orchestrator:
    """The channels a sent notification is delivered through, in order (the in-app channel
    alone by default)."""

    def __init__(self, channels: Iterable[Channel] | None = None) -> None:
        self.channels: tuple[Channel, ...] = tuple(channels) if channels is not None else (WebChannel(),)
        for channel in self.channels:
            _check_channel(channel)

    def deliver(self, notification: Mapping[str, Any],
                now: datetime) -> tuple[list[DeliveryRow], list[OutboundMessage]]:
        """Every channel's delivery rows and messages for one sent notification, channel by channel."""
        rows: list[DeliveryRow] = []
        outbound: list[OutboundMessage] = []
        for channel in self.channels:
            delivery = channel.deliver(notification, now)
            rows.extend(delivery.rows)
            outbound.extend(delivery.outbound)
        return rows, outbound


def _check_channel(channel: Channel) -> None:
    """Refuse, when the orchestrator is built, a channel written for the protocol before the one
    decision (``deliver(session, notification, now)`` writing its own rows): its rows now join
    the batch's write (CHANGELOG.md)."""
    deliver = getattr(channel, "deliver", None)
    if deliver is None or not isinstance(getattr(channel, "name", None), str):
        raise TypeError(f"{channel!r} is not a Channel: it needs a name and deliver(notification, now)")
    parameters = list(inspect.signature(deliver).parameters.values())
    required = [p for p in parameters if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if (parameters and parameters[0].name == "session") or len(required) == 3:
        raise TypeError(
            f"channel {channel.name!r}: deliver(session, notification, now) is the old Channel protocol; "
            "a channel now returns its delivery rows and messages from deliver(notification, now) -> Delivery, "
            "and the batch's one write statement writes them (see CHANGELOG.md)")


# -- publishers: where a delivered notification goes once its transaction has committed --


class LoggingPublisher:
    """The default: logs each push at DEBUG (its row records it; a line per notification at
    INFO costs a busy replica a twelfth of its time). A browser push channel plugs in here."""

    def publish(self, message: OutboundMessage) -> None:
        logger.debug(
            "notification %s (%s) for %s: %s", message.notification_id, message.kind, message.user_id, message.title
        )


class RecordingPublisher:
    """A fake for tests and the simulation: remembers what was pushed, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[OutboundMessage] = []

    def publish(self, message: OutboundMessage) -> None:
        with self._lock:
            self.messages.append(message)
