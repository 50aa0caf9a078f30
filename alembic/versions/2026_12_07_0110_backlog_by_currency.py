"""The backlog report split by currency (issue 40): the kept days carry their split, and the
revisions that changed an item's currency are indexed by time.

`GET /reports/backlog?by=currency` gives each day's open items per currency, as each item's currency
stood at the day's end (a revision can change it). Online, on a large trail:
1. under one short lock (lock_timeout 5 s: a busy moment fails the migration, nothing changed, and it
   is run again), catalogue changes only: `review_queue_backlog_day.by_currency jsonb`, nullable (no
   rewrite; a row per kept day), and the partial index `ix_review_queue_event_currency_revised` ON ONLY
   the partitioned event table (invalid until every partition has its own; no partition is read);
2. per month partition, outside the migration's transaction: CREATE INDEX CONCURRENTLY of the same
   index (writes go on), then ATTACH PARTITION to the parent's; after the last, the parent's is
   valid. A partition created later gets it from the parent.

The days kept before this have no split (null): the reclaimer's next round sees them and keeps every
closed day again (db/reports/rollup.py; "after an upgrade the first rounds fill the history"), and
until then a report split by currency reads those days from the trail. A reclaimer of the release
before, during a rolling upgrade, keeps days without the split: the same happens again, no figure is
ever wrong. Should step 2 fail midway (a rare deadlock), run the migration again: it skips what is
done.

Revision ID: 7b2e4d9c1f30
Revises: 7c1e5a9d3b60
Create Date: 2026-12-07 01:10:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "7b2e4d9c1f30"
down_revision: str | None = "7c1e5a9d3b60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_review_queue_event_currency_revised"
DEFINITION = (
    "(at) INCLUDE (item_id) WHERE event = 'REVISED' AND (details -> 'previous' ->> 'currency')"
    " IS DISTINCT FROM (details -> 'current' ->> 'currency')"
)
_PARTITIONS = (
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = 'review_queue_event'::regclass ORDER BY c.relname"
)
# The partition's index already attached to the parent's (a run after a failed one).
_ATTACHED = (
    "SELECT x.relname FROM pg_inherits i JOIN pg_class x ON x.oid = i.inhrelid"
    " JOIN pg_index p ON p.indexrelid = x.oid"
    " WHERE i.inhparent = CAST(:parent AS regclass) AND p.indrelid = CAST(:partition AS regclass)"
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE review_queue_backlog_day ADD COLUMN IF NOT EXISTS by_currency jsonb")
    op.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON ONLY review_queue_event {DEFINITION}")
    with op.get_context().autocommit_block():
        bind = op.get_bind()
        for partition in bind.execute(sa.text(_PARTITIONS)).scalars().all():
            attached = bind.execute(sa.text(_ATTACHED), {"parent": INDEX, "partition": partition}).first()
            if attached is not None:
                continue
            name = f"{partition}_currency_revised"[:63]
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")  # an invalid one from a failed run
            op.execute(f"CREATE INDEX CONCURRENTLY {name} ON {partition} {DEFINITION}")
            op.execute(f"ALTER INDEX {INDEX} ATTACH PARTITION {name}")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")
    op.execute("ALTER TABLE review_queue_backlog_day DROP COLUMN IF EXISTS by_currency")
