"""The reports' kept figures (db/reports/rollup.py fills them), on db.tables' `metadata` so that
`alembic check` holds them equal to the migrations."""

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, INTERVAL, JSONB, UUID

from db.tables import metadata

# The throughput report's closed buckets, for one reporting time zone (REVIEW_QUEUE_REPORT_TIME_ZONE):
# per local day (days = 1) or ISO week (days = 7) and reviewer, what the report gives for it
# (db/reports/workload.py). The one state row names the zone and says that every bucket ending by
# `through` is here; the reclaimer's schedule fills them, never past the RESOLVED rollup's edge.
review_queue_throughput_bucket = Table(
    "review_queue_throughput_bucket",
    metadata,
    Column("days", SmallInteger, primary_key=True),
    Column("start", Date, primary_key=True),
    Column("reviewer", Text(collation="C"), primary_key=True),
    *(
        Column(name, Integer, nullable=False)
        for name in ("resolved", "submitted_for_approval", "approved", "rejected", "released", "decisions")
    ),
    Column("median", INTERVAL),
    Column("p90", INTERVAL),
    CheckConstraint("days IN (1, 7)", name="day_or_week"),
    # A release is not a decision (migration 2026_12_07_0050).
    CheckConstraint(
        "decisions = resolved + submitted_for_approval + approved + rejected",
        name="decisions_without_releases",
    ),
)
# ... and the backlog report's point of each closed day (the open items at its end, by age band), and
# its split by currency: {"EUR": [counts per band], ...}, the currencies with items open then
# (2026_12_07_0110; null on a day kept before it, which the next round keeps again).
review_queue_backlog_day = Table(
    "review_queue_backlog_day",
    metadata,
    Column("day", Date, primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("by_age", ARRAY(Integer), nullable=False),
    Column("by_currency", JSONB, nullable=True),
)
review_queue_throughput_rollup = Table(
    "review_queue_throughput_rollup",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("time_zone", Text, nullable=True),
    Column("through", Date, nullable=True),
    Column("rolled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("one", name="one_row"),
)

# The items ever reopened, once each, with their deadline (never changed after enqueue): the SLA
# reads those that fell due in its period (db/reports/). Kept by a trigger on REOPENED events.
review_queue_reopened_item = Table(
    "review_queue_reopened_item",
    metadata,
    Column("item_id", UUID(as_uuid=True), primary_key=True),
    Column("due_at", DateTime(timezone=True), nullable=False),
    Index("ix_review_queue_reopened_item_due_at", "due_at"),
)
