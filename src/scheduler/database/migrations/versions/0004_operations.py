"""Operations: replica heartbeats, the operators' audit trail, console indexes.

The console pages events newest change first by keyset on (updated_at, id), over every row
and over failed rows, and reads the last hour's dispatches for its lateness percentiles
(a dispatched row's updated_at is its dispatched_at); an event's page lists its
notifications (scheduled_event_id).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
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
        sa.ForeignKeyConstraint(
            ["action_id"], ["operator_actions.id"],
            name="fk_operator_action_events_action_id_operator_actions", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("action_id", "event_id", name="pk_operator_action_events"),
    )
    op.create_index("ix_operator_action_events_event_id", "operator_action_events", ["event_id"])
    # The console's keyset order is (updated_at, id): over every row, and over failed rows.
    op.create_index("ix_scheduled_events_updated_at", "scheduled_events", ["updated_at", "id"])
    op.drop_index("ix_scheduled_events_failed", table_name="scheduled_events")
    op.create_index(
        "ix_scheduled_events_failed",
        "scheduled_events",
        ["updated_at", "id"],
        postgresql_where=sa.text("status = 'failed'"),
    )
    op.create_index(
        "ix_notifications_scheduled_event_id",
        "notifications",
        ["scheduled_event_id"],
        postgresql_where=sa.text("scheduled_event_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_notifications_scheduled_event_id", table_name="notifications")
    op.drop_index("ix_scheduled_events_failed", table_name="scheduled_events")
    op.create_index(
        "ix_scheduled_events_failed",
        "scheduled_events",
        ["updated_at"],
        postgresql_where=sa.text("status = 'failed'"),
    )
    op.drop_index("ix_scheduled_events_updated_at", table_name="scheduled_events")
    op.drop_index("ix_operator_action_events_event_id", table_name="operator_action_events")
    op.drop_table("operator_action_events")
    op.drop_index("ix_operator_actions_at", table_name="operator_actions")
    op.drop_table("operator_actions")
    op.drop_table("scheduler_replicas")
