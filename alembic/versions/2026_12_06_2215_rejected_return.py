"""A rejected proposal goes back to its preparer first (issue 42, part 1).

`returned_until`: set by a rejection to now() + REVIEW_QUEUE_REJECTED_RETURN_S, cleared by the
next lease. Until then the preparer's unnamed lease takes the item ahead of due order and
nobody else's unnamed lease takes it. Nullable without a default: adding it rewrites nothing,
under one short lock (lock_timeout 5 s: a busy moment fails the migration, nothing changed, and it
is run again). The index is built CONCURRENTLY, outside the migration's transaction, so writers go
on meanwhile; should it fail, drop the invalid index and run the migration again.

The preparer's half of the lease reads `ix_review_queue_item_pending_returned`: only PENDING
rows a rejection returned are in it (few), by the preparer as the lease compares identities
(case-folded), in lease order.

Revision ID: 9e3a6c1d7b42
Revises: 6b2d8e4f1a93
Create Date: 2026-12-06 22:15:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "9e3a6c1d7b42"
down_revision: str | None = "6b2d8e4f1a93"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE review_queue_item ADD COLUMN IF NOT EXISTS returned_until timestamptz")
    # Committing here lets go of the item table's lock before a later migration of the same upgrade
    # locks another table: a writer holding that table and waiting for this one would deadlock.
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_review_queue_item_pending_returned",
            "review_queue_item",
            [sa.text("lower(prepared_by)"), "due_at", "created_at"],
            postgresql_where=sa.text("state = 'PENDING' AND returned_until IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index("ix_review_queue_item_pending_returned", table_name="review_queue_item")
    op.drop_column("review_queue_item", "returned_until")
