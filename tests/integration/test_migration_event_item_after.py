"""The item as it stood after each event (alembic/versions/2026_12_07_0100_event_item_after.py) on a
trail with history: no partition or index rewritten, old events kept as they were (no item_after),
the chain sealed before and after verifying as one; writers of the old release and the new going on
through the upgrade, none failing; and back down."""

from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from alembic import command
from db import audit
from db.migrations import alembic_config
from tests.support.api import item_body
from tests.support.audit import add_events, seal
from tests.support.migrations import upgrade_while_writing
from tests.support.postgres import libpq

pytestmark = pytest.mark.fresh_db("migrates the event trail down and up by hand")

BEFORE = "7c1d2e9f4a60"  # the revision before item_after
THIS = "7c1e5a9d3b60"  # item_after; later revisions add indexes of their own
# Every relation of the trail: the parent, each month's partition, and their indexes.
FILES = """
SELECT c.relname, c.relfilenode FROM pg_class c
WHERE c.oid IN (SELECT relid FROM pg_partition_tree('review_queue_event'))
   OR c.oid IN (SELECT indexrelid FROM pg_index
                WHERE indrelid IN (SELECT relid FROM pg_partition_tree('review_queue_event')))
"""
OLD_EVENT = (
    "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
    " SELECT id, 'RENEWED', 'old-release', 1, trace_id FROM review_queue_item ORDER BY created_at LIMIT 1"
)


def _trail(sql: psycopg.Connection) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT id, item_id, event, actor, at, lease_epoch, trace_id, details, xid FROM review_queue_event"
        " ORDER BY id"
    ).fetchall()


def _verified(db_url: str) -> int:
    with psycopg.connect(libpq(db_url)) as conn:
        result = audit.verify(conn)
    assert result.broken is None, result.broken
    return result.events


def test_the_upgrade_touches_the_catalogue_only_and_old_and_new_events_verify_as_one_chain(
    owner_url: str, db_url: str, sql: psycopg.Connection, client: TestClient, auth: Any
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    add_events(sql, 5)
    assert seal(db_url) == 5
    before, files = _trail(sql), dict(sql.execute(FILES).fetchall())
    assert len(files) > 2  # the parent, its partitions, their indexes
    command.upgrade(config, THIS)
    assert dict(sql.execute(FILES).fetchall()) == files, "a relation of the trail was rewritten"
    assert _trail(sql) == before
    assert sql.execute("SELECT count(*) FROM review_queue_event WHERE item_after IS NOT NULL").fetchone() == (
        0,
    )
    # The new release writes item_after with each event; the chain goes on over old and new alike.
    admin = auth("ada", "admin")
    assert client.post("/items", json=item_body(), headers=admin).status_code == 201
    (kept,) = sql.execute("SELECT item_after FROM review_queue_event WHERE event = 'ENQUEUED'").fetchone()  # type: ignore[misc]
    assert (kept[0], kept[1]) == ("PENDING", "12.50")  # state and amount, in AFTER_FIELDS order
    assert seal(db_url) == 1
    assert _verified(db_url) == 6
    command.downgrade(config, BEFORE)
    assert _trail(sql)[:5] == before and _verified(db_url) == 6
    command.upgrade(config, THIS)


def test_writers_of_both_releases_go_on_through_the_upgrade_and_none_fails(
    owner_url: str, superuser_url: str, db_url: str, sql: psycopg.Connection
) -> None:
    """Four writers append events without pause while the migration runs, two as the release before
    (no item_after), two as this one once the column is there: each waits out the one short lock,
    none fails or is lost, and the chain seals and verifies over all of them."""
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    add_events(sql, 1)

    def write(conn: psycopg.Connection, n: int, k: int, upgraded: bool) -> int:
        if n >= 2 and upgraded:
            row = conn.execute(
                "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, item_after)"
                " SELECT id, 'RENEWED', 'new-release', 1, trace_id, jsonb_build_array(state)"
                " FROM review_queue_item ORDER BY created_at LIMIT 1 RETURNING id"
            ).fetchone()
        else:
            row = conn.execute(OLD_EVENT + " RETURNING id").fetchone()
        assert row is not None
        return int(row[0])

    written, during = upgrade_while_writing(superuser_url, write, lambda: command.upgrade(config, THIS))
    assert all(n > 0 for n in during)
    ids = {i for ids in written for i in ids}
    stored = dict(sql.execute("SELECT id, item_after IS NOT NULL FROM review_queue_event").fetchall())
    assert ids <= set(stored) and len(stored) == len(ids) + 1
    assert any(stored[i] for i in ids) and not all(stored[i] for i in ids)
    seal(db_url)
    assert _verified(db_url) == len(stored)
