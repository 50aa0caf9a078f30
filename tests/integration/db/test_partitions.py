"""The event trail by month: each event in its month's partition, the months created ahead by the
reclaimer as the service's role, and each new month as closed to that role as the trail itself."""

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy.dialects import postgresql

from cli import reclaimer
from db import partitions
from db.engine import create_engine
from db.queue.reads import _EVENTS
from tests.support import seed_items, utc_month
from tests.support.postgres import libpq, make_settings


def _name(month: datetime) -> str:
    return f"review_queue_event_{month:%Y_%m}"


def _partitions(sql: psycopg.Connection) -> set[str]:
    rows = sql.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'review_queue_event'::regclass"
    ).fetchall()
    return {r[0] for r in rows}


def _add_event(sql: psycopg.Connection, at: datetime, event: str = "LEASED", details: str = "{}") -> int:
    """As the owner, who alone may set `at`: the event at that moment, on the first item."""
    (event_id,) = sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, at, details)"
        " SELECT id, %s, 'alice', 1, trace_id, %s, %s::jsonb FROM review_queue_item"
        " ORDER BY created_at LIMIT 1 RETURNING id",
        (event, at, details),
    ).fetchone()  # type: ignore[misc]
    return int(event_id)


def _partition_of(sql: psycopg.Connection, event_id: int) -> str:
    (name,) = sql.execute(
        "SELECT tableoid::regclass::text FROM review_queue_event WHERE id = %s", (event_id,)
    ).fetchone()  # type: ignore[misc]
    return str(name)


def _keep_months(db_url: str, ahead: int) -> None:
    async def run() -> None:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            await reclaimer.add_event_months(engine, make_settings(db_url, event_months_ahead=ahead))
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_the_migration_leaves_the_history_in_one_partition_and_three_months_ahead(
    sql: psycopg.Connection,
) -> None:
    """The table as it was is the legacy partition, up to next month; then one per month."""
    (bound,) = sql.execute(
        "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'review_queue_event_legacy'"
    ).fetchone()  # type: ignore[misc]
    # The template database was migrated when the session began, this month or (at a month's
    # turn) last month: its legacy partition ends at the first of the month after.
    ends = [m for m in (utc_month(0), utc_month(1)) if f"TO ('{m:%Y-%m-%d} 00:00:00+00')" in bound]
    assert ends, bound
    months = {_name(utc_month(k)) for k in range(4) if utc_month(k) >= ends[0]} | {_name(ends[0])}
    assert months | {"review_queue_event_legacy"} <= _partitions(sql)


