"""The host's commitments: what a participant promised, and the id of the reminder the host
scheduled for it in the same transaction (``host_service.commitments``)."""

from __future__ import annotations

from alembic import op

revision = "host_0002_commitments"
down_revision = "host_0001_users"


def upgrade() -> None:
    op.execute("CREATE TABLE commitments (id bigserial PRIMARY KEY, user_id text NOT NULL REFERENCES users (id),"
               " commitment text NOT NULL, minutes integer, remind_at timestamptz NOT NULL, reminder_id text)")


def downgrade() -> None:
    op.execute("DROP TABLE commitments")
