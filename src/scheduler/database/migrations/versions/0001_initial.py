"""Initial schema: scheduled events, notifications, deduplication, deliveries, preferences.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


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
        sa.CheckConstraint(
            "status IN ('pending', 'dispatched', 'failed')", name="ck_scheduled_events_status"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_scheduled_events"),
        sa.UniqueConstraint("external_key", name="uq_scheduled_events_external_key"),
    )
    op.create_index(
        "ix_scheduled_events_pending_due",
        "scheduled_events",
        ["trigger_at", "id"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_scheduled_events_failed",
        "scheduled_events",
        ["updated_at"],
        postgresql_where=sa.text("status = 'failed'"),
    )
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
        sa.CheckConstraint(
            "status IN ('sent', 'suppressed', 'failed')", name="ck_notifications_status"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_notifications"),
    )
    op.create_index(
        "ix_notifications_user_id_created_at", "notifications", ["user_id", "created_at"]
    )
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
        sa.ForeignKeyConstraint(
            ["notification_id"],
            ["notifications.id"],
            name="fk_deliveries_notification_id_notifications",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_deliveries"),
    )
    op.create_index("ix_deliveries_notification_id", "deliveries", ["notification_id"])
    op.create_index(
        "ix_deliveries_sent_by_user",
        "deliveries",
        ["user_id", "created_at"],
        postgresql_where=sa.text("status = 'sent'"),
    )
    op.create_table(
        "participant_preferences",
        sa.Column("user_id", sa.String(200), nullable=False),
        sa.Column("enabled_kinds", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("max_per_day", sa.Integer(), server_default=sa.text("3"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_id", name="pk_participant_preferences"),
    )


def downgrade() -> None:
    op.drop_table("participant_preferences")
    op.drop_index("ix_deliveries_sent_by_user", table_name="deliveries")
    op.drop_index("ix_deliveries_notification_id", table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("dedup_keys")
    op.drop_index("ix_notifications_user_id_created_at", table_name="notifications")
    op.drop_table("notifications")
    op.drop_index("ix_scheduled_events_failed", table_name="scheduled_events")
    op.drop_index("ix_scheduled_events_pending_due", table_name="scheduled_events")
    op.drop_table("scheduled_events")
