"""Reviewer desk sessions: a cookie's sha256, its token, its CSRF token and expiry.

The application role gets SELECT, INSERT, UPDATE, DELETE on the table by the default privileges of
3e8a1d5c7b42; sessions are only created, read and deleted, so UPDATE is revoked again.

Revision ID: c4d7e2a91f35
Revises: f74a1b5d0c63
Create Date: 2026-12-03 09:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "c4d7e2a91f35"
down_revision: str | None = "f74a1b5d0c63"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "desk_session",
        sa.Column("id_hash", sa.Text(), nullable=False),
        sa.Column("token_id", sa.BigInteger(), nullable=False),
        sa.Column("csrf_token", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_token.id"],
            name=op.f("fk_desk_session_token_id_api_token"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_desk_session")),
    )
    op.create_index("ix_desk_session_expires_at", "desk_session", ["expires_at"], unique=False)
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE UPDATE ON desk_session FROM {quoted.replace(chr(39), chr(39) * 2)}';"
        " END IF; END $$"
    )


def downgrade() -> None:
    op.drop_index("ix_desk_session_expires_at", table_name="desk_session")
    op.drop_table("desk_session")
