"""Exchange rates into the base currency (issue 40): one row per rate set, never changed or deleted.

`rate` is the value of one unit of `currency` in the base currency (REVIEW_QUEUE_BASE_CURRENCY),
kept with who set it and when; the rate of a currency at an instant is the last one set before it.
The application role may insert and read, nothing else: the history is the evidence of which rate
four eyes used.

Revision ID: 6b2d8e4f1a93
Revises: 4e7b1c9a2d55
Create Date: 2026-12-06 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "6b2d8e4f1a93"
down_revision: str | None = "4e7b1c9a2d55"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fx_rate",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("currency", sa.Text(), nullable=False),
        sa.Column("rate", sa.Numeric(), nullable=False),
        sa.Column("set_by", sa.Text(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_fx_rate_currency_code")),
        sa.CheckConstraint(
            "rate > 0 AND rate = round(rate, 10) AND rate < 1e12", name=op.f("ck_fx_rate_rate_bounds")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fx_rate")),
    )
    op.create_index("ix_fx_rate_currency_set_at", "fx_rate", ["currency", "set_at", "id"])
    role = context.config.attributes.get("app_role", APP_ROLE)
    exists = op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    if exists:
        # Append-only: the default privileges gave UPDATE and DELETE too.
        quoted = '"' + role.replace('"', '""') + '"'
        op.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON fx_rate FROM {quoted}")


def downgrade() -> None:
    op.drop_table("fx_rate")
