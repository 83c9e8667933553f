"""The event lifecycle: cancel, history, retention, and the inbox's stream order.

- ``cancelled``: a terminal status for a withdrawn reminder (the claim reads only
  ``pending``, so it never takes one).
- ``scheduled_event_history``: one row per change of a scheduled event, appended by a
  trigger in the same transaction as the change, so no writer (the API, the loop, the
  simulation's broken variants, an operator's psql) can change a row without it. The
  writer may name the change and the actor with ``set_config('scheduler.change', ...,
  true)`` and ``set_config('scheduler.actor', ..., true)``; the loop names neither (the
  status says it: dispatched, failed), so its hot path costs no extra round trip. The
  time is the row's ``updated_at``, which every statement sets from the injected clock.
- ``ix_scheduled_events_finished``: retention finds old dispatched and cancelled rows
  without reading the table.
- ``scheduler_maintenance``: when a periodic task (retention) last ran, shared by replicas.
- ``notifications.stream_seq``: the inbox stream's order, given after commit under one
  lock so that it is commit order (a ``Last-Event-ID`` replay then misses nothing).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

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
            CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN NEW.status ELSE 'updated' END);
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
        IF NEW.facts IS DISTINCT FROM OLD.facts THEN
            diff := diff || jsonb_build_object('facts', jsonb_build_array(OLD.facts, NEW.facts));
        END IF;
        IF NEW.status IS DISTINCT FROM OLD.status THEN
            diff := diff || jsonb_build_object('status', jsonb_build_array(OLD.status, NEW.status));
        END IF;
        IF NEW.last_error IS DISTINCT FROM OLD.last_error THEN
            diff := diff || jsonb_build_object('last_error', jsonb_build_array(OLD.last_error, NEW.last_error));
        END IF;
    END IF;
    INSERT INTO scheduled_event_history (event_id, at, change, actor, status, changes)
    VALUES (NEW.id, NEW.updated_at, change,
            nullif(current_setting('scheduler.actor', true), ''), NEW.status, diff);
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    op.drop_constraint("ck_scheduled_events_status", "scheduled_events", type_="check")
    op.create_check_constraint(
        "ck_scheduled_events_status",
        "scheduled_events",
        "status IN ('pending', 'dispatched', 'failed', 'cancelled')",
    )
    op.create_index(
        "ix_scheduled_events_finished",
        "scheduled_events",
        ["updated_at"],
        postgresql_where=sa.text("status IN ('dispatched', 'cancelled')"),
    )
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
    op.create_index(
        "ix_scheduled_event_history_event_id", "scheduled_event_history", ["event_id", "id"]
    )
    op.execute(HISTORY_FUNCTION)
    op.execute(
        "CREATE TRIGGER tr_scheduled_events_history AFTER INSERT OR UPDATE ON scheduled_events "
        "FOR EACH ROW EXECUTE FUNCTION scheduled_events_history()"
    )
    op.create_table(
        "scheduler_maintenance",
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task", name="pk_scheduler_maintenance"),
    )
    op.execute("CREATE SEQUENCE notification_stream_seq")
    op.add_column("notifications", sa.Column("stream_seq", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_notifications_user_id_stream_seq",
        "notifications",
        ["user_id", "stream_seq"],
        postgresql_where=sa.text("stream_seq IS NOT NULL"),
    )
    op.create_index(
        "ix_notifications_stream_seq",
        "notifications",
        ["stream_seq"],
        postgresql_where=sa.text("stream_seq IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_notifications_stream_seq", table_name="notifications")
    op.drop_index("ix_notifications_user_id_stream_seq", table_name="notifications")
    op.drop_column("notifications", "stream_seq")
    op.execute("DROP SEQUENCE notification_stream_seq")
    op.drop_table("scheduler_maintenance")
    op.execute("DROP TRIGGER tr_scheduled_events_history ON scheduled_events")
    op.execute("DROP FUNCTION scheduled_events_history()")
    op.drop_index("ix_scheduled_event_history_event_id", table_name="scheduled_event_history")
    op.drop_table("scheduled_event_history")
    op.drop_index("ix_scheduled_events_finished", table_name="scheduled_events")
    # cancelled rows have no place in the old schema: they become failed, with the reason
    op.execute(
        "UPDATE scheduled_events SET status = 'failed', last_error = coalesce(last_error, 'cancelled') "
        "WHERE status = 'cancelled'"
    )
    op.drop_constraint("ck_scheduled_events_status", "scheduled_events", type_="check")
    op.create_check_constraint(
        "ck_scheduled_events_status",
        "scheduled_events",
        "status IN ('pending', 'dispatched', 'failed')",
    )
