"""The event lifecycle: cancel, history and retention (issue 10).

Revision ID: 0003
Revises: 0002
"""

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Filled by the lifecycle work (cancelled status, history table); kept in the chain
    # now so that later revisions can depend on it.
    pass


def downgrade() -> None:
    pass
