"""SLA attainment without reading every reopening ever made (issue 29): the items ever reopened,
by deadline.

The SLA report and /metrics' SLA gauges read the trail of the items ever reopened (their row no
longer tells whether a decision stood at the deadline). They found them from the REOPENED events:
all of them, 4,947 at 1M items of history, whatever the period, so the 7-day gauge grew with
history. `review_queue_reopened_item` holds each reopened item once, with its deadline (which never
changes after enqueue), indexed by it: the SLA now reads only the reopened items that fell due in
its period.

An AFTER INSERT trigger on REOPENED events adds the item (the database keeps it, whatever the
application does); this migration adds the items already reopened. The trigger's function is
SECURITY DEFINER (the schema owner's, with a fixed search_path), so the application role may only
read the table: it cannot put an item there first with another deadline.

Revision ID: 3f6a9b2d8c15
Revises: 9e3b57c0d412
Create Date: 2026-12-04 16:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "3f6a9b2d8c15"
down_revision: str | None = "9e3b57c0d412"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "review_queue_reopened_item",
        sa.Column("item_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("item_id", name=op.f("pk_review_queue_reopened_item")),
    )
    op.create_index("ix_review_queue_reopened_item_due_at", "review_queue_reopened_item", ["due_at"])
    op.execute(
        """
        CREATE FUNCTION review_queue_reopened_item() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, public, pg_temp
        AS $$
        BEGIN
            INSERT INTO review_queue_reopened_item (item_id, due_at)
            SELECT id, due_at FROM review_queue_item WHERE id = NEW.item_id
            ON CONFLICT (item_id) DO NOTHING;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute("REVOKE EXECUTE ON FUNCTION review_queue_reopened_item() FROM PUBLIC")
    op.execute(
        """
        CREATE TRIGGER review_queue_reopened_item
        AFTER INSERT ON review_queue_event
        FOR EACH ROW WHEN (NEW.event = 'REOPENED')
        EXECUTE FUNCTION review_queue_reopened_item()
        """
    )
    op.execute(
        """
        INSERT INTO review_queue_reopened_item (item_id, due_at)
        SELECT i.id, i.due_at
        FROM (SELECT DISTINCT item_id FROM review_queue_event WHERE event = 'REOPENED') AS r
        JOIN review_queue_item i ON i.id = r.item_id
        """
    )
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON review_queue_reopened_item FROM {quoted}';"
        " END IF; END $$"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER review_queue_reopened_item ON review_queue_event")
    op.execute("DROP FUNCTION review_queue_reopened_item()")
    op.drop_index("ix_review_queue_reopened_item_due_at", table_name="review_queue_reopened_item")
    op.drop_table("review_queue_reopened_item")
