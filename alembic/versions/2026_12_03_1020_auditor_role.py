"""Tokens for auditors: a read-only role that can also export the hash chain.

Revision ID: c2a9e4f1d873
Revises: b7d41c9e2a60
Create Date: 2026-12-03 09:45:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "c2a9e4f1d873"
down_revision: str | None = "b7d41c9e2a60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint(op.f("ck_api_token_valid_role"), "api_token", type_="check")
    op.create_check_constraint(
        op.f("ck_api_token_valid_role"), "api_token", "role IN ('reviewer', 'ingest', 'auditor', 'admin')"
    )


def downgrade() -> None:
    # Auditor tokens cannot survive a downgrade: the old constraint has no such role.
    op.execute("DELETE FROM api_token WHERE role = 'auditor'")
    op.drop_constraint(op.f("ck_api_token_valid_role"), "api_token", type_="check")
    op.create_check_constraint(
        op.f("ck_api_token_valid_role"), "api_token", "role IN ('reviewer', 'ingest', 'admin')"
    )
