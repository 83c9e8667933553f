"""The scheduler's schema: every table, index, constraint, sequence, trigger function and trigger.

Everything is created in the scheduler's schema of its own (``SCHEDULER_DATABASE_SCHEMA``,
DEC-SCHEMA): the migration's transaction has ``search_path`` set to that schema alone (see
``env.py``), so the names below need no schema, except inside the history trigger's body.

- ``scheduled_events``: the stored events. The claim reads only pending rows in
  ``(due_at, id)`` order (``ix_scheduled_events_pending_due``, partial, so its cost does not
  grow with the finished rows); ``expires_at`` (EXP-*, ``CHECK (expires_at > trigger_at)``) is
  found by ``ix_scheduled_events_pending_expiry``; retention finds old finished rows by
  ``ix_scheduled_events_finished``; the console and the API page by ``(updated_at, id)``, over
  every row, over failed rows and over one participant's (``ix_scheduled_events_user_id``).
  ``traceparent`` is the W3C trace context of the request that stored the row. The table is
  vacuumed early (1 %, at least 1000 rows): every dispatch leaves a dead entry in the pending
  index, and the benchmark measured the claim at 0.48 ms after VACUUM but 8.8 ms with a million
  of them.
- ``scheduled_event_history``: one row per change of a scheduled event, appended by the trigger
  ``tr_scheduled_events_history`` in the changing transaction, so no writer (the API, the loop,
  an operator's psql) can change a row without it. A writer may name the change and the actor
  with ``set_config('scheduler.change', ..., true)`` and ``set_config('scheduler.actor', ...,
  true)``; the time is the row's ``updated_at``. The function names its table with the schema:
  a trigger function resolves names with the firing session's ``search_path``, and a host's
  session would find no history table there, or one of the host's.
- ``tr_scheduled_events_announce_due``: every row left pending (stored, rewritten, reset) is
  announced on the channel ``scheduler_due`` with its ``due_at`` (ISO 8601, UTC), delivered
  at commit, whatever wrote it: prompt-mode replicas LISTEN (DEC-9). A row held in its
  participant's quiet hours (``not_before``, QUIET-*) is due at ``due_at``, the generated
  ``coalesce(not_before, trigger_at)``: its trigger_at when nothing holds it.
- ``notifications`` (with ``stream_seq`` from ``notification_stream_seq``, the inbox stream's
  order, given after commit), ``dedup_keys``, ``deliveries``, ``participant_preferences``.
  ``deliveries`` is the delivery log and the outbox (DEC-OUTBOX): a channel with a ``Sender``
  writes its row ``queued``; the worker finds due rows by ``ix_deliveries_due``.
- ``scheduler_maintenance`` (when retention last ran), ``scheduler_replicas`` (heartbeats),
  ``operator_actions`` and ``operator_action_events`` (the audit trail), ``web_sessions`` (the
  console's and the inbox page's sessions; only the SHA-256 of a session id is stored).

Revision ID: 0001_initial
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

ANNOUNCE_DUE_FUNCTION = """
CREATE FUNCTION scheduled_events_announce_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'scheduler_due',
        to_char(NEW.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
    );
    RETURN NULL;
