"""The host's first schema: its users (with an opt-out), its own notifications table, and the
deliveries its dispatcher writes."""

from __future__ import annotations

from alembic import op

revision = "host_0001_users"
down_revision = None


def upgrade() -> None:
    op.execute("CREATE TABLE users (id text PRIMARY KEY, opted_out boolean NOT NULL DEFAULT false)")
    op.execute("CREATE TABLE notifications (id bigserial PRIMARY KEY, user_id text NOT NULL, body text NOT NULL)")
    op.execute("CREATE TABLE host_deliveries (id bigserial PRIMARY KEY, scheduled_event_id text NOT NULL,"
               " user_id text NOT NULL REFERENCES users (id), body text NOT NULL,"
               " delivered_at timestamptz NOT NULL)")


def downgrade() -> None:
    op.execute("DROP TABLE host_deliveries")
    op.execute("DROP TABLE notifications")
    op.execute("DROP TABLE users")
