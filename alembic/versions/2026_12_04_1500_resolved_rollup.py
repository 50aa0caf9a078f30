"""/stats without counting history (issue 29): a rollup of the RESOLVED count, and an index of
reopenings by transaction.

`review_queue_resolved_rollup` holds one row: how many items were RESOLVED with a resolved_at before
`edge`, as of the snapshot `counted_in`. The reclaimer's schedule moves it forward (db/stats.py,
`roll_up_resolved`); /stats adds the resolutions from `edge` on (ix_review_queue_item_resolved_at)
and takes off the rolled-up resolutions reopened since `counted_in` (the new partial index, on the
reopening's transaction id). The row starts empty (`edge` = -infinity): until the first roll-up,
/stats counts every resolution live, exactly as before, and the first runs fold history in a week
at a time.

The application role may read and update the row, never insert or delete one (new tables get all
four by the default privileges of 2026_12_03_0900; this revokes two).

On a large event table create the index first by hand with CREATE INDEX CONCURRENTLY (same name,
same definition): the migration then finds it.

Revision ID: c4e9a2f17b80
Revises: 7b2dacd75433
Create Date: 2026-12-04 15:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE
from db.tables import PgSnapshot

revision: str = "c4e9a2f17b80"
down_revision: str | None = "7b2dacd75433"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "review_queue_resolved_rollup",
        sa.Column("one", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("edge", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved", sa.BigInteger(), nullable=False),
        sa.Column("counted_in", PgSnapshot(), nullable=False),
        sa.Column("rolled_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("one", name=op.f("ck_review_queue_resolved_rollup_one_row")),
        sa.CheckConstraint("resolved >= 0", name=op.f("ck_review_queue_resolved_rollup_not_negative")),
        sa.PrimaryKeyConstraint("one", name=op.f("pk_review_queue_resolved_rollup")),
    )
    op.execute(
        "INSERT INTO review_queue_resolved_rollup (edge, resolved, counted_in)"
        " VALUES ('-infinity', 0, pg_current_snapshot())"
    )
    op.create_index(
        "ix_review_queue_event_reopened_xid",
        "review_queue_event",
        ["xid"],
        postgresql_where=sa.text("event = 'REOPENED'"),
        if_not_exists=True,
    )
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE INSERT, DELETE, TRUNCATE ON review_queue_resolved_rollup FROM {quoted}';"
        " END IF; END $$"
    )


def downgrade() -> None:
    op.drop_index("ix_review_queue_event_reopened_xid", table_name="review_queue_event")
    op.drop_table("review_queue_resolved_rollup")
