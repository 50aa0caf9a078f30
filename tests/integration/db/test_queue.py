"""The queue statements on real PostgreSQL, with real concurrent connections."""

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from db import queue
from db.engine import create_engine
from db.unit import Transaction
from tests.support import LONG, backdate_lease, lock_waiters, seed_items, wait_for

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)
GRACE = timedelta(seconds=45)
CAP = 10_000


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, pool_size=60, max_overflow=0, pool_timeout_s=10)
    yield engine
    await engine.dispose()


async def lease(engine: AsyncEngine, reviewer: str, batch_size: int) -> list[queue.Item]:
    async with engine.begin() as conn:
        return await queue.lease_items(
            Transaction(conn), reviewer=reviewer, batch_size=batch_size, lease_duration=LEASE, cap=CAP
        )


# B's lock_timeout: a lease that waited for A's row locks instead of skipping them would fail
# with LockNotAvailable after this long (A stays open far longer), so "B did not wait" needs no clock.
NO_WAIT_MS = 1000


async def test_two_workers_never_double_lease(engine: AsyncEngine, sql: psycopg.Connection) -> None:
    """The seed's test, overlapped for real: A leases 20 of 40 rows and keeps its transaction (and
    its row locks) open while B leases. B must skip A's rows, not wait for them (its lock_timeout
    would fire), and get exactly the other 20; only then does A commit."""
    seed_items(sql, 40)
    async with engine.connect() as conn_a, engine.connect() as conn_b:
        tx_a = await conn_a.begin()
        batch_a = await queue.lease_items(
            Transaction(conn_a), reviewer="worker-a", batch_size=20, lease_duration=LEASE, cap=CAP
        )
        # A is still open: its 20 rows are locked and, to everybody else, still PENDING.
        pending = sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'PENDING'").fetchone()
        assert pending == (40,), pending
        async with conn_b.begin():
            await conn_b.exec_driver_sql(f"SET LOCAL lock_timeout = {NO_WAIT_MS}")
            batch_b = await queue.lease_items(
                Transaction(conn_b), reviewer="worker-b", batch_size=40, lease_duration=LEASE, cap=CAP
            )
        assert tx_a.is_active, "A must still be open while B leases"
        await tx_a.commit()
    ids_a, ids_b = {i.id for i in batch_a}, {i.id for i in batch_b}
    assert len(ids_a) == 20
    assert ids_a.isdisjoint(ids_b), f"DOUBLE_LEASE: {ids_a & ids_b}"
    assert len(ids_b) == 20, f"B must get exactly the 20 rows A did not lock, got {len(ids_b)}"
    holders = dict(
        sql.execute("SELECT leased_by, count(*) FROM review_queue_item GROUP BY leased_by").fetchall()
    )
    assert holders == {"worker-a": 20, "worker-b": 20}, holders


async def test_lease_is_oldest_first_and_stamps_the_holder(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 5)
    items = await lease(engine, "alice", 3)
    assert [i.idempotency_key for i in items] == ["idem-1", "idem-2", "idem-3"]
    for item in items:
        assert item.state == "ASSIGNED"
        assert item.leased_by == "alice"
        assert item.lease_expires_at is not None and item.leased_at is not None
        assert item.lease_expires_at - item.leased_at == LEASE
        assert item.variance_amount == Decimal("12.50") and isinstance(item.variance_amount, Decimal)


def _thread_worker(
    db_url: str,
    name: str,
    batch_size: int,
    leased: list[str],
    barrier: threading.Barrier,
    errors: list[BaseException],
) -> None:
    async def work() -> None:
        engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout_s=10)
        try:
            barrier.wait()
            while True:
                async with engine.begin() as conn:
                    batch = await queue.lease_items(
                        Transaction(conn), reviewer=name, batch_size=batch_size, lease_duration=LEASE, cap=CAP
                    )
                if not batch:
                    return
                for item in batch:
                    leased.append(str(item.id))
                    async with engine.begin() as conn:
                        outcome, _ = await queue.complete_item(
                            Transaction(conn),
                            item_id=item.id,
                            reviewer=name,
                            resolution="APPROVED",
                            note=None,
                        )
                    assert outcome == "resolved", outcome
        finally:
            await engine.dispose()

    try:
        asyncio.run(work())
    except BaseException as error:  # surfaced by the test, not lost in the thread
        errors.append(error)


