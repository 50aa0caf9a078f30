"""db.engine.OneRoundTrip, the hot routes' transaction: its pipeline, sent without BEGIN or COMMIT,
is ONE transaction (a later failure undoes an earlier step), and its limits hold for its
statements and end with it."""

import asyncio
from collections.abc import AsyncIterator

import psycopg
import psycopg.waiting
import pytest
from psycopg.pq import PipelineStatus, TransactionStatus
from sqlalchemy import Integer, bindparam, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import OneRoundTrip, create_engine
from db.errors import classify
from db.tables import review_queue_item as item
from tests.support import seed_items

pytestmark = pytest.mark.anyio

LIMIT_MS = 300


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    # One pooled connection: every call below runs on the same server session.
    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout_s=10)
    yield engine
    await engine.dispose()


def one(engine: AsyncEngine) -> OneRoundTrip:
    return OneRoundTrip(engine, lock_timeout_ms=LIMIT_MS, statement_timeout_ms=LIMIT_MS)


async def test_a_failed_step_undoes_the_steps_before_it(engine: AsyncEngine, sql: psycopg.Connection) -> None:
    seed_items(sql, 1)
    trip = one(engine)
    touched = update(item).values(ledger_entity="CHANGED").returning(item.c.id)
    failing = select(1 / bindparam("zero", type_=Integer))  # division by zero, on the server
    with pytest.raises(psycopg.errors.DivisionByZero):
        await trip.execute_all([(touched, {}), (failing, {"zero": 0})])
    assert trip.failed_step == 1
    assert sql.execute("SELECT ledger_entity FROM review_queue_item").fetchall() == [("ACME-CORP",)]
    # And with no failure, the same step is committed when execute_all returns.
    (rows,) = await one(engine).execute_all([(touched, {})])
    assert len(rows) == 1
    assert sql.execute("SELECT ledger_entity FROM review_queue_item").fetchall() == [("CHANGED",)]


