"""A participant's rows by index: the console's and the API's ``user_id`` filter.

Without it, a page of one participant's rows walked ``ix_scheduled_events_updated_at``
from the newest row and filtered on ``user_id``: ``python -m bench scale`` measured 478 ms
at 10M rows for a participant with 2,000 rows, and 8.4 s (517,000 buffers, the whole
table) for a participant with none; the cost grows with the table divided by the
participant's rows. ``(user_id, updated_at, id)`` serves the console's order (newest change
first, walked backwards) with one page of rows, and the API's list with the participant's
rows only. It costs one more index entry per stored row version (insert, outcome).

On a big table, build it first without blocking writes, then upgrade (this migration then
finds it and does nothing)::

    CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_scheduled_events_user_id
        ON scheduled_events (user_id, updated_at, id);

Revision ID: 0007_participant_index
Revises: 0006_sessions
"""

from alembic import op

revision = "0007_participant_index"
down_revision = "0006_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_scheduled_events_user_id", "scheduled_events", ["user_id", "updated_at", "id"],
                    if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_scheduled_events_user_id", table_name="scheduled_events")
