"""Currencies on items (alembic/versions/2026_12_06_1910_item_currency.py), on a table with items:
no row rewritten and no index rebuilt under the lock but the one on the amount, every existing item
in the base currency with its amount as it was, the CHECKs validated, writers of the old release and
the new going on throughout; and back down while nothing would be misstated."""

from decimal import Decimal

import psycopg
import pytest

from alembic import command
from db.migrations import MigrationRefused, alembic_config
from tests.support.migrations import upgrade_while_writing

pytestmark = pytest.mark.fresh_db("migrates the items table down and up by hand")

BEFORE = "3c7d52a9e14b"  # the revision before currencies
CURRENCY = "4e7b1c9a2d55"  # the one that adds them (later revisions may add indexes of their own)
FILES = (
    "SELECT c.relname, c.relfilenode FROM pg_class c WHERE c.oid = 'review_queue_item'::regclass"
    " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'review_queue_item'::regclass)"
)
ABS_INDEX = "ix_review_queue_item_resolved_abs_amount"
# As a writer of the release before currencies inserts: no currency column named.
OLD_INSERT = (
    "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
    " source_hash, state, resolution, resolved_by, resolved_at)"
    " VALUES (%s, 'ACME', %s, 'PARTIAL', 'h', 'RESOLVED', 'APPROVED', 'bob', now())"
)


def _items(sql: psycopg.Connection) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT idempotency_key, variance_amount::text, currency FROM review_queue_item ORDER BY 1"
    ).fetchall()


def _seed(sql: psycopg.Connection, n: int) -> None:
    for k in range(n):
        sql.execute(OLD_INSERT, (f"old-{k:04d}", Decimal(f"{k * 37 - 500}.{k % 100:02d}")))


def test_the_upgrade_touches_the_catalogue_only_and_existing_items_take_the_base_currency(
    owner_url: str, sql: psycopg.Connection
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    _seed(sql, 50)
    before_amounts = sql.execute(
        "SELECT idempotency_key, variance_amount::text FROM review_queue_item ORDER BY 1"
    ).fetchall()
    files = dict(sql.execute(FILES).fetchall())
    command.upgrade(config, CURRENCY)
    after = dict(sql.execute(FILES).fetchall())
    # The table and every index but the amount's (dropped, then built CONCURRENTLY) are the same files.
    changed = {name for name in after if after[name] != files.get(name)}
    assert changed == {ABS_INDEX}, changed
    assert sql.execute(
        f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{ABS_INDEX}'::regclass"
    ).fetchone() == (True,)
    assert _items(sql) == [(k, a, "USD") for k, a in before_amounts]
    assert sql.execute(
        "SELECT conname, convalidated FROM pg_constraint WHERE conname IN"
        " ('ck_review_queue_item_amount_bounds', 'ck_review_queue_item_currency_code') ORDER BY 1"
    ).fetchall() == [
        ("ck_review_queue_item_amount_bounds", True),
        ("ck_review_queue_item_currency_code", True),
    ]
    # The path not taken: a typmod with another scale rewrites the table and rebuilds every index.
    sql.execute("ALTER TABLE review_queue_item ALTER COLUMN variance_amount TYPE numeric(19, 3)")
    rewritten = dict(sql.execute(FILES).fetchall())
    assert all(rewritten[name] != after[name] for name in after), "NUMERIC(19,3) should rewrite"


def test_existing_items_take_the_configured_base_currency(
    owner_url: str, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    _seed(sql, 3)
    monkeypatch.setenv("REVIEW_QUEUE_BASE_CURRENCY", "EUR")
    command.upgrade(config, "head")
    assert {c for _, _, c in _items(sql)} == {"EUR"}
    # An old release's insert during the rolling upgrade gets the base currency too.
    sql.execute(OLD_INSERT, ("after", Decimal("1.50")))
    assert _items(sql)[0] == ("after", "1.50", "EUR")


def test_a_base_currency_not_on_the_iso_list_stops_the_upgrade(
    owner_url: str, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    monkeypatch.setenv("REVIEW_QUEUE_BASE_CURRENCY", "EURO")
    with pytest.raises(MigrationRefused, match="not an ISO 4217 currency code"):
        command.upgrade(config, "head")
    monkeypatch.delenv("REVIEW_QUEUE_BASE_CURRENCY")
    command.upgrade(config, "head")


def test_the_downgrade_refuses_while_an_item_would_be_misstated(
    owner_url: str, sql: psycopg.Connection
) -> None:
    config = alembic_config(owner_url)
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, currency,"
        " match_decision, source_hash) VALUES ('kwd', 'ACME', 1.234, 'KWD', 'PARTIAL', 'h')"
    )
    with pytest.raises(MigrationRefused, match="1 item"):
        command.downgrade(config, BEFORE)
    assert _items(sql) == [("kwd", "1.234", "KWD")]
    sql.execute("UPDATE review_queue_item SET variance_amount = 1.23, currency = 'USD'")
    command.downgrade(config, BEFORE)
    assert sql.execute("SELECT variance_amount::text FROM review_queue_item").fetchall() == [("1.23",)]
    command.upgrade(config, "head")
    assert _items(sql) == [("kwd", "1.23", "USD")]


def test_writers_of_both_releases_go_on_through_the_upgrade_and_none_fails(
    owner_url: str, superuser_url: str, sql: psycopg.Connection
) -> None:
    """Four writers insert items without pause while the migration runs, two as the release before
    (no currency), two as this one once the column is there: each waits out the one short lock, no
    insert fails or is lost, and the old release's items are in the base currency."""
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    _seed(sql, 20)

    def write(conn: psycopg.Connection, n: int, k: int, upgraded: bool) -> str:
        key = f"w{n}-{k}"
        if n >= 2 and upgraded:  # the new release names its currency
            conn.execute(
                "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount,"
                " currency, match_decision, source_hash)"
                " VALUES (%s, 'E', 1.234, 'KWD', 'PARTIAL', 'h')",
                (key,),
            )
        else:
            conn.execute(OLD_INSERT, (key, Decimal("-7.25")))
        return key

    written, during = upgrade_while_writing(superuser_url, write, lambda: command.upgrade(config, "head"))
    assert all(n > 0 for n in during)
    stored = {key: (amount, currency) for key, amount, currency in _items(sql)}
    keys = [k for keys in written for k in keys]
    assert set(keys) <= set(stored) and len(stored) == len(keys) + 20
    assert {stored[k] for k in keys} <= {("-7.25", "USD"), ("1.234", "KWD")}
    assert ("1.234", "KWD") in {stored[k] for k in keys}
