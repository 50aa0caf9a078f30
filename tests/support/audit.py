"""The audit trail arranged for tests: events added one transaction each, and a seal."""

import asyncio

import psycopg

from cli import reclaimer
from tests.support import seed_items, wait_for
from tests.support.postgres import libpq, make_settings

# Transactions with an xid at or below this database's newest event, running in another database of
# the same server. pg_locks and pg_stat_activity's datname are readable by any role.
_HELD_BY_OTHERS = """
SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS x(xid)
JOIN pg_locks l ON l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.transactionid = xid(x.xid)
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE a.datname IS DISTINCT FROM current_database()
  AND x.xid <= (SELECT max(xid) FROM review_queue_event)
"""


def add_events(sql: psycopg.Connection, count: int, *, details: str = '{"n": 1}') -> None:
    """count events, each in its own committed transaction (autocommit), on seeded items."""
    if sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == (0,):
        seed_items(sql, 3)
    for _ in range(count):
        sql.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details)"
            " SELECT id, 'LEASED', 'alice', 1, trace_id, %s::jsonb FROM review_queue_item"
            " ORDER BY created_at LIMIT 1",
            (details,),
        )


def settle(db_url: str, timeout: float = 60) -> None:
    """Wait until no transaction of another database holds this database's events back.

    The sealer and the feed take an event only once every older transaction on the whole server has
    ended (pg_snapshot_xmin). Tests share servers (the mutation runs run three pytest processes on
    one; so does a TEST_DATABASE_URL), so another test's open transaction would change what a seal
    or a feed read finds here. A transaction open in this database is the test's own: not waited for.
    """
    with psycopg.connect(libpq(db_url), autocommit=True) as conn:
        wait_for(lambda: conn.execute(_HELD_BY_OTHERS).fetchone() == (0,), timeout, step=0.1)


def seal(db_url: str) -> int:
    """One sealer pass, once no other database's transaction holds the events back (see settle)."""
    settle(db_url)
    return asyncio.run(reclaimer.seal_once(make_settings(db_url), db_url))
