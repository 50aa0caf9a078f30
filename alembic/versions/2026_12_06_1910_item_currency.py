"""Money in its currency (issue 40): every item carries an ISO 4217 code, and the amount column holds
up to three decimals (KWD, BHD, OMR ...) without rounding anyone.

Online on a large table; each step either touches the catalogue only or lets writers go on:
1. under one short ACCESS EXCLUSIVE lock (lock_timeout 5 s: a busy moment fails the migration,
   nothing changed, and it is run again), catalogue changes only:
   - `currency text NOT NULL DEFAULT '<base>'`: a constant default is kept in the catalogue and read
     for every existing row (PostgreSQL 11+), so no row is rewritten and every existing item takes
     the base currency, REVIEW_QUEUE_BASE_CURRENCY (USD unless set) when this runs. The default stays:
     an API process of the previous release, still serving during a rolling upgrade, inserts without
     a currency, and its items are in the base currency as its clients meant;
   - `variance_amount` from NUMERIC(18,2) to unconstrained NUMERIC: no rewrite (NUMERIC(19,3) would
     rewrite the table and rebuild its 23 indexes under the lock: a change of scale always does;
     tests/integration/test_migration_currency.py checks both). The bounds move to CHECKs: at most 16 integer
     digits and 3 decimals (ck_review_queue_item_amount_bounds), and a three-letter code
     (ck_review_queue_item_currency_code), both added NOT VALID (no scan under the lock);
   - the one index on the column, ix_review_queue_item_resolved_abs_amount (an expression, which the
     type change would rebuild under the lock), is dropped here and built again in step 3;
2. VALIDATE CONSTRAINT, each in its own transaction: a scan under SHARE UPDATE EXCLUSIVE, which
   leaves reads and writes alone;
3. CREATE INDEX CONCURRENTLY of the amount index (GET /items?min_amount= on the resolved history
   reads the list order meanwhile: slower, still right).

Steps 2 and 3 run outside the migration's transaction (Alembic's autocommit block), so whatever
earlier migrations of the same `upgrade` did is committed by then. Should step 3 fail (a rare
deadlock), the invalid index is left: drop it and run the migration again, which skips steps done.

Revision ID: 4e7b1c9a2d55
Revises: 3c7d52a9e14b
Create Date: 2026-12-06 18:40:00+00:00
"""

import os
from collections.abc import Sequence

from iso4217 import Currency

from alembic import op
from db.migrations import MigrationRefused

revision: str = "4e7b1c9a2d55"
down_revision: str | None = "3c7d52a9e14b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AMOUNT_BOUNDS = "variance_amount = round(variance_amount, 3) AND abs(variance_amount) < 1e16"
CURRENCY_CODE = "currency ~ '^[A-Z]{3}$'"
ABS_AMOUNT_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_review_queue_item_resolved_abs_amount"
    " ON review_queue_item (abs(variance_amount)) WHERE state = 'RESOLVED'"
)


def _base_currency() -> str:
    # The same setting the service reads (api/settings.py); read here without the API's settings so
    # that a migration needs nothing else to be configured.
    code = os.environ.get("REVIEW_QUEUE_BASE_CURRENCY", "USD").strip().upper()
    try:
        Currency(code)
    except ValueError:
        raise MigrationRefused(
            f"REVIEW_QUEUE_BASE_CURRENCY={code!r} is not an ISO 4217 currency code; existing items take"
            " the base currency, so set it (e.g. EUR) before upgrading"
        ) from None
    return code


def upgrade() -> None:
    base = _base_currency()
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"ALTER TABLE review_queue_item ADD COLUMN IF NOT EXISTS currency text NOT NULL DEFAULT '{base}'"
    )
    op.execute("DROP INDEX IF EXISTS ix_review_queue_item_resolved_abs_amount")
    op.execute("ALTER TABLE review_queue_item ALTER COLUMN variance_amount TYPE numeric")
    for name, check in (("amount_bounds", AMOUNT_BOUNDS), ("currency_code", CURRENCY_CODE)):
        op.execute(
            f"ALTER TABLE review_queue_item DROP CONSTRAINT IF EXISTS ck_review_queue_item_{name},"
            f" ADD CONSTRAINT ck_review_queue_item_{name} CHECK ({check}) NOT VALID"
        )
    with op.get_context().autocommit_block():
        for name in ("amount_bounds", "currency_code"):
            op.execute(f"ALTER TABLE review_queue_item VALIDATE CONSTRAINT ck_review_queue_item_{name}")
        op.execute(ABS_AMOUNT_INDEX)


def downgrade() -> None:
    base = _base_currency()
    bind = op.get_bind()
    others = bind.exec_driver_sql(
        "SELECT count(*) FROM review_queue_item"
        f" WHERE currency <> '{base}' OR variance_amount <> round(variance_amount, 2)"
    ).scalar_one()
    if others:
        raise MigrationRefused(
            f"{others} item(s) are not in {base} or have a third decimal: NUMERIC(18,2) without a"
            " currency would misstate them. Nothing was changed."
        )
    op.execute("DROP INDEX IF EXISTS ix_review_queue_item_resolved_abs_amount")
    op.execute("ALTER TABLE review_queue_item DROP CONSTRAINT IF EXISTS ck_review_queue_item_amount_bounds")
    op.execute("ALTER TABLE review_queue_item DROP CONSTRAINT IF EXISTS ck_review_queue_item_currency_code")
    op.execute("ALTER TABLE review_queue_item ALTER COLUMN variance_amount TYPE numeric(18, 2)")
    op.execute("ALTER TABLE review_queue_item DROP COLUMN currency")
    op.execute(ABS_AMOUNT_INDEX.replace(" CONCURRENTLY", ""))
