"""An optional `context` object for the reviewer (account, counterparty, value dates, links).

The API caps it at 16 KiB of compact JSON; the check here is the database's own backstop (the
text form of jsonb adds a space after each separator, so it allows for that).

Revision ID: f74a1b5d0c63
Revises: e63fa04c9b52
Create Date: 2026-12-03 09:50:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "f74a1b5d0c63"
down_revision: str | None = "e63fa04c9b52"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("review_queue_item", sa.Column("context", postgresql.JSONB(), nullable=True))
    op.execute(
        "ALTER TABLE review_queue_item ADD CONSTRAINT ck_review_queue_item_context_object"
        " CHECK (context IS NULL OR (jsonb_typeof(context) = 'object'"
        " AND octet_length(context::text) <= 32768))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE review_queue_item DROP CONSTRAINT ck_review_queue_item_context_object")
    op.drop_column("review_queue_item", "context")