def test_an_event_goes_to_its_months_partition(sql: psycopg.Connection) -> None:
    seed_items(sql, 1)
    now = _add_event(sql, datetime.now(UTC))
    later = _add_event(sql, utc_month(2).replace(day=3, hour=12))
    assert _partition_of(sql, now) in {"review_queue_event_legacy", _name(utc_month(0))}
    assert _partition_of(sql, later) == _name(utc_month(2))
    # The parent's row triggers work in every partition: a reopening there is found by the reports,
    # and the append-only trigger refuses to change it.
    reopened = _add_event(
        sql, utc_month(3).replace(day=2), "REOPENED", '{"previous_resolved_at": "2026-01-01T00:00:00Z"}'
    )
    assert _partition_of(sql, reopened) == _name(utc_month(3))
    assert sql.execute("SELECT count(*) FROM review_queue_reopened_item").fetchone() == (1,)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        sql.execute("UPDATE review_queue_event SET actor = 'mallory' WHERE id = %s", (reopened,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        sql.execute(f"TRUNCATE {_name(utc_month(3))}")


def test_an_event_past_the_months_created_is_refused_whole(sql: psycopg.Connection) -> None:
    """Nothing is written to a default partition that a later month could not take back: the write
    fails, which is why the reclaimer keeps months ahead (and /metrics says how far)."""
    seed_items(sql, 1)
    (events,) = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()  # type: ignore[misc]
    with pytest.raises(psycopg.errors.CheckViolation, match="no partition"):
        _add_event(sql, utc_month(30))
    assert sql.execute("SELECT count(*) FROM review_queue_event").fetchone() == (events,)


@pytest.mark.fresh_db("creates partitions of the event trail")
def test_the_reclaimer_keeps_months_ahead_each_closed_to_the_service(
    db_url: str, sql: psycopg.Connection
) -> None:
    before = _partitions(sql)
    _keep_months(db_url, 6)
    made = _partitions(sql) - before
    assert made == {_name(utc_month(k)) for k in (4, 5, 6)}
    _keep_months(db_url, 6)  # nothing more to do
    assert _partitions(sql) - before == made
    newest = _name(utc_month(6))
    # Owned by the schema's owner, and granting nothing, whatever ALTER DEFAULT PRIVILEGES gives a
    # new table: the service writes through the parent, where the database sets id, at and xid.
    grantees = sql.execute(
        "SELECT DISTINCT a.grantee::regrole::text, c.relowner::regrole::text"
        " FROM pg_class c, aclexplode(c.relacl) AS a WHERE c.relname = %s",
        (newest,),
    ).fetchall()
    assert len(grantees) == 1 and grantees[0][0] == grantees[0][1], grantees
    seed_items(sql, 1)
    with psycopg.connect(libpq(db_url), autocommit=True) as service:
        for statement in (
            f"INSERT INTO {newest} (item_id, event, actor, at, lease_epoch, trace_id, xid)"
            f" SELECT id, 'LEASED', 'mallory', '{utc_month(6).isoformat()}', 1, trace_id, '1'"
            " FROM review_queue_item LIMIT 1",
            f"SELECT count(*) FROM {newest}",
            f"TRUNCATE {newest}",
            f"ALTER TABLE review_queue_event DETACH PARTITION {newest}",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                service.execute(statement)
        # Asked for more than two years ahead, the service gets two years.
        service.execute("SELECT review_queue_event_add_months(1000)")
    assert _name(utc_month(24)) in _partitions(sql)
    assert _name(utc_month(25)) not in _partitions(sql)
    asyncio.run(_covered_until_is(db_url, utc_month(25)))


async def _covered_until_is(db_url: str, until: datetime) -> None:
    engine = create_engine(db_url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:
            assert await partitions.covered_until(conn) == until
    finally:
        await engine.dispose()


@pytest.mark.fresh_db("creates partitions of the event trail")
def test_a_busy_moment_defers_the_months_to_the_next_round(
    db_url: str, superuser_url: str, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """The attach waits at most its lock_timeout (a held lock on the trail stands in for a long
    transaction), then gives up whole: no table left half made, and the round goes on."""
    before = _partitions(sql)
    with psycopg.connect(libpq(superuser_url)) as holder:
        holder.execute("LOCK TABLE review_queue_event IN SHARE MODE")
        with caplog.at_level(logging.WARNING, logger="review_queue.reclaimer"):
            _keep_months(db_url, 6)
        holder.rollback()
    assert [r.message for r in caplog.records] == ["event_months_deferred"]
    assert _partitions(sql) == before
    assert sql.execute(
        "SELECT count(*) FROM pg_class WHERE relname = %s", (_name(utc_month(6)),)
    ).fetchone() == (0,)
    _keep_months(db_url, 6)
    assert _name(utc_month(6)) in _partitions(sql)


@pytest.mark.fresh_db("creates partitions of the event trail")
def test_the_reclaimers_round_keeps_the_months(db_url: str, sql: psycopg.Connection) -> None:
    """The supervised loop, not only its step: its first round creates the months asked for."""

    async def first_round() -> None:
        stop = asyncio.Event()
        settings = make_settings(db_url, event_months_ahead=5, reclaim_interval_s=1)
        loop = asyncio.create_task(reclaimer.run_forever(settings, db_url, stop))
        deadline = asyncio.get_running_loop().time() + 30
        # The months are seen through another connection: there is no event to wait on.
        while _name(utc_month(5)) not in _partitions(sql) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        stop.set()
        await loop

    asyncio.run(first_round())
    assert _name(utc_month(5)) in _partitions(sql)


def _relations(sql: psycopg.Connection, statement: Any, params: dict[str, Any]) -> set[str]:
    compiled = statement.compile(dialect=postgresql.psycopg.dialect())
    row = sql.execute(f"EXPLAIN (FORMAT JSON) {compiled}", compiled.construct_params(params)).fetchone()
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            found.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])  # type: ignore[index]
    return found


def test_an_items_events_are_read_from_the_month_of_its_enqueue_on(sql: psycopg.Connection) -> None:
    """GET /items/{id}/events names the item's created_at as a lower bound of `at` (no event of an
    item precedes its enqueue): the months before it are neither planned nor probed."""
    seed_items(sql, 1)
    (item_id,) = sql.execute("SELECT id FROM review_queue_item").fetchone()  # type: ignore[misc]
    params = {"item_id": item_id, "after": 0, "limit": 51}
    later = _relations(sql, _EVENTS, {**params, "since": utc_month(2)})
    assert later == {_name(utc_month(2)), _name(utc_month(3))}, later
    now = _relations(sql, _EVENTS, {**params, "since": datetime.now(UTC)})
    assert now == {"review_queue_event_legacy", *(_name(utc_month(k)) for k in (1, 2, 3))}, now
