"""GET /items at a page's cost, whatever the history (issue 29): the list filters that read the
history before their first page now have an index led by the filter, in the list's order.

Measured at 1M items (a year, 99 % resolved): `?state=PENDING` in enqueue order (the API's
default) read the whole resolved history before its first page, 671 ms before this migration and
1.3 ms after; one reviewer's decisions (`?resolved_by=`), in either order, were read by walking the
whole list order until the page was full. Each index here is led by the filter, and partial, so a
lease or a renewal writes to none of them (the write path measured within its noise, docs/performance.md):
- PENDING rows by enqueue time: a row is in it only while it waits;
- one reviewer's decisions by enqueue time and by deadline: a row enters them once, when resolved.

On a large existing table, create these by hand with CREATE INDEX CONCURRENTLY (same names, same
definitions) before upgrading: the migration then finds them and creates nothing, so writes are
never blocked (as for 2026_12_04_0830).

Revision ID: 5d0c4f1e2a77
Revises: c4e9a2f17b80
Create Date: 2026-12-04 15:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "5d0c4f1e2a77"
down_revision: str | None = "c4e9a2f17b80"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DECIDED = sa.text("resolved_by IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_review_queue_item_pending_created",
        "review_queue_item",
        ["created_at", "id"],
        postgresql_where=sa.text("state = 'PENDING'"),
        if_not_exists=True,
    )
    for order in ("created", "due"):
        op.create_index(
            f"ix_review_queue_item_resolved_by_{order}",
            "review_queue_item",
            ["resolved_by", f"{order}_at", "id"],
            postgresql_where=DECIDED,
            if_not_exists=True,
        )


def downgrade() -> None:
    for name in ("resolved_by_due", "resolved_by_created", "pending_created"):
        op.drop_index(f"ix_review_queue_item_{name}", table_name="review_queue_item", if_exists=True)
