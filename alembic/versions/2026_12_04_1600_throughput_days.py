"""The throughput and backlog reports over a year in well under a second (issue 28): their closed
days (and weeks), precomputed for one reporting time zone.

`review_queue_throughput_bucket` holds, per local day or ISO week of the zone and reviewer, what
the report gives for it: decisions by outcome, and the median and p90 time from lease to decision.
The report reads a bucket from here when it is over (and a day or a Monday week) in that zone, and
from the trail otherwise (another zone, the current day or week); the figures are the same either
way (tests/integration/db/test_reports.py). `review_queue_backlog_day` holds, per closed local day, the
backlog's point (the open items at the day's end by age band), read the same way.
`review_queue_throughput_rollup` is one row: the zone, and the day
by which every bucket here has ended (`through`). Both start empty: until the reclaimer's schedule
has filled them, the report reads the trail, exactly as before.

The application role adds and deletes buckets (the reclaimer runs as it), never changes one, and
may read and update the state row, never insert or delete one.

Revision ID: 9e3b57c0d412
Revises: 5d0c4f1e2a77
Create Date: 2026-12-04 16:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "9e3b57c0d412"
down_revision: str | None = "5d0c4f1e2a77"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTS = ("resolved", "submitted_for_approval", "approved", "rejected", "released", "decisions")


def upgrade() -> None:
    op.create_table(
        "review_queue_throughput_bucket",
        sa.Column("days", sa.SmallInteger(), nullable=False),
        sa.Column("start", sa.Date(), nullable=False),
        sa.Column("reviewer", sa.Text(collation="C"), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in COUNTS),
        sa.Column("median", postgresql.INTERVAL(), nullable=True),
        sa.Column("p90", postgresql.INTERVAL(), nullable=True),
        sa.CheckConstraint("days IN (1, 7)", name=op.f("ck_review_queue_throughput_bucket_day_or_week")),
        sa.PrimaryKeyConstraint("days", "start", "reviewer", name=op.f("pk_review_queue_throughput_bucket")),
    )
    op.create_table(
        "review_queue_backlog_day",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("by_age", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.PrimaryKeyConstraint("day", name=op.f("pk_review_queue_backlog_day")),
    )
    op.create_table(
        "review_queue_throughput_rollup",
        sa.Column("one", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("time_zone", sa.Text(), nullable=True),
        sa.Column("through", sa.Date(), nullable=True),
        sa.Column("rolled_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("one", name=op.f("ck_review_queue_throughput_rollup_one_row")),
        sa.PrimaryKeyConstraint("one", name=op.f("pk_review_queue_throughput_rollup")),
    )
    op.execute("INSERT INTO review_queue_throughput_rollup (time_zone, through) VALUES (NULL, NULL)")
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE INSERT, DELETE, TRUNCATE ON review_queue_throughput_rollup FROM {quoted}';"
        f" EXECUTE 'REVOKE UPDATE, TRUNCATE ON review_queue_throughput_bucket FROM {quoted}';"
        f" EXECUTE 'REVOKE UPDATE, TRUNCATE ON review_queue_backlog_day FROM {quoted}';"
        " END IF; END $$"
    )


def downgrade() -> None:
    op.drop_table("review_queue_throughput_rollup")
    op.drop_table("review_queue_backlog_day")
    op.drop_table("review_queue_throughput_bucket")
