"""The backlog's reopened items by state: those still open, and those resolved again by the time of
their decision (issue 29). Both partial indexes hold reopened items alone, so no other write
touches them.

On a large table, upgrade to `2026_12_05_1500` first (the flag: no rewrite), build these two by
hand without blocking writes (`CREATE INDEX CONCURRENTLY`, same names and definitions), then
upgrade to head: the migration finds them and creates nothing.

Revision ID: 8a4c2e6f1d37
Revises: 5d1e7a3c9b28
Create Date: 2026-12-05 15:10:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "8a4c2e6f1d37"
down_revision: str | None = "5d1e7a3c9b28"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_review_queue_item_reopened_open",
        "review_queue_item",
        ["id"],
        postgresql_where=sa.text("reopened AND state <> 'RESOLVED'"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_review_queue_item_reopened_resolved",
        "review_queue_item",
        ["resolved_at"],
        postgresql_where=sa.text("reopened AND state = 'RESOLVED'"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_review_queue_item_reopened_resolved", table_name="review_queue_item", if_exists=True)
    op.drop_index("ix_review_queue_item_reopened_open", table_name="review_queue_item", if_exists=True)
