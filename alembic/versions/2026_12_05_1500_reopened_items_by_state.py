"""The backlog follows the reopened items that can matter to its period, not all of them (issue 29).

The backlog report reads the trail of every reopened item that may have been open at one of its
day ends: those open now, and those whose standing decision came on or after the period began. It
found them by checking each open item and each of the period's resolutions against
`review_queue_reopened_item`, one key probe each: 320,000 probes for a week at 10M items, into a
table that grows with the years kept (49,498 rows against 77 without the history, x1.47 of the
week's backlog).

`review_queue_item.reopened` says the item was reopened once at least, and two partial indexes hold
exactly the rows the backlog wants: the reopened items still open, and the reopened items resolved,
by the time of their decision. Both hold reopened items only, so no other write touches them.

The flag is kept by the database, as `review_queue_reopened_item` is: the same AFTER INSERT trigger
on REOPENED events sets it (its function is SECURITY DEFINER), whichever statement reopened the
item. ADD COLUMN with a constant default rewrites nothing; the backfill updates the reopened items
alone. On a large table, build the two indexes `CONCURRENTLY` by hand before upgrading; the
migration then finds them and creates nothing.

Revision ID: 5d1e7a3c9b28
Revises: 2c8f5e1b7d94
Create Date: 2026-12-05 15:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "5d1e7a3c9b28"
down_revision: str | None = "2c8f5e1b7d94"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION review_queue_reopened_item() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    INSERT INTO review_queue_reopened_item (item_id, due_at)
    SELECT id, due_at FROM review_queue_item WHERE id = NEW.item_id
    ON CONFLICT (item_id) DO NOTHING;{flag}
    RETURN NULL;
END
$$
"""
_FLAG = """
    UPDATE review_queue_item SET reopened = true WHERE id = NEW.item_id AND NOT reopened;"""


def upgrade() -> None:
    op.add_column(
        "review_queue_item",
        sa.Column("reopened", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.execute(
        "UPDATE review_queue_item i SET reopened = true"
        " FROM review_queue_reopened_item r WHERE r.item_id = i.id"
    )
    op.execute(_FUNCTION.format(flag=_FLAG))
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
    op.execute(_FUNCTION.format(flag=""))
    op.drop_column("review_queue_item", "reopened")
