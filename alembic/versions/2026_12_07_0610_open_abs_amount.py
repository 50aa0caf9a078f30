"""`GET /items?min_amount=` pages off an index for the open items too (issue 44), and no other
statement can take these indexes.

The resolved history has ix_review_queue_item_resolved_abs_amount (2026_12_04_2230); the open items
had none, so an amount bound with no state walked every PENDING item in list order, filtering each
(70-210 ms at 200,000 open items), and read every other open item to sort. These are the same
expression on the open items, one index per open part of the list (db/queue/reads.py _STATE_PARTS):
a part reads the rows its index finds and sorts those, for a rare amount; a common one still walks
the list order, which fills a page at once.
- `ix_review_queue_item_pending_abs_amount`: the PENDING part. Written at enqueue and when an item
  returns to PENDING; a lease or a completion writes nothing to it.
- `ix_review_queue_item_open_abs_amount`: the leased, awaiting and quarantined items (the part
  `state NOT IN ('PENDING', 'RESOLVED')`, as ix_review_queue_item_open_due). A lease and a renewal
  write one entry to it.
One index over every open state was tried first (reverted): PENDING's part ANDed it with the whole
PENDING index to check the state (20-28 ms at 200,000 open items).

Why each predicate also says `abs(variance_amount) IS NOT NULL` (always true: the column is NOT
NULL). The first version of these indexes (2026_12_07_0510, reverted in 5ce17ba) had the bare state
predicates, and the lease stopped reading ix_review_queue_item_pending_due in due order. The lease
never mentions the amount; what it has is `state = 'PENDING'`, which implies a bare `state =
'PENDING'` (or `state <> 'RESOLVED'`) predicate, and PostgreSQL considers *any* partial index whose
predicate the WHERE implies as a full scan of exactly the rows wanted, then a sort. The lease's
LIMIT is an expression (the room under the reviewer's cap), so the planner costs its ordered scan
as 10 % of the PENDING rows fetched in due order, at random heap pages, against a whole read of a
small index whose order follows the heap (the tests' amounts are all equal: one deduplicated key,
correlation 1) plus a sort: 313 against 604 in the plan tests, so the lease read the amount index
and sorted every PENDING row. The bare `state NOT IN ('PENDING', 'RESOLVED')` index took the open
items' gauges (/stats aging and overdue) off ix_review_queue_item_open_due the same way, and the
approval queue's lease (`state = 'AWAITING_APPROVAL'`) could take it too.

A partial index is a candidate only when the planner proves its whole predicate from the
statement's WHERE (predtest.c). `abs(variance_amount) IS NOT NULL` is proved by any strict
comparison of abs(variance_amount) (`>= $1`, `<= $1`, and the converted `abs(...) * rate >= $1`),
whatever the values and in a generic plan too, which is what every amount bound of the list writes;
a statement that does not compare abs(variance_amount) cannot prove it, whatever the statistics or
costs, so the lease, the approval lease, the reclaimer and the gauges never see these indexes (the
column's NOT NULL constraint is not used in such proofs, and the expression is no plain column).
tests/integration/db/test_query_plans.py plans every lease variant and the gauges with both
indexes present under the statistics that moved them before.

Not the base-currency equivalent: it depends on the latest rates, which change without the item
changing, so a stored equivalent would go stale. db/queue/reads.py bounds the amount itself by the
highest and lowest rate, which these indexes serve, and checks the exact equivalent on the rows
found.

Online: CREATE INDEX CONCURRENTLY outside the migration's transaction (Alembic's autocommit block),
writers going on meanwhile. Should a build fail (a rare deadlock), the invalid index is left: drop
it and run the migration again (IF NOT EXISTS would keep the invalid one). The statistics of
abs(variance_amount) the planner estimates a bound's rows from are st_review_queue_item_abs_amount's.

Revision ID: 4e7b1c9a2d65
Revises: 5a9c3e7b2d18
Create Date: 2026-12-07 06:10:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "4e7b1c9a2d65"
down_revision: str | None = "5a9c3e7b2d18"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each index, and its part of the open items; both guarded by the amount (see above).
PARTS = {
    "pending_abs_amount": "state = 'PENDING'",
    "open_abs_amount": "state NOT IN ('PENDING', 'RESOLVED')",
}
GUARD = "abs(variance_amount) IS NOT NULL"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, part in PARTS.items():
            op.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_review_queue_item_{name}"
                f" ON review_queue_item (abs(variance_amount)) WHERE {part} AND {GUARD}"
            )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in PARTS:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS ix_review_queue_item_{name}")
