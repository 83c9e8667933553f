"""The schema, as typed SQLAlchemy models. Alembic migrations create it; tests check they agree.

Every table is in the scheduler's own schema (``DEFAULT_SCHEMA``, DEC-SCHEMA); a process
configured with another (``SCHEDULER_DATABASE_SCHEMA``) maps it with SQLAlchemy's
``schema_translate_map`` (``{DEFAULT_SCHEMA: schema}``).
"""

from __future__ import annotations

from datetime import datetime, time
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    Time,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from scheduler.database.queries import DEFAULT_SCHEMA

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 64
NAME_LENGTH = 200
TRACEPARENT_LENGTH = 55  # version 00: 2 + 1 + 32 + 1 + 16 + 1 + 2


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING, schema=DEFAULT_SCHEMA)


class ScheduledEvent(Base):
    """An event stored now and dispatched by the loop once ``trigger_at`` has passed."""

    __tablename__ = "scheduled_events"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'dispatched', 'failed', 'cancelled', 'expired')", name="status"),
        # an expiry is an instant after the trigger (EXP-1)
        CheckConstraint("expires_at IS NULL OR expires_at > trigger_at", name="expiry_after_trigger"),
        # a hold ends after the trigger: it is decided at a claim, at or after trigger_at (QUIET-2)
        CheckConstraint("not_before IS NULL OR not_before > trigger_at", name="not_before_after_trigger"),
        # The claim reads only pending rows in (due_at, id) order; a partial index keeps
        # its cost independent of how many dispatched and failed rows pile up, and a row
        # held in quiet hours sits at its not_before, past every row due before it (PERF-HELD).
        Index(
            "ix_scheduled_events_pending_due",
            "due_at",
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        # Operators look for failed rows; they are few, so this index stays small. The id
        # makes it the console's keyset order (rows reset or failed together share a time).
        Index(
            "ix_scheduled_events_failed",
            "updated_at",
            "id",
            postgresql_where=text("status = 'failed'"),
        ),
        # Retention finds dispatched, cancelled and expired rows older than the cutoff here.
        Index(
            "ix_scheduled_events_finished",
            "updated_at",
            postgresql_where=text("status IN ('dispatched', 'cancelled', 'expired')"),
        ),
        # The claim's expiry step (EXP-2): the pending rows that carry an expiry, by it, so the
        # expired ones are found without walking a backlog of rows that never expire.
        Index(
            "ix_scheduled_events_pending_expiry",
            "expires_at",
            "id",
            postgresql_where=text("status = 'pending' AND expires_at IS NOT NULL"),
        ),
        # The console's events page, newest change first, and the last hour's dispatches
        # for its lateness percentiles (a dispatched row's updated_at is its dispatched_at).
        Index("ix_scheduled_events_updated_at", "updated_at", "id"),
        # One participant's rows, newest change first: the console's and the API's user_id
        # filter reads one page of them at any table size (PERF-5).
        Index("ix_scheduled_events_user_id", "user_id", "updated_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    event_type: Mapped[str] = mapped_column(String(NAME_LENGTH))
    user_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    community_id: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    external_key: Mapped[str | None] = mapped_column(String(NAME_LENGTH), unique=True)
    trigger_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    facts: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Claimed after this instant, the row ends ``expired`` instead of dispatched (EXP-2,
    # DEC-EXPIRY); NULL: it never expires (REQ-0065's literal behaviour).
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The W3C traceparent of the request that stored the row (TRACE-1): the dispatch
    # span links to it. Never shown by the API; NULL when the request carried none.
    traceparent: Mapped[str | None] = mapped_column(String(TRACEPARENT_LENGTH))
    # Held in its participant's quiet hours until this instant, still pending (QUIET-2,
    # DEC-LOCAL-TIME); kept after the dispatch, cleared by a reset and a re-post by key.
    not_before: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the claim takes it: not_before when held, else trigger_at (generated, never written).
    due_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), Computed("coalesce(not_before, trigger_at)", persisted=True))


class Notification(Base):
    """A notification decided for a participant: sent, or suppressed with a reason."""

    __tablename__ = "notifications"
    __table_args__ = (
        CheckConstraint("status IN ('sent', 'suppressed', 'failed')", name="status"),
        Index("ix_notifications_user_id_created_at", "user_id", "created_at"),
        # The inbox: a participant's stream replay, and every replica's tail of the stream.
        Index("ix_notifications_user_id_stream_seq", "user_id", "stream_seq",
              postgresql_where=text("stream_seq IS NOT NULL")),
        Index("ix_notifications_stream_seq", "stream_seq", postgresql_where=text("stream_seq IS NOT NULL")),
        # The inbox's repair: sent notifications whose numbering failed after the commit (INBOX-15).
        Index("ix_notifications_unnumbered", "created_at", "id",
              postgresql_where=text("stream_seq IS NULL AND status = 'sent'")),
        # An event's page in the console lists the notifications it produced.
        Index(
            "ix_notifications_scheduled_event_id",
            "scheduled_event_id",
            postgresql_where=text("scheduled_event_id IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    community_id: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    rule_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    kind: Mapped[str] = mapped_column(String(NAME_LENGTH))
    scenario: Mapped[str] = mapped_column(String(NAME_LENGTH))
    time_scope: Mapped[str] = mapped_column(String(32))
    dedup_key: Mapped[str] = mapped_column(Text)
    title: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16))
    scheduled_event_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Given after commit, in commit order (sequence notification_stream_seq under one lock):
    # the SSE event id, so that a Last-Event-ID replay misses nothing. NULL: never streamed.
    stream_seq: Mapped[int | None] = mapped_column(BigInteger)


class ScheduledEventHistory(Base):
    """One change of a scheduled event, appended by a trigger in the changing transaction."""

    __tablename__ = "scheduled_event_history"
    __table_args__ = (Index("ix_scheduled_event_history_event_id", "event_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # No foreign key: retention deletes a row and its history in one statement.
    event_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # the row's updated_at
    change: Mapped[str] = mapped_column(String(32))  # stored, rewritten, dispatched, failed, reset, cancelled
    actor: Mapped[str | None] = mapped_column(String(NAME_LENGTH))  # the token's subject, if one did it
    status: Mapped[str] = mapped_column(String(16))  # the status after the change
    changes: Mapped[dict[str, Any]] = mapped_column(JSONB)  # column -> [before, after]


class MaintenanceRun(Base):
    """When a periodic task (retention) last started, shared by every replica."""

    __tablename__ = "scheduler_maintenance"

    task: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class DedupKey(Base):
    """One row per deduplication key; the primary key is the arbiter between racing writers."""

    __tablename__ = "dedup_keys"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    # No foreign key: the key is claimed before its notification row is written.
    notification_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    duplicate_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_duplicate_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    duplicate_notification_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class Delivery(Base):
    """The delivery log: one row per channel a notification was written to. Its pages are half
    filled (fillfactor 50, migration 0003), so the worker's claim updates a row in place
    (DEC-OUTBOX-STORAGE)."""

    __tablename__ = "deliveries"
    __table_args__ = (
        # A participant's sent deliveries, by time (the daily cap counts notifications: QUIET-4).
        Index(
            "ix_deliveries_sent_by_user",
            "user_id",
            "created_at",
            postgresql_where=text("status = 'sent'"),
        ),
        # The outbox's due rows, in the worker's claim order (DEC-OUTBOX).
        Index("ix_deliveries_due", "next_attempt_at", "id",
              postgresql_where=text("status IN ('queued', 'retrying')")),
        Index("ix_deliveries_idempotency_key", "idempotency_key", unique=True,
              postgresql_where=text("idempotency_key IS NOT NULL")),
        Index("ix_deliveries_push_subscription_id", "push_subscription_id",
              postgresql_where=text("push_subscription_id IS NOT NULL")),
        # The rows an operator may retry, newest first (the console's list and bulk retry, OUTBOX-9).
        Index("ix_deliveries_retryable", "id", postgresql_where=text("status IN ('retrying', 'undeliverable')")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # No foreign key: a host dispatcher's outbox row names the host's own message (OUTBOX-7);
    # retention deletes a notification's deliveries with it (RET-8).
    notification_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    user_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    channel: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the outbox (DEC-OUTBOX): set for a row of a channel with a Sender
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    message: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    leased_by: Mapped[str | None] = mapped_column(String(64))
    last_error: Mapped[str | None] = mapped_column(Text)
    last_delay_seconds: Mapped[float | None] = mapped_column(Float)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    provider_status: Mapped[int | None] = mapped_column(Integer)
    provider_answer: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # a web_push row's subscription (migration 0002); NULL once the subscription is removed
    push_subscription_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("push_subscriptions.id", ondelete="SET NULL"))


class PushSubscription(Base):
    """A participant's browser subscribed to web push (``PUT /me/push-subscriptions``, the W3C
    ``PushSubscription``): migration 0002. Unique by endpoint; the keys as bytes."""

    __tablename__ = "push_subscriptions"
    __table_args__ = (
        CheckConstraint("octet_length(p256dh) = 65", name="p256dh_point"),
        CheckConstraint("octet_length(auth) = 16", name="auth_secret"),
        CheckConstraint("char_length(endpoint) <= 2048", name="endpoint_length"),
        Index("ix_push_subscriptions_user_id", "user_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(NAME_LENGTH))
    endpoint: Mapped[str] = mapped_column(Text, unique=True)
    p256dh: Mapped[bytes] = mapped_column(LargeBinary)
    auth: Mapped[bytes] = mapped_column(LargeBinary)
    expiration_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ParticipantPreference(Base):
    """A participant's choices: which kinds they want (NULL: all), their daily cap, their
    time zone (NULL: UTC) and their quiet hours (both ends or neither, LOCAL-2)."""

    __tablename__ = "participant_preferences"
    __table_args__ = (
        CheckConstraint("(quiet_hours_start IS NULL) = (quiet_hours_end IS NULL)", name="quiet_hours_both"),
        CheckConstraint("quiet_hours_start IS NULL OR quiet_hours_start <> quiet_hours_end",
                        name="quiet_hours_differ"),
    )

    user_id: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    enabled_kinds: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    max_per_day: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    time_zone: Mapped[str | None] = mapped_column(Text)
    quiet_hours_start: Mapped[time | None] = mapped_column(Time)
    quiet_hours_end: Mapped[time | None] = mapped_column(Time)


class SchedulerReplica(Base):
    """A heartbeat: one row per process that runs the loop, rewritten after its polls."""

    __tablename__ = "scheduler_replicas"

    replica_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))
    poll_seconds: Mapped[float] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_poll_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    consecutive_failures: Mapped[int] = mapped_column(Integer)
    polls: Mapped[int] = mapped_column(BigInteger)
    dispatched: Mapped[int] = mapped_column(BigInteger)
    failed: Mapped[int] = mapped_column(BigInteger)
    # events its claims ended expired (EXP-2), as /metrics counts them (OBS-7)
    expired: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class OperatorAction(Base):
    """The audit trail: every reset an operator made, by whom, why, and on what."""

    __tablename__ = "operator_actions"
    __table_args__ = (Index("ix_operator_actions_at", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(NAME_LENGTH))
    source: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(32))
    event_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    filter: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    count: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)


class OperatorActionEvent(Base):
    """Which rows an action touched, so an event's page can show its history."""

    __tablename__ = "operator_action_events"
    __table_args__ = (Index("ix_operator_action_events_event_id", "event_id"),)

    action_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("operator_actions.id", ondelete="CASCADE"), primary_key=True
    )
    event_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)


class WebSession(Base):
    """A signed-in browser (the console's admin, the inbox's participant): migration 0006.

    The cookie holds a random session id; only its SHA-256 (``secret_hash``) is stored.
    ``id`` is a public handle for lists and for ending a session.
    """

    __tablename__ = "web_sessions"
    __table_args__ = (
        CheckConstraint("kind IN ('admin', 'participant')", name="kind"),
        Index("ix_web_sessions_expires_at", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    subject: Mapped[str] = mapped_column(String(NAME_LENGTH))
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    idle_seconds: Mapped[int] = mapped_column(Integer)
    user_agent: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
