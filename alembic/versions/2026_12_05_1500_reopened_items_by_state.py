"""The backlog follows the reopened items that can matter to its period, not all of them (issue 29):
the flag.

The backlog report reads the trail of every reopened item that may have been open at one of its
day ends: those open now, and those whose standing decision came on or after the period began. It
found them by checking each open item and each of the period's resolutions against
`review_queue_reopened_item`, one key probe each: 320,000 probes for a week at 10M items, into a
table that grows with the years kept (49,498 rows against 77 without the history).

`review_queue_item.reopened` says the item was reopened once at least; the next migration
(`2026_12_05_1510`) indexes the reopened items by state. The database keeps the flag, as it keeps
`review_queue_reopened_item`: the AFTER INSERT trigger on REOPENED events (SECURITY DEFINER) sets
it, whichever statement reopened the item, and a guard refuses any other change to it (the
application role may update item rows, so without the guard it could set or clear the flag). The
guard's trigger fires only for a statement that names the column, and only when it changes.

ADD COLUMN with a constant default rewrites nothing; the backfill reads the reopened items by key.

Revision ID: 5d1e7a3c9b28
Revises: 2c8f5e1b7d94
Create Date: 2026-12-05 15:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "5d1e7a3c9b28"
down_revision: str | None = "2c8f5e1b7d94"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION review_queue_reopened_item() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    INSERT INTO review_queue_reopened_item (item_id, due_at)
    SELECT id, due_at FROM review_queue_item WHERE id = NEW.item_id
    ON CONFLICT (item_id) DO NOTHING;{flag}
    RETURN NULL;
END
$$
"""
_FLAG = """
    UPDATE review_queue_item SET reopened = true WHERE id = NEW.item_id AND NOT reopened;"""

# The flag is true exactly when the item is in review_queue_reopened_item (which only the trigger
# above writes): a new row is not reopened, and a change must agree with that table.
_GUARD = """
CREATE FUNCTION review_queue_item_reopened_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    IF NEW.reopened IS DISTINCT FROM
       (TG_OP = 'UPDATE' AND EXISTS (SELECT FROM review_queue_reopened_item WHERE item_id = NEW.id)) THEN
        RAISE EXCEPTION 'review_queue_item.reopened is kept by the database (a REOPENED event sets it)'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$
"""
_GUARD_TRIGGERS = (
    "CREATE TRIGGER review_queue_item_reopened_insert BEFORE INSERT ON review_queue_item"
    " FOR EACH ROW WHEN (NEW.reopened) EXECUTE FUNCTION review_queue_item_reopened_guard()",
    "CREATE TRIGGER review_queue_item_reopened_update BEFORE UPDATE OF reopened ON review_queue_item"
    " FOR EACH ROW WHEN (OLD.reopened IS DISTINCT FROM NEW.reopened)"
    " EXECUTE FUNCTION review_queue_item_reopened_guard()",
)


def upgrade() -> None:
    op.add_column(
        "review_queue_item",
        sa.Column("reopened", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.execute(_GUARD)
    for trigger in _GUARD_TRIGGERS:
        op.execute(trigger)
    op.execute(
        "UPDATE review_queue_item SET reopened = true"
        " WHERE id IN (SELECT item_id FROM review_queue_reopened_item)"
    )
    op.execute(_FUNCTION.format(flag=_FLAG))


def downgrade() -> None:
    op.execute(_FUNCTION.format(flag=""))
    op.execute("DROP TRIGGER review_queue_item_reopened_update ON review_queue_item")
    op.execute("DROP TRIGGER review_queue_item_reopened_insert ON review_queue_item")
    op.execute("DROP FUNCTION review_queue_item_reopened_guard()")
    op.drop_column("review_queue_item", "reopened")
