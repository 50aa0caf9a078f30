"""A failing webhook event holds back only its own item (issue 38, item 4).

`webhook_held` keeps, per subscription, the events its cursor has passed but that are not
delivered yet: for each held item, the event that failed (its retry state on that row) and the
item's later events, which wait behind it so that each item's events still arrive in their own
order. Every other item's events flow on. The application role adds, changes and deletes these
rows (the default privileges); subscriptions are still never deleted.

Revision ID: 3c7d52a9e14b
Revises: 6c2d8e4f0b19
Create Date: 2026-12-06 18:40:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "3c7d52a9e14b"
down_revision: str | None = "6c2d8e4f0b19"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhook_held",
        sa.Column("subscription", sa.Text(), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("item_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_webhook_held_attempts_not_negative")),
        sa.ForeignKeyConstraint(
            ["subscription"],
            ["webhook_subscription.name"],
            name=op.f("fk_webhook_held_subscription_webhook_subscription"),
        ),
        sa.PrimaryKeyConstraint("subscription", "event_id", name=op.f("pk_webhook_held")),
    )
    op.create_index(
        "ix_webhook_held_subscription_item_id_event_id",
        "webhook_held",
        ["subscription", "item_id", "event_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_held_subscription_item_id_event_id", table_name="webhook_held")
    op.drop_table("webhook_held")
