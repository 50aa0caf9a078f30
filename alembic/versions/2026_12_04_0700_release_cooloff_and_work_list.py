"""The reviewer's workplace (issue 24): a release cool-off, and the indexes of the desk's work list.

A holder's release records who released the item and until when they are not handed it again
(`released_by`, `released_until`: REVIEW_QUEUE_RELEASE_COOLDOWN_S after the release). The lease
statement's WHERE skips such a row for that reviewer only; everyone else gets it in its old place.
Both columns are nullable without a default, so adding them rewrites nothing.

`GET /items?sort=due_at` pages in (due_at, id) order: over every state on the first index, over one
ledger entity (also the `q` search's entity match) on the second. The tabs of one open state read
the partial indexes that already exist in that order. `GET /decisions` reads a reviewer's decision
events newest first from a partial index of those events only, so the trail's other events (leases,
renewals: most of them) cost it nothing.

Revision ID: 7c4e1f9a2b60
Revises: 642667459b15
Create Date: 2026-12-04 07:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "7c4e1f9a2b60"
down_revision: str | None = "642667459b15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DECISIONS = "event IN ('RESOLVED', 'SUBMITTED_FOR_APPROVAL', 'APPROVED', 'REJECTED')"


def upgrade() -> None:
    op.add_column("review_queue_item", sa.Column("released_by", sa.Text(), nullable=True))
    op.add_column("review_queue_item", sa.Column("released_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_review_queue_item_due_at_id", "review_queue_item", ["due_at", "id"])
    op.create_index(
        "ix_review_queue_item_entity_due_id", "review_queue_item", ["ledger_entity", "due_at", "id"]
    )
    op.create_index(
        "ix_review_queue_event_decisions_by_actor",
        "review_queue_event",
        ["actor", "id"],
        postgresql_where=sa.text(DECISIONS),
    )


def downgrade() -> None:
    op.drop_index("ix_review_queue_event_decisions_by_actor", table_name="review_queue_event")
    op.drop_index("ix_review_queue_item_entity_due_id", table_name="review_queue_item")
    op.drop_index("ix_review_queue_item_due_at_id", table_name="review_queue_item")
    op.drop_column("review_queue_item", "released_until")
    op.drop_column("review_queue_item", "released_by")
