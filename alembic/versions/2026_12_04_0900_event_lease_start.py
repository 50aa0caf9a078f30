"""The throughput report (issue 28) without a lookup per decision: each submission, rejection and
release records when the lease it ended began, and each reopening when the lease of the decision
it reopened began.

`review_queue_event.leased_at` is set by the database, never by the application: a BEFORE INSERT
trigger, only for those four events, copies the `at` of the item's latest LEASED or REASSIGNED
event before it (trail order), the very lookup the report made for each such decision over a year
of history (82,614 index probes at 1M items). Events are written while their item's row is
locked, so that lookup cannot miss an event of the same item still being written. Events from
before this migration keep `leased_at` null (the trail is append-only; nothing is backfilled), and
the report falls back to the lookup for them.

The holders' other decisions are then read from one index, with their lease start included, that
replaces `ix_review_queue_event_other_work_at`. On a large table create it first by hand with
CREATE INDEX CONCURRENTLY (same name, same definition): the migration then finds it.

Revision ID: 7b2dacd75433
Revises: eab21db521e5
Create Date: 2026-12-04 09:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "7b2dacd75433"
down_revision: str | None = "eab21db521e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OTHER_WORK = sa.text(
    "event IN ('SUBMITTED_FOR_APPROVAL', 'REJECTED') OR (event = 'RELEASED' AND NOT details ? 'override')"
)


def upgrade() -> None:
    op.add_column("review_queue_event", sa.Column("leased_at", sa.DateTime(timezone=True), nullable=True))
    # Whatever an INSERT says, the trigger decides the value (a forged lease start is overwritten).
    op.execute(
        """
        CREATE FUNCTION review_queue_event_lease_start() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.leased_at := (
                SELECT l.at FROM review_queue_event l
                WHERE l.item_id = NEW.item_id AND l.id < NEW.id AND l.event IN ('LEASED', 'REASSIGNED')
                ORDER BY l.id DESC LIMIT 1
            );
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER review_queue_event_lease_start
        BEFORE INSERT ON review_queue_event
        FOR EACH ROW WHEN (NEW.event IN ('SUBMITTED_FOR_APPROVAL', 'REJECTED', 'RELEASED', 'REOPENED'))
        EXECUTE FUNCTION review_queue_event_lease_start()
        """
    )
    op.create_index(
        "ix_review_queue_event_other_work",
        "review_queue_event",
        ["at", "id"],
        postgresql_include=["item_id", "actor", "event", "leased_at"],
        postgresql_where=OTHER_WORK,
        if_not_exists=True,
    )
    op.drop_index("ix_review_queue_event_other_work_at", table_name="review_queue_event")


def downgrade() -> None:
    op.create_index(
        "ix_review_queue_event_other_work_at",
        "review_queue_event",
        ["at", "id"],
        postgresql_include=["item_id", "actor", "event"],
        postgresql_where=OTHER_WORK,
    )
    op.drop_index("ix_review_queue_event_other_work", table_name="review_queue_event")
    op.execute("DROP TRIGGER review_queue_event_lease_start ON review_queue_event")
    op.execute("DROP FUNCTION review_queue_event_lease_start()")
    op.drop_column("review_queue_event", "leased_at")
