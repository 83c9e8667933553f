"""The schema of its own (DEC-SCHEMA): the history trigger names its table with the schema.

Since this revision every object of the scheduler lives in a schema of its own
(``SCHEDULER_DATABASE_SCHEMA``, default ``scheduler``), beside a host's tables in ``public``;
``scheduler.database.schema.migrate`` moves a deployment from ``public`` before Alembic runs.
A trigger function resolves the names in its body with the search_path of whoever fired it:
a host's session (its ``search_path`` is ``"$user", public``) would find no
``scheduled_event_history`` there, or worse, a table of the host's by that name. The body now
names the schema. ``scheduled_events_announce_due`` names no table (``pg_notify`` is in
``pg_catalog``, always searched) and stays as it is.

Revision ID: 0008_own_schema
Revises: 0007_participant_index
"""

from alembic import op
from sqlalchemy import text

revision = "0008_own_schema"
down_revision = "0007_participant_index"
branch_labels = None
depends_on = None

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
    """The schema being migrated: this transaction's search_path is that schema alone."""
    return str(op.get_bind().execute(text("SELECT current_schema()")).scalar_one())


def upgrade() -> None:
    schema = _schema()
    op.execute(HISTORY_FUNCTION.format(function_schema=f'"{schema}"', table_schema=f'"{schema}".'))


def downgrade() -> None:
    op.execute(HISTORY_FUNCTION.format(function_schema=f'"{_schema()}"', table_schema=""))
