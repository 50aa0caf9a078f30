"""Identities are case-folded: `caseyX` and `CaseyX` are one person (issue 23, point 2).

A token's subject is stored folded (lower case): the subject CHECK now admits lower-case subjects
only, so two spellings of one identity cannot exist, active or revoked. The item columns that hold
identities (leased_by, resolved_by, prepared_by, approved_by) are folded too, and the segregation
of duties CHECKs compare folded values. Events are left as they are: they are the append-only,
hash-chained record of what was written at the time.

Folding is `lower()`, the same as Python's `str.lower()` on a subject: subjects are ASCII (the CHECK's
pattern), where the two agree whatever the database's collation (`casefold()` would not agree with
PostgreSQL on non-ASCII text, so it is not used anywhere).

Two spellings of one folded subject among the tokens (`caseyX` and `CaseyX`, say) may be one
person or two; the migration cannot tell, so it stops and names them with the two ways out. Once
folded, a decision that one identity both prepared and approved (four eyes in name only) is named
in a warning: its CHECK then holds for new and changed rows only (NOT VALID), so the upgrade never
fails on old data, and the item can be reopened.

Revision ID: 55c11bfc0988
Revises: 5e1c0a7d2b94
Create Date: 2026-12-04 06:00:00+00:00
"""

import logging
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from db.migrations import MigrationRefused

revision: str = "55c11bfc0988"
down_revision: str | None = "5e1c0a7d2b94"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")

ITEM_IDENTITIES = ("leased_by", "resolved_by", "prepared_by", "approved_by")

# Copies, as migrations are frozen in time; db.tables has today's.
SUBJECT_BEFORE = (
    "subject ~ '^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$'"
    " AND lower(subject) NOT IN ('me', 'reclaimer')"
    " AND lower(subject) NOT LIKE 'reclaimer@%'"
)
SUBJECT_AFTER = (
    "subject ~ '^[a-z0-9][a-z0-9._@+-]{0,127}$'"
    " AND subject NOT IN ('me', 'reclaimer')"
    " AND subject NOT LIKE 'reclaimer@%'"
)
LEASE_BEFORE = "state <> 'AWAITING_APPROVAL' OR leased_by IS NULL OR leased_by <> prepared_by"
LEASE_AFTER = "state <> 'AWAITING_APPROVAL' OR leased_by IS NULL OR lower(leased_by) <> lower(prepared_by)"
FOUR_EYES_BEFORE = "approved_by IS NULL OR (approved_by <> resolved_by AND approved_at IS NOT NULL)"
FOUR_EYES_AFTER = (
    "approved_by IS NULL OR (lower(approved_by) <> lower(resolved_by) AND approved_at IS NOT NULL)"
)

# Identities are what tokens name: two spellings of one folded subject are the owners of two
# tokens who would become one. (The item columns hold what those tokens wrote.)
_COLLISIONS = sa.text(
    "SELECT lower(subject) AS folded, array_agg(DISTINCT subject) AS spellings FROM api_token"
    " GROUP BY lower(subject) HAVING count(DISTINCT subject) > 1 ORDER BY 1"
)
_SOD_CHECKS = (
    ("ck_review_queue_item_approval_lease_not_preparer", LEASE_BEFORE, LEASE_AFTER),
    ("ck_review_queue_item_four_eyes", FOUR_EYES_BEFORE, FOUR_EYES_AFTER),
)


def _add_check(table: str, name: str, condition: str) -> list[str]:
    """Add a CHECK, validated where no row breaks it, else NOT VALID (it holds for new and changed
    rows): the ids of the rows that break it."""
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    ids = list(
        op.get_bind().execute(sa.text(f"SELECT id::text FROM {table} WHERE NOT ({condition})")).scalars()
    )
    if not ids:
        op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")
    return ids


def upgrade() -> None:
    collisions = op.get_bind().execute(_COLLISIONS).all()
    if collisions:
        listed = "; ".join(f"{', '.join(sorted(row.spellings))} -> {row.folded}" for row in collisions)
        raise MigrationRefused(
            "identities are now compared without letter case, and these token subjects would become"
            f" one identity: {listed}. The migration cannot tell whether they are one person or two."
            " If one person: fold the subject yourself (UPDATE api_token SET subject = lower(subject)"
            " WHERE lower(subject) = '<folded>'). If two people: give one of them another subject"
            " (UPDATE api_token SET subject = '<new>' WHERE subject = '<old>', and the same in"
            " review_queue_item's leased_by, resolved_by, prepared_by and approved_by). Then run the"
            " migration again; docs/security.md, Identities, says more."
        )
    # The SoD CHECKs come off while the items are folded (folding can make approved_by equal to
    # resolved_by: exactly what they are about) and go back on comparing folded values.
    for name, _, _ in _SOD_CHECKS:
        op.execute(f"ALTER TABLE review_queue_item DROP CONSTRAINT {name}")
    op.execute("ALTER TABLE api_token DROP CONSTRAINT ck_api_token_valid_subject")
    folded = op.get_bind().execute(
        sa.text("UPDATE api_token SET subject = lower(subject) WHERE subject <> lower(subject)")
    )
    if folded.rowcount:
        log.warning("folded the subject of %d api_token row(s) to lower case", folded.rowcount)
    for column in ITEM_IDENTITIES:
        op.execute(
            f"UPDATE review_queue_item SET {column} = lower({column}) WHERE {column} <> lower({column})"
        )
    bad = _add_check("api_token", "ck_api_token_valid_subject", SUBJECT_AFTER)
    if bad:
        log.warning(
            "api_token rows breaking ck_api_token_valid_subject (left as they are; revoke them): %s", bad
        )
    for name, _, after in _SOD_CHECKS:
        broken = _add_check("review_queue_item", name, after)
        if broken:
            log.warning(
                "items breaking %s once identities are folded (one person on both sides under two"
                " spellings; reopen them: POST /items/{id}/reopen): %s",
                name,
                broken,
            )


def downgrade() -> None:
    # Folded values satisfy the old CHECKs as they are.
    for name, before, _ in _SOD_CHECKS:
        op.execute(f"ALTER TABLE review_queue_item DROP CONSTRAINT {name}")
        _add_check("review_queue_item", name, before)
    op.execute("ALTER TABLE api_token DROP CONSTRAINT ck_api_token_valid_subject")
    _add_check("api_token", "ck_api_token_valid_subject", SUBJECT_BEFORE)
