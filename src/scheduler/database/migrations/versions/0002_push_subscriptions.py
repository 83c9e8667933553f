"""A participant's web-push subscriptions, and the push delivery's link to its subscription.

Created in the scheduler's schema of its own like everything of ``0001_initial``
(DEC-SCHEMA): this transaction's ``search_path`` is that schema alone (``env.py``), so the
names below need no schema.

- ``push_subscriptions``: one row per browser subscription (the W3C ``PushSubscription``,
  ``PUT /me/push-subscriptions``), unique by its ``endpoint`` (a browser that subscribes again,
  or for another participant, updates the row), with the browser's public key (``p256dh``, the
  65-byte uncompressed P-256 point) and auth secret (16 bytes) as bytes, and its
  ``expirationTime`` when it has one. A participant's subscriptions are found by
  ``ix_push_subscriptions_user_id``.
- ``deliveries.push_subscription_id``: the subscription a ``web_push`` row is sent to (one row
  per subscription of the participant, queued in the notification's transaction). Removing
  the subscription (``DELETE /me/push-subscriptions``, or a push service's 404/410) sets it to
  NULL: a row still queued for it is then undeliverable, with no request.

Revision ID: 0002_push_subscriptions
Revises: 0001_initial
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_push_subscriptions"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "push_subscriptions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("user_id", sa.String(200), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("p256dh", sa.LargeBinary(), nullable=False),
        sa.Column("auth", sa.LargeBinary(), nullable=False),
        sa.Column("expiration_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("octet_length(p256dh) = 65",
                           name=op.f("ck_push_subscriptions_ck_push_subscriptions_p256dh_point")),
        sa.CheckConstraint("octet_length(auth) = 16",
                           name=op.f("ck_push_subscriptions_ck_push_subscriptions_auth_secret")),
        sa.CheckConstraint("char_length(endpoint) <= 2048",
                           name=op.f("ck_push_subscriptions_ck_push_subscriptions_endpoint_length")),
        sa.PrimaryKeyConstraint("id", name="pk_push_subscriptions"),
        sa.UniqueConstraint("endpoint", name="uq_push_subscriptions_endpoint"),
    )
    op.create_index("ix_push_subscriptions_user_id", "push_subscriptions", ["user_id", "id"])
    op.add_column("deliveries", sa.Column("push_subscription_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key("fk_deliveries_push_subscription_id_push_subscriptions", "deliveries",
                          "push_subscriptions", ["push_subscription_id"], ["id"], ondelete="SET NULL")
    # removing a subscription finds its rows here (the foreign key's SET NULL)
    op.create_index("ix_deliveries_push_subscription_id", "deliveries", ["push_subscription_id"],
                    postgresql_where=sa.text("push_subscription_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_deliveries_push_subscription_id", table_name="deliveries")
    op.drop_constraint("fk_deliveries_push_subscription_id_push_subscriptions", "deliveries", type_="foreignkey")
    op.drop_column("deliveries", "push_subscription_id")
    op.drop_table("push_subscriptions")
