"""Each name the identity provider signs in belongs to one account of it: `oidc_identity` binds a
subject (the reviewer identity) to the (issuer, `sub`) that first used it, so two provider accounts
whose username claims fold to one name can never act as one reviewer (issue 38).

A binding is made once and never changed by the service: the application role may insert and read
it only. An administrator who means a name to pass to another account deletes its row by hand.

Revision ID: 3e7b9c1d5a42
Revises: 8a4c2e6f1d37
Create Date: 2026-12-06 18:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "3e7b9c1d5a42"
down_revision: str | None = "8a4c2e6f1d37"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A copy of db.vocabulary.SUBJECT_CHECK as it is today (migrations are frozen in time).
_SUBJECT_CHECK = (
    "subject ~ '^[a-z0-9][a-z0-9._@+-]{0,127}$'"
    " AND subject NOT IN ('me', 'reclaimer')"
    " AND subject NOT LIKE 'reclaimer@%'"
)


def upgrade() -> None:
    op.create_table(
        "oidc_identity",
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("issuer", sa.Text(), nullable=False),
        sa.Column("provider_subject", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(_SUBJECT_CHECK, name=op.f("ck_oidc_identity_valid_subject")),
        sa.PrimaryKeyConstraint("subject", name=op.f("pk_oidc_identity")),
    )
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE UPDATE, DELETE ON oidc_identity FROM {quoted.replace(chr(39), chr(39) * 2)}';"
        " END IF; END $$"
    )


def downgrade() -> None:
    op.drop_table("oidc_identity")
