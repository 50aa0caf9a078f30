"""Deadlines: every item gets a due_at, and leases go earliest due_at first.

Existing rows get created_at + the default SLA tier of abs(variance_amount) (the default of
REVIEW_QUEUE_SLA_TIERS, frozen here as it was when this migration was written: a migration must
not change meaning when a setting does). A row inserted later without a due_at (by SQL, not the
API, which always sets one) gets now() + 168 h, the lowest default tier.

The lease's partial index of PENDING rows becomes (due_at, created_at), the lease order: with a
second index of PENDING rows by created_at beside it, the planner sorted all pending rows when
their deadlines did not follow the table's physical order (tests/integration/db/test_query_plans.py). A second
one leads with ledger_entity, for a reviewer who handles one entity. A third, of the other open
items (neither PENDING nor RESOLVED: leased, quarantined, and any open state added later) by
due_at, gives the overdue gauges and the aging figures, with the PENDING index, without reading
the resolved history; it leaves PENDING rows out so that the lease cannot choose it.

Revision ID: d8e2b5a17c40
Revises: c2a9e4f1d873
Create Date: 2026-12-03 11:10:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "d8e2b5a17c40"
down_revision: str | None = "c2a9e4f1d873"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# REVIEW_QUEUE_SLA_TIERS' default when this was written: (at least this abs(amount), hours).
TIERS = ((100_000, 24), (10_000, 72), (1_000, 120), (0, 168))


def upgrade() -> None:
    op.add_column("review_queue_item", sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
    tiers = " ".join(f"WHEN abs(variance_amount) >= {floor} THEN {hours}" for floor, hours in TIERS)
    op.execute(f"UPDATE review_queue_item SET due_at = created_at + make_interval(hours => CASE {tiers} END)")
    op.alter_column(
        "review_queue_item",
        "due_at",
        nullable=False,
        server_default=sa.text("now() + interval '168 hours'"),
    )
    op.create_index(
        "ix_review_queue_item_pending_due",
        "review_queue_item",
        ["due_at", "created_at"],
        postgresql_where=sa.text("state = 'PENDING'"),
    )
    op.create_index(
        "ix_review_queue_item_pending_entity_due",
        "review_queue_item",
        ["ledger_entity", "due_at", "created_at"],
        postgresql_where=sa.text("state = 'PENDING'"),
    )
    op.create_index(
        "ix_review_queue_item_open_due",
        "review_queue_item",
        ["due_at"],
        postgresql_where=sa.text("state NOT IN ('PENDING', 'RESOLVED')"),
    )
    op.drop_index("ix_review_queue_item_pending", table_name="review_queue_item")


def downgrade() -> None:
    op.create_index(
        "ix_review_queue_item_pending",
        "review_queue_item",
        ["created_at"],
        postgresql_where=sa.text("state = 'PENDING'"),
    )
    op.drop_index("ix_review_queue_item_open_due", table_name="review_queue_item")
    op.drop_index("ix_review_queue_item_pending_entity_due", table_name="review_queue_item")
    op.drop_index("ix_review_queue_item_pending_due", table_name="review_queue_item")
    op.drop_column("review_queue_item", "due_at")
