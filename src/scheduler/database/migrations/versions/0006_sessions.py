"""Sessions: the console and the inbox keep an opaque session id, not a token.

A browser signs in with a token once; the service stores a session here and gives the
browser a random session id in an HttpOnly cookie. Only the SHA-256 of that id is stored
(``secret_hash``): a copy of this table opens no session. ``id`` is a separate public
handle that names the session in lists and in ``DELETE /admin/sessions/{id}``. Because every
request reads this table, any replica serves a session and a deleted one is refused by all
of them at once. A session ends at ``expires_at`` (absolute) or ``idle_seconds`` after
``last_seen_at`` (idle), whichever comes first.

Revision ID: 0006_sessions
Revises: 0006_trace_context (chained after the tracing branch's 0006, which main holds)
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_sessions"
down_revision = "0006_trace_context"
branch_labels = None
depends_on = None


def upgrade() -> None:
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
        sa.CheckConstraint("kind IN ('admin', 'participant')", name="ck_web_sessions_kind"),
        sa.PrimaryKeyConstraint("id", name="pk_web_sessions"),
        sa.UniqueConstraint("secret_hash", name="uq_web_sessions_secret_hash"),
    )
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_web_sessions_expires_at", table_name="web_sessions")
    op.drop_table("web_sessions")
