"""A sign-in in progress lives in its browser's sealed cookie, not in the database (issue 38): 10,000
anonymous `GET /auth/oidc/login` filled `oidc_login` and every real sign-in then got `OIDC_BUSY`.
`oidc_used_state` records a state once its callback has used it, so a replay is still refused.

Sign-ins in progress when this runs are lost (their people start again); downgrading recreates the
empty table.

Revision ID: 6c2d8e4f0b19
Revises: 3e7b9c1d5a42
Create Date: 2026-12-06 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "6c2d8e4f0b19"
down_revision: str | None = "3e7b9c1d5a42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _revoke_update(table: str) -> None:
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE UPDATE ON {table} FROM {quoted.replace(chr(39), chr(39) * 2)}';"
        " END IF; END $$"
    )


def upgrade() -> None:
    op.create_table(
        "oidc_used_state",
        sa.Column("state_hash", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("state_hash", name=op.f("pk_oidc_used_state")),
    )
    op.create_index("ix_oidc_used_state_expires_at", "oidc_used_state", ["expires_at"], unique=False)
    _revoke_update("oidc_used_state")
    op.drop_index("ix_oidc_login_expires_at", table_name="oidc_login")
    op.drop_table("oidc_login")


def downgrade() -> None:
    op.create_table(
        "oidc_login",
        sa.Column("state_hash", sa.Text(), nullable=False),
        sa.Column("browser_hash", sa.Text(), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("code_verifier", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("state_hash", name=op.f("pk_oidc_login")),
    )
    op.create_index("ix_oidc_login_expires_at", "oidc_login", ["expires_at"], unique=False)
    _revoke_update("oidc_login")
    op.drop_index("ix_oidc_used_state_expires_at", table_name="oidc_used_state")
    op.drop_table("oidc_used_state")
