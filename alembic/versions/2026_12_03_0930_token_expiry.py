"""Tokens can expire: api_token.expires_at (NULL = never), checked by the token lookup.

Revision ID: d52e9f3b8a41
Revises: c41d8e2a7f30
Create Date: 2026-12-03 09:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "d52e9f3b8a41"
down_revision: str | None = "c41d8e2a7f30"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_token", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("api_token", "expires_at")
