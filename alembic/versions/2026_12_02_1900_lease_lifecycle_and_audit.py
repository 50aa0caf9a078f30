"""Lease lifecycle: fencing epoch, reviewer indexes, append-only audit trail.

Revision ID: 5d1e0c7a9b21
Revises: a8f3bebdeac0
Create Date: 2026-12-02 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "5d1e0c7a9b21"
down_revision: str | None = "a8f3bebdeac0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Incremented by every lease in the lease statement itself; never decreases. The
    # fencing token handed to the holder is derived from it.
    op.add_column(
        "review_queue_item",
        sa.Column("lease_epoch", sa.BigInteger(), server_default="0", nullable=False),
    )
    # "My open work" and the per-reviewer cap both read exactly these rows.
    op.create_index(
        "ix_review_queue_item_assigned_by_reviewer",
        "review_queue_item",
        ["leased_by", "created_at", "id"],
        postgresql_where=sa.text("state = 'ASSIGNED'"),
    )
    # Keyset pagination of GET /items by (created_at, id).
    op.create_index("ix_review_queue_item_created_at_id", "review_queue_item", ["created_at", "id"])

    op.create_table(
        "review_queue_event",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("item_id", sa.UUID(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("lease_epoch", sa.BigInteger(), nullable=False),
        sa.Column("trace_id", sa.UUID(), nullable=False),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED')",
            name=op.f("ck_review_queue_event_valid_event"),
        ),
        sa.ForeignKeyConstraint(
            ["item_id"],
            ["review_queue_item.id"],
            name=op.f("fk_review_queue_event_item_id_review_queue_item"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_queue_event")),
    )
    op.create_index("ix_review_queue_event_item_id_id", "review_queue_event", ["item_id", "id"])

    # The audit trail is append-only, enforced by the database for every client, not by
    # the application: UPDATE, DELETE and TRUNCATE are refused.
    op.execute(
        """
        CREATE FUNCTION review_queue_event_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'review_queue_event is append-only: % refused', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER review_queue_event_no_change
        BEFORE UPDATE OR DELETE ON review_queue_event
        FOR EACH ROW EXECUTE FUNCTION review_queue_event_append_only()
        """
    )
    op.execute(
        """
        CREATE TRIGGER review_queue_event_no_truncate
        BEFORE TRUNCATE ON review_queue_event
        FOR EACH STATEMENT EXECUTE FUNCTION review_queue_event_append_only()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER review_queue_event_no_truncate ON review_queue_event")
    op.execute("DROP TRIGGER review_queue_event_no_change ON review_queue_event")
    op.execute("DROP FUNCTION review_queue_event_append_only()")
    op.drop_index("ix_review_queue_event_item_id_id", table_name="review_queue_event")
    op.drop_table("review_queue_event")
    op.drop_index("ix_review_queue_item_created_at_id", table_name="review_queue_item")
    op.drop_index("ix_review_queue_item_assigned_by_reviewer", table_name="review_queue_item")
    op.drop_column("review_queue_item", "lease_epoch")
