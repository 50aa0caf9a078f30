"""The open items' amount index (alembic/versions/2026_12_07_0510_open_abs_amount.py), online:
writers go on enqueueing while it is built, none fails, and it ends valid, holding every open item
(those enqueued during the build too) and no resolved one."""

import psycopg
import pytest

from alembic import command
from db.migrations import alembic_config
from tests.support.migrations import upgrade_while_writing

pytestmark = pytest.mark.fresh_db("migrates the item table's indexes down and up by hand")

BEFORE = "5a9c3e7b2d18"  # the revision before the index
THIS = "9d4f2a6c8e13"  # the index; later revisions may add their own
INDEX = "ix_review_queue_item_open_abs_amount"


def test_the_index_is_built_while_writers_enqueue_and_holds_the_open_items(
    owner_url: str, superuser_url: str, sql: psycopg.Connection
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    assert sql.execute("SELECT to_regclass(%s)", (INDEX,)).fetchone() == (None,)
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, state, leased_by, leased_at, resolution, resolved_by, resolved_at)"
        " VALUES ('done', 'ACME', -50000, 'PARTIAL', 'h', 'RESOLVED', 'r', now(), 'OK', 'r', now())"
    )

    def write(conn: psycopg.Connection, n: int, k: int, upgraded: bool) -> str:
        key = f"w{n}-{k}"
        conn.execute(
            "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
            " source_hash) VALUES (%s, 'ACME', %s, 'PARTIAL', 'h')",
            (key, -(n * 1000 + k) - 50000),
        )
        return key

    written, during = upgrade_while_writing(superuser_url, write, lambda: command.upgrade(config, THIS))
    assert all(n > 0 for n in during)
    assert sql.execute(
        "SELECT indisvalid, indisready FROM pg_index WHERE indexrelid = %s::regclass", (INDEX,)
    ).fetchone() == (True, True)
    # Read through the index alone (the planner made to), a bound finds every open item written.
    sql.execute("SET enable_seqscan = off")
    sql.execute("SET enable_bitmapscan = off")
    query = (
        "SELECT idempotency_key FROM review_queue_item"
        " WHERE state <> 'RESOLVED' AND abs(variance_amount) >= 50000"
    )
    plan = "\n".join(r[0] for r in sql.execute(f"EXPLAIN {query}"))
    assert INDEX in plan, plan
    found = {r[0] for r in sql.execute(query)}
    assert found == {key for out in written for key in out}, len(found)
    command.downgrade(config, BEFORE)
    assert sql.execute("SELECT to_regclass(%s)", (INDEX,)).fetchone() == (None,)
