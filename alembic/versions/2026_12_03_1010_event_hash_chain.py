"""Hash-chained audit trail: each event's transaction id, and the chain a sealer appends to.

Revision ID: b7d41c9e2a60
Revises: c4d7e2a91f35
Create Date: 2026-12-03 09:30:00+00:00

`review_queue_event.xid` is the inserting transaction's id (`pg_current_xact_id()`), so the
sealer can tell events of finished transactions from events of transactions still in flight
(an identity value taken by an open transaction can commit after higher ones). Existing rows
get the migration's own transaction id, so they keep their id order in the chain.

`review_queue_chain` is append-only like the events (same trigger, and the application role
may only SELECT and INSERT: the default privileges of the grants migration would give it UPDATE
and DELETE too). No foreign key from event_id: the sealer only appends ids it has just read, the
verifier checks that every sealed event exists, and a foreign key would cost an RI trigger call
per sealed event on the machine the API shares. See docs/audit.md.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE
from db.tables import Xid8

revision: str = "b7d41c9e2a60"
down_revision: str | None = "c4d7e2a91f35"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _app_role(statement: str) -> None:
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted = '"' + role.replace('"', '""') + '"'
    literal = role.replace("'", "''")
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN
                EXECUTE '{statement.format(role=quoted).replace(chr(39), chr(39) * 2)}';
            END IF;
        END
        $$
        """
    )


def upgrade() -> None:
    op.add_column(
        "review_queue_event",
        sa.Column("xid", Xid8(), server_default=sa.text("pg_current_xact_id()"), nullable=False),
    )
    # The sealer walks events by (xid, id) from the chain's head: an index range scan, whatever
    # the size of the sealed history.
    op.create_index("ix_review_queue_event_xid_id", "review_queue_event", ["xid", "id"])
    op.create_table(
        "review_queue_chain",
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("seq > 0", name=op.f("ck_review_queue_chain_positive_seq")),
        sa.CheckConstraint("length(hash) = 32", name=op.f("ck_review_queue_chain_sha256")),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_review_queue_chain")),
        sa.UniqueConstraint("event_id", name=op.f("uq_review_queue_chain_event_id")),
    )
    op.execute(
        """
        CREATE FUNCTION review_queue_chain_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'review_queue_chain is append-only: % refused', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER review_queue_chain_no_change BEFORE UPDATE OR DELETE ON review_queue_chain"
        " FOR EACH ROW EXECUTE FUNCTION review_queue_chain_append_only()"
    )
    op.execute(
        "CREATE TRIGGER review_queue_chain_no_truncate BEFORE TRUNCATE ON review_queue_chain"
        " FOR EACH STATEMENT EXECUTE FUNCTION review_queue_chain_append_only()"
    )
    _app_role("REVOKE UPDATE, DELETE, TRUNCATE ON review_queue_chain FROM {role}")


def downgrade() -> None:
    op.execute("DROP TRIGGER review_queue_chain_no_truncate ON review_queue_chain")
    op.execute("DROP TRIGGER review_queue_chain_no_change ON review_queue_chain")
    op.execute("DROP FUNCTION review_queue_chain_append_only()")
    op.drop_table("review_queue_chain")
    op.drop_index("ix_review_queue_event_xid_id", table_name="review_queue_event")
    op.drop_column("review_queue_event", "xid")
