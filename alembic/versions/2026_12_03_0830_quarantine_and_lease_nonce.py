"""Poison items are quarantined after too many attempts; lease tokens carry a random nonce.

Revision ID: 7c2f4e1a9d03
Revises: 9b3c2f4d7e10
Create Date: 2026-12-03 08:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "7c2f4e1a9d03"
down_revision: str | None = "9b3c2f4d7e10"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES_BEFORE = "state IN ('PENDING', 'ASSIGNED', 'RESOLVED')"
_STATES_AFTER = "state IN ('PENDING', 'ASSIGNED', 'RESOLVED', 'QUARANTINED')"
_EVENTS_BEFORE = "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED')"
_EVENTS_AFTER = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED')"
)


def _replace_check(table: str, name: str, condition: str, *, not_valid: bool = False) -> None:
    # Plain SQL: the names are the full ones the naming convention produced.
    op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition}){' NOT VALID' * not_valid}")


def upgrade() -> None:
    op.add_column("review_queue_item", sa.Column("lease_nonce", sa.UUID(), nullable=True))
    op.add_column(
        "review_queue_item", sa.Column("attempts", sa.Integer(), server_default="0", nullable=False)
    )
    # Until now attempts were the lease epoch; leases in flight get a nonce so their holders
    # can finish (their old epoch-form tokens are refused with 409 and they lease again).
    op.execute("UPDATE review_queue_item SET attempts = LEAST(lease_epoch, 2147483647)")
    op.execute("UPDATE review_queue_item SET lease_nonce = gen_random_uuid() WHERE state = 'ASSIGNED'")
    _replace_check("review_queue_item", "ck_review_queue_item_valid_state", _STATES_AFTER)
    _replace_check("review_queue_event", "ck_review_queue_event_valid_event", _EVENTS_AFTER)
    op.create_index(
        "ix_review_queue_item_quarantined",
        "review_queue_item",
        ["created_at"],
        postgresql_where=sa.text("state = 'QUARANTINED'"),
    )


def downgrade() -> None:
    op.drop_index("ix_review_queue_item_quarantined", table_name="review_queue_item")
    op.execute("UPDATE review_queue_item SET state = 'PENDING' WHERE state = 'QUARANTINED'")
    _replace_check("review_queue_item", "ck_review_queue_item_valid_state", _STATES_BEFORE)
    # Events are append-only, so QUARANTINED/REQUEUED rows stay: the old CHECK is added NOT VALID.
    _replace_check("review_queue_event", "ck_review_queue_event_valid_event", _EVENTS_BEFORE, not_valid=True)
    op.drop_column("review_queue_item", "attempts")
    op.drop_column("review_queue_item", "lease_nonce")
