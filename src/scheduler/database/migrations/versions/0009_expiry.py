"""Expiry (EXP-*, DEC-EXPIRY): ``expires_at`` on a scheduled event and the terminal status ``expired``.

- ``scheduled_events.expires_at`` (nullable): a row claimed after it is not dispatched but
  ends ``expired``. ``CHECK (expires_at > trigger_at)`` keeps every path honest.
- ``expired`` joins the status CHECK; retention's partial index covers it (expired rows are
  kept as long as dispatched ones).
- ``ix_scheduled_events_pending_expiry``: the pending rows that carry an expiry, by it, so the
  claim finds the expired ones without walking a backlog of rows that never expire.
- The history trigger records a change of ``expires_at`` like any other column's.

Revision ID: 0009_expiry
Revises: 0008_own_schema
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

revision = "0009_expiry"
down_revision = "0008_own_schema"
branch_labels = None
depends_on = None

_EXPIRES_DIFF = """
        IF NEW.expires_at IS DISTINCT FROM OLD.expires_at THEN
            diff := diff || jsonb_build_object('expires_at', jsonb_build_array(OLD.expires_at, NEW.expires_at));
        END IF;"""

# 0008's function with one more column diffed (after trigger_at's); the downgrade takes it out again
HISTORY_FUNCTION = """
CREATE OR REPLACE FUNCTION {function_schema}.scheduled_events_history() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    change text;
    diff jsonb := '{{}}'::jsonb;
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
        IF NEW.expires_at IS DISTINCT FROM OLD.expires_at THEN
            diff := diff || jsonb_build_object('expires_at', jsonb_build_array(OLD.expires_at, NEW.expires_at));
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
    INSERT INTO {table_schema}scheduled_event_history (event_id, at, change, actor, status, changes)
    VALUES (NEW.id, NEW.updated_at, change,
            nullif(current_setting('scheduler.actor', true), ''), NEW.status, diff);
    RETURN NULL;
END
$$;
"""


def _schema() -> str:
    return str(op.get_bind().execute(text("SELECT current_schema()")).scalar_one())


def _replace_function(with_expiry: bool) -> None:
    schema = _schema()
    body = HISTORY_FUNCTION if with_expiry else HISTORY_FUNCTION.replace(_EXPIRES_DIFF, "", 1)
    op.execute(body.format(function_schema=f'"{schema}"', table_schema=f'"{schema}".'))


def upgrade() -> None:
    op.add_column("scheduled_events", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint("ck_scheduled_events_expiry_after_trigger", "scheduled_events",
                               "expires_at IS NULL OR expires_at > trigger_at")
    op.drop_constraint("ck_scheduled_events_status", "scheduled_events", type_="check")
    op.create_check_constraint("ck_scheduled_events_status", "scheduled_events",
                               "status IN ('pending', 'dispatched', 'failed', 'cancelled', 'expired')")
    op.drop_index("ix_scheduled_events_finished", table_name="scheduled_events")
    op.create_index("ix_scheduled_events_finished", "scheduled_events", ["updated_at"],
                    postgresql_where=sa.text("status IN ('dispatched', 'cancelled', 'expired')"))
    op.create_index("ix_scheduled_events_pending_expiry", "scheduled_events", ["expires_at", "id"],
                    postgresql_where=sa.text("status = 'pending' AND expires_at IS NOT NULL"))
    _replace_function(with_expiry=True)


def downgrade() -> None:
    _replace_function(with_expiry=False)
    op.drop_index("ix_scheduled_events_pending_expiry", table_name="scheduled_events")
    op.drop_index("ix_scheduled_events_finished", table_name="scheduled_events")
    op.create_index("ix_scheduled_events_finished", "scheduled_events", ["updated_at"],
                    postgresql_where=sa.text("status IN ('dispatched', 'cancelled')"))
    # expired rows have no place in the old schema: they become failed, with the reason
    op.execute("UPDATE scheduled_events SET status = 'failed', last_error = coalesce(last_error, 'expired') "
               "WHERE status = 'expired'")
    op.drop_constraint("ck_scheduled_events_status", "scheduled_events", type_="check")
    op.create_check_constraint("ck_scheduled_events_status", "scheduled_events",
                               "status IN ('pending', 'dispatched', 'failed', 'cancelled')")
    op.drop_constraint("ck_scheduled_events_expiry_after_trigger", "scheduled_events", type_="check")
    op.drop_column("scheduled_events", "expires_at")
