"""The controller's reports (issue 28): the indexes that let them read a year of history quickly.

Every report reads resolved history, so each new index of the queue table is partial on
`state = 'RESOLVED'`: an item enters it once, when it is resolved, and no lease, renewal or
release writes to it. The open items come from the existing partial indexes of the live queue.
The event indexes are partial too: the events a report reads are a small share of the trail
(decisions, the holders' other decisions, reopenings, lease starts); a RENEWED event enters none,
a LEASED event one (the time from lease to decision needs it).

On a large existing table, create these by hand with CREATE INDEX CONCURRENTLY (same names,
same definitions) before upgrading: the migration then finds them and creates nothing, so
writes are never blocked (docs/reports.md, "Indexes").

Revision ID: eab21db521e5
Revises: 7019dfc9a481
Create Date: 2026-12-04 08:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "eab21db521e5"
down_revision: str | None = "7019dfc9a481"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RESOLVED = sa.text("state = 'RESOLVED'")
# The decisions a reviewer makes besides resolving: a proposal submitted for approval, a rejection,
# and a release by the lease's holder (an admin's override release is not the holder's decision).
OTHER_WORK = sa.text(
    "event IN ('SUBMITTED_FOR_APPROVAL', 'REJECTED') OR (event = 'RELEASED' AND NOT details ? 'override')"
)


def upgrade() -> None:
    # SLA: the items that fell due in a period, with what decides whether on time.
    op.create_index(
        "ix_review_queue_item_resolved_due",
        "review_queue_item",
        ["due_at"],
        postgresql_include=["created_at", "resolved_at", "ledger_entity"],
        postgresql_where=RESOLVED,
        if_not_exists=True,
    )
    # Throughput and backlog: the items resolved in a period, with their lease and deciders.
    op.create_index(
        "ix_review_queue_item_resolved_at",
        "review_queue_item",
        ["resolved_at"],
        postgresql_include=["created_at", "leased_at", "resolved_by", "approved_by"],
        postgresql_where=RESOLVED,
        if_not_exists=True,
    )
    # The items whose decision was ever reopened: the reports read their trail, not their row.
    op.create_index(
        "ix_review_queue_event_reopened",
        "review_queue_event",
        ["item_id"],
        postgresql_where=sa.text("event = 'REOPENED'"),
        if_not_exists=True,
    )
    # The decisions export, in (at, id) order, a page at a time.
    op.create_index(
        "ix_review_queue_event_decision_at",
        "review_queue_event",
        ["at", "id"],
        postgresql_where=sa.text("event IN ('RESOLVED', 'APPROVED')"),
        if_not_exists=True,
    )
    # The lease each of those decisions ended: the item's latest LEASED or REASSIGNED event before it,
    # read from the index alone.
    op.create_index(
        "ix_review_queue_event_lease_start",
        "review_queue_event",
        ["item_id", "id"],
        postgresql_include=["at"],
        postgresql_where=sa.text("event IN ('LEASED', 'REASSIGNED')"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_review_queue_event_other_work_at",
        "review_queue_event",
        ["at", "id"],
        postgresql_include=["item_id", "actor", "event"],
        postgresql_where=OTHER_WORK,
        if_not_exists=True,
    )


def downgrade() -> None:
    for name, table in (
        ("ix_review_queue_event_other_work_at", "review_queue_event"),
        ("ix_review_queue_event_lease_start", "review_queue_event"),
        ("ix_review_queue_event_decision_at", "review_queue_event"),
        ("ix_review_queue_event_reopened", "review_queue_event"),
        ("ix_review_queue_item_resolved_at", "review_queue_item"),
        ("ix_review_queue_item_resolved_due", "review_queue_item"),
    ):
        op.drop_index(name, table_name=table)
