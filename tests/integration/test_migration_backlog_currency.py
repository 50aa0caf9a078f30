"""The backlog's split by currency (alembic/versions/2026_12_07_0110_backlog_by_currency.py), online:
writers go on appending to the trail while the partial index is built partition by partition, none
fails, and the index ends valid and attached on every month's partition, holding exactly the
revisions that changed a currency; the days kept before it lose nothing but their (unknown) split."""

from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.types.json import Jsonb

from alembic import command
from db.migrations import alembic_config
from tests.support.migrations import upgrade_while_writing

pytestmark = pytest.mark.fresh_db("migrates the event trail's indexes down and up by hand")

BEFORE = "7c1e5a9d3b60"  # the revision before the split
THIS = "7b2e4d9c1f30"  # the split; later revisions add indexes of their own
INDEX = "ix_review_queue_event_currency_revised"


def _item(sql: psycopg.Connection) -> UUID:
    item = uuid4()
    sql.execute(
        "INSERT INTO review_queue_item (id, idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash) VALUES (%s, %s, 'ACME', 1, 'PARTIAL', 'h')",
        (item, f"k-{item}"),
    )
    return item


def _revise(conn: psycopg.Connection, item: UUID, before: str | None, after: str | None) -> None:
    figures = [{"variance_amount": "1"} | ({"currency": c} if c else {}) for c in (before, after)]
    conn.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details)"
        " VALUES (%s, 'REVISED', 'ivan', 0, gen_random_uuid(), %s)",
        (item, Jsonb({"previous": figures[0], "current": figures[1], "previous_state": "PENDING"})),
    )


def test_the_index_is_built_while_writers_append_and_holds_the_currency_revisions_alone(
    owner_url: str, superuser_url: str, sql: psycopg.Connection
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    item = _item(sql)
    sql.execute(
        "INSERT INTO review_queue_backlog_day (day, at, by_age) VALUES ('2026-11-02', now(), '{1,0,0,0,0}')"
    )

    def write(conn: psycopg.Connection, n: int, k: int, upgraded: bool) -> bool:
        # Odd writes change the currency, even ones only the amount, and some come from before currencies.
        changed = k % 2 == 1
        _revise(conn, item, "EUR" if n % 2 else None, "USD" if changed else ("EUR" if n % 2 else None))
        return changed

    written, during = upgrade_while_writing(superuser_url, write, lambda: command.upgrade(config, THIS))
    assert all(n > 0 for n in during)
    partitions = sql.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'review_queue_event'::regclass"
    ).fetchone()
    attached = sql.execute(
        "SELECT count(*) FROM pg_inherits i JOIN pg_index p ON p.indexrelid = i.inhrelid"
        f" WHERE i.inhparent = '{INDEX}'::regclass AND p.indisvalid"
    ).fetchone()
    assert partitions == attached and partitions is not None and partitions[0] >= 1
    assert sql.execute(
        f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{INDEX}'::regclass"
    ).fetchone() == (True,)
    # The index (the planner made to use it) holds the currency changes, and the query finds them all.
    sql.execute("SET enable_seqscan = off")
    found = sql.execute(
        "SELECT count(*) FROM review_queue_event WHERE event = 'REVISED' AND"
        " (details -> 'previous' ->> 'currency') IS DISTINCT FROM (details -> 'current' ->> 'currency')"
        " AND at > '-infinity'"
    ).fetchone()
    plan = "\n".join(
        r[0]
        for r in sql.execute(
            "EXPLAIN SELECT count(*) FROM review_queue_event WHERE event = 'REVISED' AND"
            " (details -> 'previous' ->> 'currency') IS DISTINCT FROM (details -> 'current' ->> 'currency')"
            " AND at > '-infinity'"
        )
    )
    assert "currency_revised" in plan, plan
    assert found == (sum(changed for out in written for changed in out),)
    # The day kept before is kept, without a split (the reclaimer's next round keeps it again).
    assert sql.execute("SELECT by_age, by_currency FROM review_queue_backlog_day").fetchall() == [
        ([1, 0, 0, 0, 0], None)
    ]
    command.downgrade(config, BEFORE)
    command.upgrade(config, THIS)