@pytest.mark.parametrize("workers", [10, 30])
def test_concurrent_workers_lease_every_item_exactly_once(
    db_url: str, sql: psycopg.Connection, workers: int
) -> None:
    """N threads, each with its own connection, drain the queue: no id twice, none missing."""
    total = 3000 if LONG else 600
    seed_items(sql, total)
    leased: list[str] = []  # list.append is atomic under the GIL
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_thread_worker, args=(db_url, f"w{n}", 1 + n % 7, leased, barrier, errors))
        for n in range(workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, f"workers failed: {errors[:3]}"
    twice = [item_id for item_id, n in Counter(leased).items() if n > 1]
    assert not twice, f"DOUBLE_LEASE: {len(twice)} ids leased more than once, e.g. {twice[:5]}"
    assert len(leased) == total, f"{total - len(leased)} items never leased"
    states = dict(sql.execute("SELECT state, count(*) FROM review_queue_item GROUP BY state").fetchall())
    assert states == {"RESOLVED": total}


async def test_reclaim_returns_only_leases_past_the_grace(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 3)
    leased = await lease(engine, "alice", 3)
    stale, fresh_expired, live = leased
    backdate_lease(sql, stale.id, seconds=46)
    backdate_lease(sql, fresh_expired.id, seconds=44)
    async with engine.begin() as conn:
        reclaimed = await queue.reclaim_expired(
            Transaction(conn), reclaim_batch=100, grace=GRACE, actor="reclaimer"
        )
    assert [r.id for r in reclaimed] == [stale.id]
    row = sql.execute(
        "SELECT state, leased_by, leased_at, lease_expires_at FROM review_queue_item WHERE id = %s",
        (stale.id,),
    ).fetchone()
    assert row == ("PENDING", None, None, None)
    # Immediately re-leasable, and first in line again (it kept its created_at).
    again = await lease(engine, "bob", 1)
    assert [i.id for i in again] == [stale.id]
    assert {live.id, fresh_expired.id}.isdisjoint({i.id for i in again})


async def test_reclaim_is_oldest_expiry_first_and_bounded(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 5)
    leased = await lease(engine, "alice", 5)
    for age, item in zip([100, 300, 200, 500, 400], leased, strict=True):
        backdate_lease(sql, item.id, seconds=age)
    async with engine.begin() as conn:
        reclaimed = await queue.reclaim_expired(
            Transaction(conn), reclaim_batch=3, grace=GRACE, actor="reclaimer"
        )
    assert [r.id for r in reclaimed] == [leased[3].id, leased[4].id, leased[1].id]


async def test_reclaim_skips_a_row_locked_by_a_completion_in_flight(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 1)
    (item,) = await lease(engine, "alice", 1)
    backdate_lease(sql)
    async with engine.connect() as holder:
        tx = await holder.begin()
        outcome, _ = await queue.complete_item(
            Transaction(holder), item_id=item.id, reviewer="alice", resolution="APPROVED", note=None
        )
        assert outcome == "resolved"
        async with engine.begin() as conn:
            reclaimed = await asyncio.wait_for(
                queue.reclaim_expired(Transaction(conn), reclaim_batch=10, grace=GRACE, actor="reclaimer"), 5
            )
        assert reclaimed == [], "reclaim must skip the locked row, not wait for it"
        await tx.commit()
    assert sql.execute("SELECT state FROM review_queue_item").fetchone() == ("RESOLVED",)


async def test_a_completion_queued_behind_a_reclaim_in_flight_loses(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    """The other order of test_reclaim_skips_a_row_locked_by_a_completion_in_flight: the reclaim has
    taken the row and not committed yet when the holder's completion arrives. The completion must
    wait for the row lock (seen in pg_stat_activity), then find the lease gone and change nothing. A
    completion that checked the holder first and then updated by id would resolve the reclaimed item."""
    seed_items(sql, 1)
    (item,) = await lease(engine, "alice", 1)
    backdate_lease(sql)

    async def complete() -> tuple[str, queue.Item | None]:
        async with engine.begin() as conn:
            return await queue.complete_item(
                Transaction(conn), item_id=item.id, reviewer="alice", resolution="APPROVED", note=None
            )

    async with engine.connect() as reclaimer:
        tx = await reclaimer.begin()
        reclaimed = await queue.reclaim_expired(
            Transaction(reclaimer), reclaim_batch=10, grace=GRACE, actor="reclaimer"
        )
        assert [r.id for r in reclaimed] == [item.id]
        completion = asyncio.create_task(complete())
        deadline = asyncio.get_running_loop().time() + 30
        while not lock_waiters(sql):
            assert not completion.done(), f"the completion did not wait: {completion.result()}"
            assert asyncio.get_running_loop().time() < deadline, "the completion never reached the row lock"
            await asyncio.sleep(0.01)
        await tx.commit()
        outcome, current = await asyncio.wait_for(completion, 30)
    assert outcome == "lease_not_held", f"both won: the reclaim and the completion ({outcome})"
    assert current is not None and (current.state, current.leased_by) == ("PENDING", None)
    events = dict(sql.execute("SELECT event, count(*) FROM review_queue_event GROUP BY event").fetchall())
    assert events == {"LEASED": 1, "RECLAIMED": 1}, events  # seed_items writes no ENQUEUED


async def test_late_completion_after_reclaim_matches_nothing(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 1)
    (item,) = await lease(engine, "alice", 1)
    backdate_lease(sql)
    async with engine.begin() as conn:
        assert (
            len(
                await queue.reclaim_expired(
                    Transaction(conn), reclaim_batch=10, grace=GRACE, actor="reclaimer"
                )
            )
            == 1
        )
    (again,) = await lease(engine, "bob", 1)
    assert again.id == item.id
    async with engine.begin() as conn:
        outcome, current = await queue.complete_item(
            Transaction(conn), item_id=item.id, reviewer="alice", resolution="APPROVED", note=None
        )
    assert outcome == "lease_not_held"
    assert current is not None and current.leased_by == "bob" and current.state == "ASSIGNED"


def test_racing_reviewers_never_take_a_proposal_returned_to_its_preparer(
    db_url: str, sql: psycopg.Connection
) -> None:
    """Issue 42: 30 of 300 items (spread over the queue) are rejected proposals returned to alice.
    Eleven threads, each on its own connection, drain the queue at once: each item leased once,
    every returned one by alice, and alice's first lease is all returned items, whatever their
    deadlines. Alice joins once the others have leased 60 items: had she started with them, she
    could take all 30 before anyone else reached one, and a queue that handed them to anyone would
    pass (it did, once in the mutation check)."""
    seed_items(sql, 300)
    sql.execute(
        "UPDATE review_queue_item SET prepared_by = 'alice', proposed_resolution = 'OK',"
        " returned_until = now() + interval '1 hour' WHERE split_part(idempotency_key, '-', 2)::int % 10 = 7"
    )
    returned = {
        str(r[0]) for r in sql.execute("SELECT id FROM review_queue_item WHERE returned_until IS NOT NULL")
    }
    assert len(returned) == 30, len(returned)
    leased: list[str] = []
    by_alice: list[str] = []
    barrier = threading.Barrier(10)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_thread_worker, args=(db_url, f"w{n}", 1 + n % 7, leased, barrier, errors))
        for n in range(10)
    ]
    for t in threads:
        t.start()
    wait_for(lambda: len(leased) >= 60 or bool(errors), timeout=60)
    alice = threading.Thread(
        target=_thread_worker, args=(db_url, "alice", 5, by_alice, threading.Barrier(1), errors)
    )
    alice.start()
    threads.append(alice)
    for t in threads:
        t.join(timeout=120)
    assert not errors, f"workers failed: {errors[:3]}"
    everyone = leased + by_alice
    assert len(everyone) == len(set(everyone)) == 300, "an item leased twice or never"
    assert returned <= set(by_alice), f"taken from alice: {returned - set(by_alice)}"
    assert set(by_alice[:5]) <= returned, "alice's first lease is not her returned items"