END
$$
"""

# {schema} is the schema's quoted name (the body's one qualified name, see the module)
HISTORY_FUNCTION = """
CREATE FUNCTION scheduled_events_history() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    change text;
    diff jsonb := '{}'::jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        change := 'stored';
    ELSE
        -- the writer's own name for the change (rewritten, reset), else the new status
        change := coalesce(
            nullif(current_setting('scheduler.change', true), ''),
            CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN NEW.status
                 -- held in its participant's quiet hours, still pending (DEC-LOCAL-TIME)
                 WHEN NEW.not_before IS DISTINCT FROM OLD.not_before AND NEW.not_before IS NOT NULL THEN 'held'
                 ELSE 'updated' END);
        IF NEW.event_type IS DISTINCT FROM OLD.event_type THEN
            diff := diff || jsonb_build_object('event_type', jsonb_build_array(OLD.event_type, NEW.event_type));
        END IF;
        IF NEW.user_id IS DISTINCT FROM OLD.user_id THEN
            diff := diff || jsonb_build_object('user_id', jsonb_build_array(OLD.user_id, NEW.user_id));
        END IF;
        IF NEW.community_id IS DISTINCT FROM OLD.community_id THEN
            diff := diff || jsonb_build_object('community_id', jsonb_build_array(OLD.community_id, NEW.community_id));
        END IF;
        IF NEW.trigger_at IS DISTINCT FROM OLD.trigger_at THEN
            diff := diff || jsonb_build_object('trigger_at', jsonb_build_array(OLD.trigger_at, NEW.trigger_at));
        END IF;
        IF NEW.expires_at IS DISTINCT FROM OLD.expires_at THEN
            diff := diff || jsonb_build_object('expires_at', jsonb_build_array(OLD.expires_at, NEW.expires_at));
        END IF;
        IF NEW.facts IS DISTINCT FROM OLD.facts THEN
            diff := diff || jsonb_build_object('facts', jsonb_build_array(OLD.facts, NEW.facts));
        END IF;
        IF NEW.not_before IS DISTINCT FROM OLD.not_before THEN
            diff := diff || jsonb_build_object('not_before', jsonb_build_array(OLD.not_before, NEW.not_before));
        END IF;
        IF NEW.status IS DISTINCT FROM OLD.status THEN
            diff := diff || jsonb_build_object('status', jsonb_build_array(OLD.status, NEW.status));
        END IF;
        IF NEW.last_error IS DISTINCT FROM OLD.last_error THEN
            diff := diff || jsonb_build_object('last_error', jsonb_build_array(OLD.last_error, NEW.last_error));
        END IF;
    END IF;
    INSERT INTO {schema}.scheduled_event_history (event_id, at, change, actor, status, changes)
    VALUES (NEW.id, NEW.updated_at, change,
            nullif(current_setting('scheduler.actor', true), ''), NEW.status, diff);
    RETURN NULL;
