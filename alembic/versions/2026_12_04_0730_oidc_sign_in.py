"""Sign-in with an OpenID Connect provider: sign-ins in progress, and the desk sessions they open.

`oidc_login` holds a sign-in between GET /auth/oidc/login and its callback; `oidc_session` the
desk sessions of people the provider signed in (desk_session stays the token sessions' own). Rows
are only created, read and deleted, so the application role loses UPDATE on both, as on desk_session.

Revision ID: 8b3f1d6a2c57
Revises: 7c4e1f9a2b60
Create Date: 2026-12-04 07:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "8b3f1d6a2c57"
down_revision: str | None = "7c4e1f9a2b60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A copy of db.vocabulary.SUBJECT_CHECK as it is today, as migrations are frozen in time: a provider's
# subject obeys the rule a token's does (it goes into leased_by the same way).
# Case-folded, like a token's since 2026_12_04_0600_case_folded_identities.
_SUBJECT_CHECK = (
    "subject ~ '^[a-z0-9][a-z0-9._@+-]{0,127}$'"
    " AND subject NOT IN ('me', 'reclaimer')"
    " AND subject NOT LIKE 'reclaimer@%'"
)


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
    op.create_table(
        "oidc_session",
        sa.Column("id_hash", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("csrf_token", sa.Text(), nullable=False),
        sa.Column("id_token", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(_SUBJECT_CHECK, name=op.f("ck_oidc_session_valid_subject")),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_oidc_session")),
    )
    op.create_index("ix_oidc_session_expires_at", "oidc_session", ["expires_at"], unique=False)
    _revoke_update("oidc_login")
    _revoke_update("oidc_session")


def downgrade() -> None:
    op.drop_index("ix_oidc_session_expires_at", table_name="oidc_session")
    op.drop_table("oidc_session")
    op.drop_index("ix_oidc_login_expires_at", table_name="oidc_login")
    op.drop_table("oidc_login")
