"""The open items' amount indexes (alembic/versions/2026_12_07_0610_open_abs_amount.py), online:
writers go on enqueueing and leasing while they are built, none fails, and each ends valid, holding
every item of its part (those written during the build too) and no resolved one, and each
predicate carries the amount's guard that keeps the leases off it."""

import psycopg
import pytest

from alembic import command
from db.migrations import alembic_config
from tests.support.migrations import upgrade_while_writing

pytestmark = pytest.mark.fresh_db("migrates the item table's indexes down and up by hand")

BEFORE = "5a9c3e7b2d18"  # the revision before the indexes
THIS = "4e7b1c9a2d65"  # the indexes; later revisions may add their own
# Each index, and its part of the items.
PARTS = {
    "ix_review_queue_item_pending_abs_amount": "state = 'PENDING'",
    "ix_review_queue_item_open_abs_amount": "state NOT IN ('PENDING', 'RESOLVED')",
}


def test_the_indexes_are_built_while_writers_write_and_hold_their_parts(
    owner_url: str, superuser_url: str, sql: psycopg.Connection
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    for index in PARTS:
        assert sql.execute("SELECT to_regclass(%s)", (index,)).fetchone() == (None,)
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, state, leased_by, leased_at, resolution, resolved_by, resolved_at)"
        " VALUES ('done', 'ACME', -50000, 'PARTIAL', 'h', 'RESOLVED', 'r', now(), 'OK', 'r', now())"
    )

    def write(conn: psycopg.Connection, n: int, k: int, upgraded: bool) -> tuple[str, str]:
        # Every other item leased (ASSIGNED): both parts are written during the build.
        key, state = f"w{n}-{k}", ("PENDING", "ASSIGNED")[k % 2]
        conn.execute(
            "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
            " source_hash, state, leased_by, leased_at, lease_expires_at)"
            " VALUES (%s, 'ACME', %s, 'PARTIAL', 'h', %s, %s, now(), now() + interval '1 hour')",
            (key, -(n * 1000 + k) - 50000, state, None if state == "PENDING" else "r"),
        )
        return key, state

    written, during = upgrade_while_writing(superuser_url, write, lambda: command.upgrade(config, THIS))
    assert all(n > 0 for n in during)
    # Read through each index alone (the planner made to), a bound finds every item of its part.
    sql.execute("SET enable_seqscan = off")
    sql.execute("SET enable_bitmapscan = off")
    for index, part in PARTS.items():
        assert sql.execute(
            "SELECT indisvalid, indisready FROM pg_index WHERE indexrelid = %s::regclass", (index,)
        ).fetchone() == (True, True), index
        # Guarded by the amount: no statement that does not compare it can read the index.
        predicate = sql.execute(
            "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = %s::regclass", (index,)
        ).fetchone()
        assert predicate is not None and "abs(variance_amount) IS NOT NULL" in predicate[0], predicate
        query = (
            f"SELECT idempotency_key FROM review_queue_item WHERE {part} AND abs(variance_amount) >= 50000"
        )
        plan = "\n".join(r[0] for r in sql.execute(f"EXPLAIN {query}"))
        assert index in plan, plan
        state = "PENDING" if "=" in part else "ASSIGNED"
        expected = {key for out in written for key, s in out if s == state}
        assert {r[0] for r in sql.execute(query)} == expected, index
    command.downgrade(config, BEFORE)
    for index in PARTS:
        assert sql.execute("SELECT to_regclass(%s)", (index,)).fetchone() == (None,)
