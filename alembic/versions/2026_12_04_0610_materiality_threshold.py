"""Materiality: a catalogue-wide approval threshold (issue 23, point 3).

`approval_policy` is one row (its key is `true`, and a CHECK allows no other) holding
`materiality_threshold`: a completion whose abs(variance_amount) is at or above it needs an
approver whatever its code, unless the code's own approval_threshold is lower. Seeded with
10,000.00, the threshold of the catalogue's strictest seeded code. Admins change it
(PUT /resolutions/policy); the application role may read and update the row, never add or delete
one.

Revision ID: ffdf336e39e3
Revises: 55c11bfc0988
Create Date: 2026-12-04 06:10:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "ffdf336e39e3"
down_revision: str | None = "55c11bfc0988"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT_MATERIALITY = "10000.00"


def upgrade() -> None:
    policy = op.create_table(
        "approval_policy",
        sa.Column("id", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("materiality_threshold", sa.Numeric(18, 2), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=True),
        sa.CheckConstraint("id", name=op.f("ck_approval_policy_one_row")),
        sa.CheckConstraint(
            "materiality_threshold >= 0", name=op.f("ck_approval_policy_threshold_not_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approval_policy")),
    )
    op.bulk_insert(policy, [{"id": True, "materiality_threshold": DEFAULT_MATERIALITY}])
    role = context.config.attributes.get("app_role", APP_ROLE)
    exists = op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    if exists:
        # The grants migration's default privileges gave INSERT and DELETE too: one row, kept.
        quoted = '"' + role.replace('"', '""') + '"'
        op.execute(f"REVOKE INSERT, DELETE, TRUNCATE ON approval_policy FROM {quoted}")


def downgrade() -> None:
    op.drop_table("approval_policy")
