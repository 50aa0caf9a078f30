"""Reopen: an admin puts a RESOLVED item back to PENDING; the REOPENED event keeps the old decision.

Revision ID: e63fa04c9b52
Revises: d52e9f3b8a41
Create Date: 2026-12-03 09:40:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "e63fa04c9b52"
down_revision: str | None = "d52e9f3b8a41"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ck_review_queue_event_valid_event"
_BEFORE = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED')"
)
_AFTER = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED', 'REOPENED')"
)


def upgrade() -> None:
    op.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {NAME}")
    op.execute(f"ALTER TABLE review_queue_event ADD CONSTRAINT {NAME} CHECK ({_AFTER})")


def downgrade() -> None:
    # The trail is append-only: REOPENED rows stay, so the old check holds for new rows only.
    op.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {NAME}")
    op.execute(f"ALTER TABLE review_queue_event ADD CONSTRAINT {NAME} CHECK ({_BEFORE}) NOT VALID")
