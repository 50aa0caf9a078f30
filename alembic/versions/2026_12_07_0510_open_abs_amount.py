"""`GET /items?min_amount=` pages off an index for the open items too (issue 44).

The resolved history has ix_review_queue_item_resolved_abs_amount (2026_12_04_2230); the open items
had none, so an amount bound with no state walked every PENDING item in list order, filtering each
(70-210 ms at 200,000 open items), and read every other open item to sort. This is the same
expression on the open items: `abs(variance_amount) WHERE state <> 'RESOLVED'`. Both open parts of
the list (PENDING, and the other open states) read it for a rare amount and sort the few rows found;
a common one still walks the list order, which fills a page at once.

Not the base-currency equivalent: it depends on the latest rates, which change without the item
changing, so a stored equivalent would go stale. db/queue/reads.py bounds the amount itself by the
highest and lowest rate, which this index serves, and checks the exact equivalent on the rows found.

Online: CREATE INDEX CONCURRENTLY outside the migration's transaction (Alembic's autocommit block),
writers going on meanwhile. Should the build fail (a rare deadlock), the invalid index is left: drop
it and run the migration again. The statistics of abs(variance_amount) the planner estimates a
bound's rows from are st_review_queue_item_abs_amount's (a partial index's own are not used).

Revision ID: 9d4f2a6c8e13
Revises: 5a9c3e7b2d18
Create Date: 2026-12-07 05:10:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "9d4f2a6c8e13"
down_revision: str | None = "5a9c3e7b2d18"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_review_queue_item_open_abs_amount"
    " ON review_queue_item (abs(variance_amount)) WHERE state <> 'RESOLVED'"
)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(INDEX)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_review_queue_item_open_abs_amount")
