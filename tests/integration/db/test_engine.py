"""db.engine.transaction: one transaction per request, its limits local to it."""

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db import queue
from db.engine import create_engine, transaction
from db.unit import Transaction
from tests.support import seed_items

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    # One pooled connection, so every transaction below reuses the same server session.
    engine = create_engine(db_url, pool_size=1, max_overflow=0)
    yield engine
    await engine.dispose()


def limits(engine: AsyncEngine) -> AbstractAsyncContextManager[AsyncConnection]:
    return transaction(engine, lock_timeout_ms=321, statement_timeout_ms=4321)


async def show(conn: AsyncConnection, name: str) -> str:
    return str((await conn.execute(text(f"SHOW {name}"))).scalar_one())


async def test_limits_hold_inside_and_end_with_the_transaction(engine: AsyncEngine) -> None:
    async with limits(engine) as conn:
        assert await show(conn, "lock_timeout") == "321ms"
        assert await show(conn, "statement_timeout") == "4321ms"
        # Inside BEGIN: two statements see one transaction start time.
        first = (await conn.execute(text("SELECT now()"))).scalar_one()
        second = (await conn.execute(text("SELECT now()"))).scalar_one()
        assert first == second
    # The same server session afterwards: the server defaults again (SET LOCAL, nothing leaked).
    async with engine.connect() as conn:
        assert await show(conn, "lock_timeout") == "0"
        assert await show(conn, "statement_timeout") == "0"


async def test_statements_share_one_transaction_and_commit_together(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 2)
    async with limits(engine) as conn:
        first = await conn.execute(text("SELECT txid_current()"))
        second = await conn.execute(text("SELECT txid_current()"))
        assert first.scalar_one() == second.scalar_one()
        await queue.lease_items(Transaction(conn), reviewer="ann", batch_size=2, lease_duration=LEASE, cap=10)
        # Not visible to anyone else before the commit.
        assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'ASSIGNED'").fetchone() == (
            0,
        )
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'ASSIGNED'").fetchone() == (2,)


async def test_an_error_rolls_everything_back_and_the_connection_is_clean(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 2)
    with pytest.raises(RuntimeError, match="boom"):  # noqa: PT012 - the error must escape the transaction
        async with limits(engine) as conn:
            await queue.lease_items(
                Transaction(conn), reviewer="ann", batch_size=2, lease_duration=LEASE, cap=10
            )
            raise RuntimeError("boom")
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'PENDING'").fetchone() == (2,)
    assert sql.execute("SELECT count(*) FROM review_queue_event WHERE event = 'LEASED'").fetchone() == (0,)
    async with limits(engine) as conn:
        # The pooled connection came back outside any transaction: this is a new one.
        leased = await queue.lease_items(
            Transaction(conn), reviewer="bob", batch_size=2, lease_duration=LEASE, cap=10
        )
    assert len(leased) == 2


async def test_a_failed_statement_aborts_only_its_own_transaction(engine: AsyncEngine) -> None:
    with pytest.raises(Exception, match="division by zero"):
        async with limits(engine) as conn:
            await conn.execute(text("SELECT 1 / 0"))
    async with limits(engine) as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
