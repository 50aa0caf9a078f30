"""Comments on an item's trail (issue 42, part 2): the COMMENTED event.

`POST /items/{id}/comments` appends a COMMENTED event (details: `text`); the item row is not
touched. The event CHECK gains the name, online: it is swapped NOT VALID under one short lock
(lock_timeout 5 s), then validated in a transaction of its own, a scan of every month's partition
under SHARE UPDATE EXCLUSIVE, which leaves writers alone (every existing row passes: the set only
grows). The downgrade keeps the name allowed for rows already
written: events are append-only, so it adds the old CHECK NOT VALID instead of refusing them.

Revision ID: 4f8b2d6e9a15
Revises: 9e3a6c1d7b42
Create Date: 2026-12-06 22:30:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "4f8b2d6e9a15"
down_revision: str | None = "9e3a6c1d7b42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ck_review_queue_event_valid_event"
_BEFORE = (
    "'ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED', 'QUARANTINED', 'REQUEUED',"
    " 'REOPENED', 'REVISED', 'REASSIGNED', 'SUBMITTED_FOR_APPROVAL', 'APPROVED', 'REJECTED'"
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"ALTER TABLE review_queue_event DROP CONSTRAINT {NAME},"
        f" ADD CONSTRAINT {NAME} CHECK (event IN ({_BEFORE}, 'COMMENTED')) NOT VALID"
    )
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE review_queue_event VALIDATE CONSTRAINT {NAME}")


def downgrade() -> None:
    # Events are append-only: comments already written stay, so the old CHECK is not validated.
    op.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {NAME}")
    op.execute(f"ALTER TABLE review_queue_event ADD CONSTRAINT {NAME} CHECK (event IN ({_BEFORE})) NOT VALID")
