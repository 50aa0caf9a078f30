"""Source revisions (REVISED) and the admin's override of leases (REASSIGNED).

`revised_epoch` is the lease epoch a revision of a leased item moved it to: while it equals
`lease_epoch`, the current lease has seen a revision (nothing has leased or reassigned the item
since), and a completion that does not show it saw the new figures is refused.

Revision ID: a9d3c5e7f120
Revises: c2a9e4f1d873
Create Date: 2026-12-03 11:20:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "a9d3c5e7f120"
down_revision: str | None = "d8e2b5a17c40"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ck_review_queue_event_valid_event"
_BEFORE = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED', 'REOPENED')"
)
_AFTER = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED', 'REOPENED', 'REVISED', 'REASSIGNED')"
)


def upgrade() -> None:
    op.add_column("review_queue_item", sa.Column("revised_epoch", sa.BigInteger(), nullable=True))
    op.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {NAME}")
    op.execute(f"ALTER TABLE review_queue_event ADD CONSTRAINT {NAME} CHECK ({_AFTER})")


def downgrade() -> None:
    # The trail is append-only: REVISED and REASSIGNED rows stay, so the old check holds for new
    # rows only.
    op.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {NAME}")
    op.execute(f"ALTER TABLE review_queue_event ADD CONSTRAINT {NAME} CHECK ({_BEFORE}) NOT VALID")
    op.drop_column("review_queue_item", "revised_epoch")
