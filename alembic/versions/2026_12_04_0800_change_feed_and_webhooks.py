"""Decisions flow out (issue 27): webhook subscriptions, their delivery attempts, and the role
`integration` that reads the change feed.

The feed itself needs no new index: it walks `ix_review_queue_event_xid_id` (the sealer's) and
looks at one item's trail through `ix_review_queue_event_item_id_id` (docs/integrations.md).

`webhook_subscription` holds each subscription's position in the feed (cursor_xid, cursor_id),
its retry state, and a claim (claimed_by, claim_nonce, claim_expires_at) that one deliverer takes
with FOR UPDATE SKIP LOCKED in a short transaction, so that no transaction id is held while a
request is in flight. The secret is stored Fernet-encrypted (docs/security.md). Subscriptions are
deactivated, never deleted, so the application role loses DELETE on them; attempts are appended
and pruned, never changed, so it loses UPDATE on those.

Revision ID: 7019dfc9a481
Revises: 8b3f1d6a2c57
Create Date: 2026-12-04 08:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import context, op
from db.roles import APP_ROLE
from db.tables import Xid8

revision: str = "7019dfc9a481"
down_revision: str | None = "8b3f1d6a2c57"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLES_BEFORE = "role IN ('reviewer', 'approver', 'ingest', 'auditor', 'admin')"
_ROLES_AFTER = "role IN ('reviewer', 'approver', 'ingest', 'auditor', 'admin', 'integration')"


def _revoke(statement: str) -> None:
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE '{statement.format(role=quoted).replace(chr(39), chr(39) * 2)}';"
        " END IF; END $$"
    )


def _replace_role_check(condition: str) -> None:
    op.execute("ALTER TABLE api_token DROP CONSTRAINT ck_api_token_valid_role")
    op.execute(f"ALTER TABLE api_token ADD CONSTRAINT ck_api_token_valid_role CHECK ({condition})")


def upgrade() -> None:
    _replace_role_check(_ROLES_AFTER)
    op.create_table(
        "webhook_subscription",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_types", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.Column("active", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("cursor_xid", Xid8(), nullable=False),
        sa.Column("cursor_id", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("gave_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("claim_nonce", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("claim_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'", name=op.f("ck_webhook_subscription_valid_name")
        ),
        sa.CheckConstraint("url ~ '^https?://'", name=op.f("ck_webhook_subscription_http_url")),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_webhook_subscription_attempts_not_negative")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_webhook_subscription")),
    )
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("subscription", sa.Text(), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("webhook_id", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "attempted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('delivered', 'failed')", name=op.f("ck_webhook_delivery_valid_outcome")
        ),
        sa.ForeignKeyConstraint(
            ["subscription"],
            ["webhook_subscription.name"],
            name=op.f("fk_webhook_delivery_subscription_webhook_subscription"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_delivery")),
    )
    op.create_index(
        "ix_webhook_delivery_subscription_id", "webhook_delivery", ["subscription", "id"], unique=False
    )
    _revoke("REVOKE DELETE, TRUNCATE ON webhook_subscription FROM {role}")
    _revoke("REVOKE UPDATE, TRUNCATE ON webhook_delivery FROM {role}")


def downgrade() -> None:
    op.drop_index("ix_webhook_delivery_subscription_id", table_name="webhook_delivery")
    op.drop_table("webhook_delivery")
    op.drop_table("webhook_subscription")
    # Integration tokens cannot survive a downgrade: the old constraint has no such role.
    op.execute("DELETE FROM api_token WHERE role = 'integration'")
    _replace_role_check(_ROLES_BEFORE)