END
$$;
"""


def _quoted_schema() -> str:
    """The schema being migrated (this transaction's search_path is that schema alone), quoted."""
    schema = str(op.get_bind().execute(text("SELECT current_schema()")).scalar_one())
    return '"' + schema.replace('"', '""') + '"'


def upgrade() -> None:
    op.create_table(
        "scheduled_events",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(200), nullable=False),
        sa.Column("user_id", sa.String(200), nullable=False),
        sa.Column("community_id", sa.String(200), nullable=True),
        sa.Column("external_key", sa.String(200), nullable=True),
        sa.Column("trigger_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("facts", postgresql.JSONB(), nullable=False),
        sa.Column("status", sa.String(16), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("traceparent", sa.String(55), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        # held in its participant's quiet hours until this instant (QUIET-*, DEC-LOCAL-TIME)
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        # when the claim takes it: its trigger_at, or the end of the quiet hours that hold it
        sa.Column("due_at", sa.DateTime(timezone=True), sa.Computed("coalesce(not_before, trigger_at)", persisted=True),
                  nullable=True),
        sa.CheckConstraint("status IN ('pending', 'dispatched', 'failed', 'cancelled', 'expired')",
                           name=op.f("ck_scheduled_events_ck_scheduled_events_status")),
        sa.CheckConstraint("expires_at IS NULL OR expires_at > trigger_at",
                           name=op.f("ck_scheduled_events_ck_scheduled_events_expiry_after_trigger")),
        sa.CheckConstraint("not_before IS NULL OR not_before > trigger_at",
                           name=op.f("ck_scheduled_events_ck_scheduled_events_not_before_after_trigger")),
        sa.PrimaryKeyConstraint("id", name="pk_scheduled_events"),
        sa.UniqueConstraint("external_key", name="uq_scheduled_events_external_key"),
    )
    op.execute("ALTER TABLE scheduled_events SET "
               "(autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000)")
    op.create_index("ix_scheduled_events_pending_due", "scheduled_events", ["due_at", "id"],
                    postgresql_where=sa.text("status = 'pending'"))
    op.create_index("ix_scheduled_events_pending_expiry", "scheduled_events", ["expires_at", "id"],
                    postgresql_where=sa.text("status = 'pending' AND expires_at IS NOT NULL"))
    op.create_index("ix_scheduled_events_failed", "scheduled_events", ["updated_at", "id"],
                    postgresql_where=sa.text("status = 'failed'"))
    op.create_index("ix_scheduled_events_finished", "scheduled_events", ["updated_at"],
                    postgresql_where=sa.text("status IN ('dispatched', 'cancelled', 'expired')"))
    op.create_index("ix_scheduled_events_updated_at", "scheduled_events", ["updated_at", "id"])
    op.create_index("ix_scheduled_events_user_id", "scheduled_events", ["user_id", "updated_at", "id"])

    op.create_table(
        "scheduled_event_history",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("change", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(200), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("changes", postgresql.JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scheduled_event_history"),
    )
    op.create_index("ix_scheduled_event_history_event_id", "scheduled_event_history", ["event_id", "id"])
    op.execute(HISTORY_FUNCTION.replace("{schema}", _quoted_schema()))
    op.execute("CREATE TRIGGER tr_scheduled_events_history AFTER INSERT OR UPDATE ON scheduled_events "
               "FOR EACH ROW EXECUTE FUNCTION scheduled_events_history()")
    op.execute(ANNOUNCE_DUE_FUNCTION)
    op.execute("CREATE TRIGGER tr_scheduled_events_announce_due "
               "AFTER INSERT OR UPDATE OF status, trigger_at, not_before ON scheduled_events "
               "FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION scheduled_events_announce_due()")

    op.execute("CREATE SEQUENCE notification_stream_seq")
    op.create_table(
        "notifications",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(200), nullable=False),
        sa.Column("community_id", sa.String(200), nullable=True),
        sa.Column("rule_id", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("scenario", sa.String(200), nullable=False),
        sa.Column("time_scope", sa.String(32), nullable=False),
        sa.Column("dedup_key", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("scheduled_event_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("status IN ('sent', 'suppressed', 'failed')",
                           name=op.f("ck_notifications_ck_notifications_status")),
        sa.PrimaryKeyConstraint("id", name="pk_notifications"),
    )
    op.create_index("ix_notifications_user_id_created_at", "notifications", ["user_id", "created_at"])
    op.create_index("ix_notifications_user_id_stream_seq", "notifications", ["user_id", "stream_seq"],
                    postgresql_where=sa.text("stream_seq IS NOT NULL"))
    op.create_index("ix_notifications_stream_seq", "notifications", ["stream_seq"],
                    postgresql_where=sa.text("stream_seq IS NOT NULL"))
    op.create_index("ix_notifications_unnumbered", "notifications", ["created_at", "id"],
                    postgresql_where=sa.text("stream_seq IS NULL AND status = 'sent'"))
    op.create_index("ix_notifications_scheduled_event_id", "notifications", ["scheduled_event_id"],
                    postgresql_where=sa.text("scheduled_event_id IS NOT NULL"))

    op.create_table(
        "dedup_keys",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("notification_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duplicate_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_duplicate_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duplicate_notification_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_dedup_keys"),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("notification_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(200), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        # the outbox (DEC-OUTBOX, OUTBOX-*): a row of a channel with a Sender is written
        # ``queued`` with its idempotency key and message; the delivery worker claims it when
        # ``next_attempt_at`` has come and no live lease holds it, and records each attempt
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("message", postgresql.JSONB(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("leased_by", sa.String(64), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_delay_seconds", sa.Float(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("provider_status", sa.Integer(), nullable=True),
        sa.Column("provider_answer", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        # no foreign key: a host dispatcher's outbox row names the host's own message
        # (OUTBOX-7); retention deletes a notification's deliveries with it (RET-8)
        sa.PrimaryKeyConstraint("id", name="pk_deliveries"),
    )
    op.create_index("ix_deliveries_notification_id", "deliveries", ["notification_id"])
    op.create_index("ix_deliveries_sent_by_user", "deliveries", ["user_id", "created_at"],
                    postgresql_where=sa.text("status = 'sent'"))
    # the outbox's due rows, in the order the worker claims them (partial: delivered and
    # undeliverable rows leave it)
    op.create_index("ix_deliveries_due", "deliveries", ["next_attempt_at", "id"],
                    postgresql_where=sa.text("status IN ('queued', 'retrying')"))
    op.create_index("ix_deliveries_idempotency_key", "deliveries", ["idempotency_key"], unique=True,
                    postgresql_where=sa.text("idempotency_key IS NOT NULL"))
    # the rows an operator may retry (the console's list and bulk retry)
    op.create_index("ix_deliveries_retryable", "deliveries", ["id"],
                    postgresql_where=sa.text("status IN ('retrying', 'undeliverable')"))
    op.create_table(
        "participant_preferences",
        sa.Column("user_id", sa.String(200), nullable=False),
        sa.Column("enabled_kinds", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("max_per_day", sa.Integer(), server_default=sa.text("3"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        # an IANA name (NULL: UTC) and local quiet hours [start, end) (both or neither: none)
        sa.Column("time_zone", sa.Text(), nullable=True),
        sa.Column("quiet_hours_start", sa.Time(), nullable=True),
        sa.Column("quiet_hours_end", sa.Time(), nullable=True),
        sa.CheckConstraint("(quiet_hours_start IS NULL) = (quiet_hours_end IS NULL)",
                           name=op.f("ck_participant_preferences_ck_participant_preferences_quiet_hours_both")),
        sa.CheckConstraint("quiet_hours_start IS NULL OR quiet_hours_start <> quiet_hours_end",
                           name=op.f("ck_participant_preferences_ck_participant_preferences_quiet_hours_differ")),
        sa.PrimaryKeyConstraint("user_id", name="pk_participant_preferences"),
    )

    op.create_table(
        "scheduler_maintenance",
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task", name="pk_scheduler_maintenance"),
    )
    op.create_table(
        "scheduler_replicas",
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("poll_seconds", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_poll_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("polls", sa.BigInteger(), nullable=False),
        sa.Column("dispatched", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        # events its claims ended expired (EXP-2), as /metrics counts them (OBS-7)
        sa.Column("expired", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("replica_id", name="pk_scheduler_replicas"),
    )
    op.create_table(
        "operator_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=True),
        sa.Column("filter", postgresql.JSONB(), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_operator_actions"),
    )
    op.create_index("ix_operator_actions_at", "operator_actions", ["at"])
    op.create_table(
        "operator_action_events",
        sa.Column("action_id", sa.BigInteger(), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["action_id"], ["operator_actions.id"],
                                name="fk_operator_action_events_action_id_operator_actions", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("action_id", "event_id", name="pk_operator_action_events"),
    )
    op.create_index("ix_operator_action_events_event_id", "operator_action_events", ["event_id"])
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("idle_seconds", sa.Integer(), nullable=False),
        sa.Column("user_agent", sa.String(200), nullable=True),
        sa.CheckConstraint("kind IN ('admin', 'participant')", name=op.f("ck_web_sessions_ck_web_sessions_kind")),
        sa.PrimaryKeyConstraint("id", name="pk_web_sessions"),
        sa.UniqueConstraint("secret_hash", name="uq_web_sessions_secret_hash"),
    )
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def downgrade() -> None:
    for table in ("web_sessions", "operator_action_events", "operator_actions", "scheduler_replicas",
                  "scheduler_maintenance", "participant_preferences", "deliveries", "dedup_keys", "notifications",
                  "scheduled_event_history", "scheduled_events"):
        op.drop_table(table)  # with its indexes, constraints and triggers
    op.execute("DROP SEQUENCE notification_stream_seq")
    op.execute("DROP FUNCTION scheduled_events_announce_due()")
    op.execute("DROP FUNCTION scheduled_events_history()")