@pytest.mark.fresh_db("creates a constraint trigger that fails at commit")
async def test_an_error_at_its_commit_is_the_servers_and_the_pool_stays_usable(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    """A deferred trigger runs at the Sync, where the pipeline's implicit transaction commits; one
    that waits for a lock held elsewhere fails there with lock_timeout. psycopg then raises its own
    "cannot exit pipeline mode while busy"; the caller must see the server's error (a lock timeout,
    a 503 that says so) and the next transaction must get a working connection."""
    seed_items(sql, 1)
    sql.execute(
        "CREATE FUNCTION wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;"
        " CREATE CONSTRAINT TRIGGER at_commit AFTER UPDATE ON review_queue_item"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION wait_at_commit()"
    )
    touched = update(item).values(ledger_entity="CHANGED").returning(item.c.id)
    with psycopg.connect(sql.info.dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        with pytest.raises(psycopg.errors.LockNotAvailable) as raised:
            await one(engine).execute(touched, {})
        assert classify(raised.value) == "lock timeout: the table is locked by another session"
    assert sql.execute("SELECT ledger_entity FROM review_queue_item").fetchall() == [("ACME-CORP",)]
    (rows,) = await one(engine).execute_all([(touched, {})])  # the one pooled connection, replaced
    assert len(rows) == 1
    assert sql.execute("SELECT ledger_entity FROM review_queue_item").fetchall() == [("CHANGED",)]


async def test_its_limits_hold_inside_it_and_end_with_it(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 1)
    with pytest.raises(psycopg.errors.QueryCanceled):  # statement_timeout
        await one(engine).execute(select(func.pg_sleep(5)), {})
    with psycopg.connect(sql.info.dsn) as holder:  # a table lock held elsewhere (LOCK_CONTENTION)
        holder.execute("LOCK TABLE review_queue_item IN ACCESS EXCLUSIVE MODE")
        with pytest.raises((psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
            await one(engine).execute(update(item).values(attempts=1), {})
        holder.rollback()
    # The same server session, afterwards: nothing was left behind by set_config(..., true).
    async with engine.connect() as conn:
        settings = (
            await conn.execute(
                text(
                    "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),"
                    " current_setting('plan_cache_mode')"
                )
            )
        ).one()
    assert tuple(settings) == ("0", "0", "auto")


async def test_a_generic_plan_is_asked_for_only_by_a_statement_marked_so(engine: AsyncEngine) -> None:
    mode = select(func.current_setting("plan_cache_mode").label("mode"))
    assert (await one(engine).execute(mode, {}))[0].mode == "auto"
    marked = mode.execution_options(generic_plan=True)
    assert (await one(engine).execute(marked, {}))[0].mode == "force_generic_plan"


@pytest.mark.parametrize("cancels", [1, 2])
async def test_a_cancelled_transaction_returns_its_connection_to_the_pool(
    engine: AsyncEngine, sql: psycopg.Connection, cancels: int
) -> None:
    # A request can be cancelled (a server shutting down, a timeout around it) while its statement
    # runs, and again while its connection goes back to the pool. Either way the pool's one
    # connection must come back, idle, or every later request waits for a connection forever.
    seed_items(sql, 1)
    trip = asyncio.create_task(
        OneRoundTrip(engine, lock_timeout_ms=LIMIT_MS, statement_timeout_ms=10_000).execute_all(
            [(update(item).values(ledger_entity="CHANGED"), {}), (select(func.pg_sleep(5)), {})]
        )
    )

    def sleeping() -> bool:
        query = "SELECT 1 FROM pg_stat_activity WHERE query LIKE '%%pg_sleep%%' AND pid <> pg_backend_pid()"
        return bool(sql.execute(query).fetchall())

    while not sleeping():  # noqa: ASYNC110 - polling the server, not an in-process event
        await asyncio.sleep(0.01)
    for _ in range(cancels):
        trip.cancel()
        await asyncio.sleep(0)  # the second cancel lands while the first one is being handled
    with pytest.raises(asyncio.CancelledError):
        await trip
    pool = engine.sync_engine.pool
    assert pool.checkedout() == 0, pool.status()  # type: ignore[attr-defined]
    assert sql.execute("SELECT ledger_entity FROM review_queue_item").fetchall() == [("ACME-CORP",)]
    # The same connection, next: a transaction of its own, committed.
    (rows,) = await one(engine).execute_all(
        [(update(item).values(ledger_entity="LATER").returning(item.c.id), {})]
    )
    assert len(rows) == 1


async def test_a_cancellation_between_any_two_steps_leaves_the_pool_a_clean_connection(
    engine: AsyncEngine, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # psycopg yields to the event loop at a wait that needs no I/O when it thinks the loop has been
    # busy; make every wait such a point, so that this sweep cancels the transaction between any
    # two of its steps (turning autocommit on and off, the pipeline, the rollback, the return).
    monkeypatch.setattr(psycopg.waiting, "MAX_BUSY_TIME", -1.0)
    seed_items(sql, 1)
    counted = update(item).values(attempts=item.c.attempts + 1).returning(item.c.attempts)
    committed = 0
    for skips in range(500):
        trip = asyncio.create_task(one(engine).execute(counted, {}))
        for _ in range(skips):
            await asyncio.sleep(0)
        trip.cancel()
        try:
            await trip
        except asyncio.CancelledError:
            pass
        else:
            committed += 1
        # The pool's one connection, as the next request gets it: as it was first handed out.
        async with engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert isinstance(raw, psycopg.AsyncConnection)
            seen = (raw.autocommit, raw.info.transaction_status, raw.pgconn.pipeline_status)
            assert seen == (False, TransactionStatus.IDLE, PipelineStatus.OFF), f"cancelled after {skips}"
        if committed:
            break
    assert committed == 1, "no trip got through the sweep"
    (rows,) = await one(engine).execute_all([(select(item.c.attempts), {})])  # and the next one runs
    assert len(rows) == 1
