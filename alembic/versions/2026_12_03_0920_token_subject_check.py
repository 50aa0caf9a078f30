"""Token subjects: a documented pattern and reserved names, enforced by the database.

An empty subject makes `leased_by` empty, `me` is what `leased_by=me` means for every caller,
and `reclaimer` / `reclaimer@<host>` is the reclaimer's actor in the audit trail. Existing rows
permitting, the constraint is validated; otherwise it holds for new and updated rows only
(NOT VALID) and the offending rows are named, so the upgrade never fails on old data.

Revision ID: c41d8e2a7f30
Revises: 3e8a1d5c7b42
Create Date: 2026-12-03 09:20:00+00:00
"""

import logging
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c41d8e2a7f30"
down_revision: str | None = "3e8a1d5c7b42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ck_api_token_valid_subject"
# A copy, as migrations are frozen in time; db.vocabulary.SUBJECT_CHECK is today's.
CHECK = (
    "subject ~ '^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$'"
    " AND lower(subject) NOT IN ('me', 'reclaimer')"
    " AND lower(subject) NOT LIKE 'reclaimer@%'"
)


def upgrade() -> None:
    op.execute(f"ALTER TABLE api_token ADD CONSTRAINT {NAME} CHECK ({CHECK}) NOT VALID")
    bad = op.get_bind().execute(sa.text(f"SELECT id, subject FROM api_token WHERE NOT ({CHECK})")).all()
    if bad:
        listed = ", ".join(f"{row.id}:{row.subject!r}" for row in bad)
        logging.getLogger("alembic.runtime.migration").warning(
            "api_token rows breaking %s (left as they are; revoke them): %s", NAME, listed
        )
    else:
        op.execute(f"ALTER TABLE api_token VALIDATE CONSTRAINT {NAME}")


def downgrade() -> None:
    op.execute(f"ALTER TABLE api_token DROP CONSTRAINT {NAME}")
