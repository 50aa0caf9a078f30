"""A release is not a decision (issue 42): the throughput's `decisions` and its time to decision
leave the holders' releases out; `released` still counts them, apart.

The kept closed buckets (review_queue_throughput_bucket) were computed the old way, releases in,
and their percentiles cannot be corrected in place: they are forgotten, and the state row's
`through` is cleared, so that the reclaimer's next rounds keep every closed day and week again
(docs/reports.md, "Closed days and weeks"); until then the reports read the trail, exactly. A CHECK
then holds every kept row to the new sum, so that a reclaimer still running the old code during a
rolling upgrade cannot keep a bucket with a release counted as a decision (its round fails and is
retried by the new one; a bucket without releases is the same either way).

The state row is taken first (a round in progress holds it: lock_timeout 5 s, then run again), so
no round keeps a bucket between the delete and the CHECK; the CHECK is added to an emptied table,
under its ACCESS EXCLUSIVE lock for the rest of this short transaction.

Revision ID: 7c1d2e9f4a60
Revises: 4f8b2d6e9a15
Create Date: 2026-12-07 00:50:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "7c1d2e9f4a60"
down_revision: str | None = "4f8b2d6e9a15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ck_review_queue_throughput_bucket_decisions_without_releases"
_FORGET = (
    "UPDATE review_queue_throughput_rollup SET through = NULL",
    "DELETE FROM review_queue_throughput_bucket",
    "DELETE FROM review_queue_backlog_day",
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    for statement in _FORGET:
        op.execute(statement)
    op.execute(
        f"ALTER TABLE review_queue_throughput_bucket ADD CONSTRAINT {NAME}"
        " CHECK (decisions = resolved + submitted_for_approval + approved + rejected)"
    )


def downgrade() -> None:
    # The old code counts releases as decisions: its buckets are kept again, its way.
    op.execute("SET LOCAL lock_timeout = '5s'")
    for statement in _FORGET:
        op.execute(statement)
    op.execute(f"ALTER TABLE review_queue_throughput_bucket DROP CONSTRAINT {NAME}")
