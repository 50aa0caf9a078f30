"""The audit trail arranged for tests: events added one transaction each, and a seal."""

import asyncio

import psycopg

from cli import reclaimer
from tests.support import seed_items
from tests.support.postgres import make_settings


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


def seal(db_url: str) -> int:
    return asyncio.run(reclaimer.seal_once(make_settings(db_url), db_url))
