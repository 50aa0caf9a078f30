"""GET /items filtered by a rare match decision or amount, at a page's cost (issue 29).

Measured at 1M items (a year, 99 % resolved; a value on 1 row in 10,000): `?match_decision=MATCHED`
read the table (a parallel sequential scan, 103-330 ms), and `?min_amount=200000` and
`?max_amount=0.5` walked the list order through the history (162-425 ms), before their first page.
With an index led by each, a rare value is read by its index (and only its rows sorted); a common
one still walks the list order.

Partial, on the RESOLVED rows: a row enters them once, at its resolution, so a lease, a renewal or
a release writes to neither (a full index is written by every one). The list reads the open items
through their own partial indexes and merges the parts (db/queue/reads.py list_query).

The amount index is on an expression of a partial index, of which ANALYZE keeps no statistics: the
planner took a third of the rows to match any amount range and walked the history instead.
Statistics on the expression (CREATE STATISTICS, PostgreSQL 14+) give it the distribution.

On a large existing table, create these by hand with CREATE INDEX CONCURRENTLY (same names, same
definitions) before upgrading: the migration then finds them and creates nothing (as for
2026_12_04_0830).

Revision ID: 8b2e6d4a9c31
Revises: 3f6a9b2d8c15
Create Date: 2026-12-04 22:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "8b2e6d4a9c31"
down_revision: str | None = "3f6a9b2d8c15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RESOLVED = sa.text("state = 'RESOLVED'")


def upgrade() -> None:
    op.create_index(
        "ix_review_queue_item_resolved_match",
        "review_queue_item",
        ["match_decision", "created_at", "id"],
        postgresql_where=RESOLVED,
        if_not_exists=True,
    )
    op.create_index(
        "ix_review_queue_item_resolved_abs_amount",
        "review_queue_item",
        [sa.text("abs(variance_amount)")],
        postgresql_where=RESOLVED,
        if_not_exists=True,
    )
    op.execute(
        "CREATE STATISTICS IF NOT EXISTS st_review_queue_item_abs_amount ON (abs(variance_amount))"
        " FROM review_queue_item"
    )
    # Without it the statistics stay empty until autovacuum's next ANALYZE of the table (a sample of
    # its rows: a second or so at 1M items; it blocks no write).
    op.execute("ANALYZE review_queue_item")


def downgrade() -> None:
    op.execute("DROP STATISTICS IF EXISTS st_review_queue_item_abs_amount")
    for name in ("resolved_abs_amount", "resolved_match"):
        op.drop_index(f"ix_review_queue_item_{name}", table_name="review_queue_item", if_exists=True)
