"""Announce every row that becomes pending, from the database itself (prompt mode's wake-up).

Prompt-mode replicas LISTEN on ``scheduler_due`` (DEC-9). The store used to send the NOTIFY
itself, one more round trip per POST, and a path that made a row pending another way (the
operator's reset through the audit trail, a bulk reset) woke nobody. A trigger announces
every INSERT or UPDATE that leaves a row pending, whatever wrote it, inside that
transaction: PostgreSQL delivers the notification at commit and drops it on rollback. The
payload is the row's ``trigger_at`` in ISO 8601, UTC. Rows becoming dispatched, failed or
cancelled never fire it (the WHEN clause is checked without calling the function).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE FUNCTION scheduled_events_announce_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'scheduler_due',
        to_char(NEW.trigger_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
    );
    RETURN NULL;
END
$$
"""
    )
    op.execute(
        "CREATE TRIGGER tr_scheduled_events_announce_due "
        "AFTER INSERT OR UPDATE OF status, trigger_at ON scheduled_events "
        "FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION scheduled_events_announce_due()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tr_scheduled_events_announce_due ON scheduled_events")
    op.execute("DROP FUNCTION IF EXISTS scheduled_events_announce_due()")
