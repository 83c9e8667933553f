"""Room on the outbox's pages for the worker's claim to update a row in place.

``deliveries`` is written once by the decision and then twice by the delivery worker: the
claim (its lease and attempt) and the record (what the attempt became). The claim changes no
column that an index holds or filters on, so PostgreSQL can make it a heap-only update (HOT:
the new version on the same page, no index entry written) whenever that page has room; at the
default fill factor (100) the decision's inserts leave none, and every claim wrote an entry
in each of the table's indexes. A fill factor of 50 leaves half of each page the decision
fills for the claims that follow (DEC-OUTBOX-STORAGE). It applies to pages written from now
on; rows already stored keep their pages.

Revision ID: 0003_outbox_fillfactor
Revises: 0002_push_subscriptions
"""

from alembic import op

revision = "0003_outbox_fillfactor"
down_revision = "0002_push_subscriptions"
branch_labels = None
depends_on = None

FILLFACTOR = 50


def upgrade() -> None:
    op.execute(f"ALTER TABLE deliveries SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    op.execute("ALTER TABLE deliveries RESET (fillfactor)")
