"""`GET /items?min_amount=` pages off an index for the open items too (issue 44).

The resolved history has ix_review_queue_item_resolved_abs_amount (2026_12_04_2230); the open items
had none, so an amount bound with no state walked every PENDING item in list order, filtering each
(70-210 ms at 200,000 open items), and read every other open item to sort. These are the same
expression on the open items, one index per open part of the list, each with its part's predicate
(db/queue/reads.py _STATE_PARTS): a part reads the rows its index finds and sorts those, for a rare
amount; a common one still walks the list order, which fills a page at once.
- `ix_review_queue_item_pending_abs_amount`, `WHERE state = 'PENDING'`: written at enqueue and when
  an item returns to PENDING; a lease or a completion writes nothing to it.
- `ix_review_queue_item_open_abs_amount`, `WHERE state NOT IN ('PENDING', 'RESOLVED')` (as
  ix_review_queue_item_open_due): the leased, awaiting and quarantined items; a lease and a renewal
  write one entry to it.
One index over every open state was tried first: PENDING's part then ANDed it with the whole
PENDING index to check the state (20-28 ms of the 30-57 ms at 200,000 open items, bench part 9).

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

PARTS = {
    "pending_abs_amount": "state = 'PENDING'",
    "open_abs_amount": "state NOT IN ('PENDING', 'RESOLVED')",
}


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, part in PARTS.items():
            op.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_review_queue_item_{name}"
                f" ON review_queue_item (abs(variance_amount)) WHERE {part}"
            )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in PARTS:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS ix_review_queue_item_{name}")
