"""The trace context of the request that stored a row (tracing from store to dispatch).

``scheduled_events.traceparent`` keeps the W3C ``traceparent`` of the POST that stored (or
last rewrote) the row: the storing request's own span when tracing is on, else the header
the caller sent. The loop's dispatch span links to it, so an operator can go from a
reminder's delivery back to the request that scheduled it. NULL when neither existed.
It is not in the history trigger's diff: it says who stored the row, not what it holds.

Revision ID: 0006_trace_context
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_trace_context"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, whatever the table's size.
    op.add_column("scheduled_events", sa.Column("traceparent", sa.String(length=55), nullable=True))


def downgrade() -> None:
    op.drop_column("scheduled_events", "traceparent")
