"""The throughput report reads the reopenings of its period, not every reopening kept (issue 29).

A decision reopened since is counted in its bucket from its REOPENED event, which names it
(previous_resolved_at). The report found those events by reading every REOPENED event of the trail
and keeping the ones that name a decision in the period: 49,498 of them at 10M items, 200 ms of a
7-day report that takes 17 ms without the history. A reopening comes after the decision it
reopens, so the period's are among the REOPENED events at or after its start: this index, on
their time, reads those alone. Partial: only a REOPENED event enters it.

On a large trail, build it without blocking writes before upgrading: `CREATE INDEX
ix_review_queue_event_reopened_at ON ONLY review_queue_event (at) WHERE event = 'REOPENED'`, then
for each partition `CREATE INDEX CONCURRENTLY` the same on it and `ALTER INDEX
ix_review_queue_event_reopened_at ATTACH PARTITION` it; the migration then finds the index and
creates nothing.

Revision ID: 2c8f5e1b7d94
Revises: 9b4e2d7c1a63
Create Date: 2026-12-05 13:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "2c8f5e1b7d94"
down_revision: str | None = "9b4e2d7c1a63"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_review_queue_event_reopened_at",
        "review_queue_event",
        ["at"],
        postgresql_where=sa.text("event = 'REOPENED'"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_review_queue_event_reopened_at", table_name="review_queue_event", if_exists=True)
