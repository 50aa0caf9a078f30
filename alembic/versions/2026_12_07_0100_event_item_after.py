"""The item as it stood right after each event (issue 42, Integrations): `review_queue_event.item_after`.

A feed entry and a webhook carried the item as it is now, so a RESOLVED event read (or a delivery
retried) after the item was reopened and revised said PENDING with the new amount. Every statement
that writes an event now also writes, in the same INSERT and from the UPDATE's RETURNING, the
item's changeable columns as they stand after it (db/queue/rows.py, AFTER_FIELDS), as a
jsonb array in that order.

Online: `item_after jsonb` is nullable without a default, so adding it changes the catalogue only
(the parent and every month's partition), under one short ACCESS EXCLUSIVE lock with lock_timeout
5 s (a busy moment fails the migration, nothing changed, and it is run again); no row is rewritten
and no index is built. Events written before it keep a null `item_after`: the trail is
append-only and what their item looked like then is not known, so the feed serves them with the
item as it is now and says so (`item_as_of: "now"`). The application role may insert the column
(its INSERT on the events is by column: id, at and xid always come from their defaults). The
hash chain is unchanged: it encodes the event's own fields only (docs/audit.md), so events sealed
before and after verify as they did.

The transaction commits at the end (an empty autocommit block), so a later migration of the same
upgrade does not lock another table while this one still holds the events'.

Revision ID: 7c1e5a9d3b60
Revises: 7c1d2e9f4a60
Create Date: 2026-12-07 01:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "7c1e5a9d3b60"
down_revision: str | None = "7c1d2e9f4a60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _app_role() -> str | None:
    role = context.config.attributes.get("app_role", APP_ROLE)
    found = op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    return f'"{role}"' if found else None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE review_queue_event ADD COLUMN IF NOT EXISTS item_after jsonb")
    role = _app_role()
    if role is not None:
        op.execute(f"GRANT INSERT (item_after) ON review_queue_event TO {role}")
    with op.get_context().autocommit_block():
        pass


def downgrade() -> None:
    role = _app_role()
    if role is not None:
        op.execute(f"REVOKE INSERT (item_after) ON review_queue_event FROM {role}")
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE review_queue_event DROP COLUMN item_after")
