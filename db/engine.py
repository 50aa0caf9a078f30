"""Connections: which database, how the pool behaves, and what every transaction sets first."""

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg.errors import ReadOnlySqlTransaction
from psycopg.pq import ExecStatus, PipelineStatus, TransactionStatus
from sqlalchemy import event, text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

from db import urls
from db.embedded import embedded_owner_url, embedded_url
from db.unit import Record, Reports, Step, Transaction


def _sqlalchemy(raw: str, liveness: Mapping[str, str] | None) -> str:
    # Read by db/urls.py, not by SQLAlchemy: its parser cannot read libpq's h1:p1,h2:p2 authority.
    target = urls.parse(raw)
    if liveness:
        # In the URL, so the engine, the LISTEN connection, Alembic and every psycopg.connect of the
        # commands get them alike; an option the URL sets itself wins.
        given = {key for key, _ in target.options}
        target = replace(
            target, options=(*target.options, *((k, v) for k, v in liveness.items() if k not in given))
        )
    return urls.sqlalchemy_url(target)


def database_url(configured: str | None, data_dir: Path, liveness: Mapping[str, str] | None = None) -> str:
    """What the service connects as: the configured URL when set, else the embedded server's
    application role; with `liveness` (Settings.db_liveness) among its options."""
    return _sqlalchemy(configured or embedded_url(data_dir), liveness)


def migration_url(
    migration: str | None, configured: str | None, data_dir: Path, liveness: Mapping[str, str] | None = None
) -> str:
    """What migrations run as: REVIEW_QUEUE_MIGRATION_DATABASE_URL, else DATABASE_URL (one role
    for both), else the embedded server's owner role."""
    return _sqlalchemy(migration or configured or embedded_owner_url(data_dir), liveness)


def libpq_url(url: str, database: str | None = None) -> str:
    """A SQLAlchemy URL as psycopg/libpq takes it directly (optionally for another database), every
    server of a multi-host URL kept."""
    target = urls.parse(url)
    return urls.libpq_url(target.with_database(database) if database else target)


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 5,
    pool_timeout_s: float = 1.0,
    connect_timeout_s: int = 2,
    prepare_threshold: int | None = 5,
) -> AsyncEngine:
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        # An exhausted pool must become a quick 503, never a queue of hung requests.
        pool_timeout=pool_timeout_s,
        pool_recycle=1800,
        connect_args={
            "connect_timeout": connect_timeout_s,
            # None turns psycopg's server-side prepared statements off (PgBouncer, transaction mode).
            "prepare_threshold": prepare_threshold,
            "application_name": "review-queue",
        },
    )
    event.listen(engine.sync_engine, "before_cursor_execute", _arm)
    event.listen(engine.sync_engine, "after_cursor_execute", _answered)
    return engine


def drop_pool(engine: AsyncEngine, pooled: PoolProxiedConnection) -> None:
    """Every pooled connection opened up to now is replaced at its next checkout: one found dead or
    on a read-only server (a failover) means its siblings went to the same old primary, and no
    request should wait on one of them for the TCP timeout. SQLAlchemy does the same on a
    disconnect it sees itself; this is for the failures it does not count as one."""
    engine.pool._invalidate(pooled, _checkin=False)


# Past the server's own statement_timeout, by this much: a live server has answered by then.
DEADLINE_MARGIN_S = 2.0


def _watchdog(raw: psycopg.AsyncConnection[Any], after_s: float) -> asyncio.TimerHandle:
    """Sever the connection if the server has not answered within `after_s`.

    A hung primary (a frozen machine, a SIGSTOPped postmaster) never sends its statement_timeout
    error, and its kernel may still acknowledge every packet, so neither keepalives nor
    tcp_user_timeout fire: the request, and its pooled connection, would wait forever. shutdown(2),
    not close: psycopg's wait on the socket wakes to an end of file, the connection is broken,
    and the caller sees the OperationalError of a lost connection (a 503; the pool is dropped)."""

    def sever() -> None:
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(raw.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)

    return asyncio.get_running_loop().call_later(after_s, sever)


# conn.info keys: the deadline of each statement of a `transaction` (seconds), and its armed watchdog.
_DEADLINE, _ARMED = "review_queue_deadline_s", "review_queue_watchdog"


def _arm(conn: Connection, *_: object) -> None:
    """Before each statement of a `transaction` (BEGIN and COMMIT included): the watchdog that
    severs the connection if a hung server never answers. The deliverer, the reclaimer and every
    route but the lease and completion ones run here: without it, they waited on a frozen primary
    until it resumed (tests/system/test_frozen_server.py)."""
    deadline = conn.info.get(_DEADLINE)
    if deadline is not None:
        _disarm(conn.info)  # one left by a statement that failed
        raw: psycopg.AsyncConnection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        conn.info[_ARMED] = _watchdog(raw, deadline)


def _answered(conn: Connection, *_: object) -> None:
    _disarm(conn.info)


def _disarm(info: dict[Any, Any]) -> None:
    armed = info.pop(_ARMED, None)
    if armed is not None:
        armed.cancel()


def is_read_only(error: BaseException) -> bool:
    """The server refused a write because it is a standby or read-only (SQLSTATE 25006)."""
    driver = error.orig if isinstance(error, DBAPIError) else error
    return isinstance(driver, ReadOnlySqlTransaction)


async def writable(conn: AsyncConnection) -> bool:
    """Whether this connection's server takes writes: a primary, not a standby or a read-only one."""
    return bool(
        await conn.scalar(
            text("SELECT NOT (pg_is_in_recovery() OR current_setting('transaction_read_only')::bool)")
        )
    )


async def _begin(engine: AsyncEngine, opening: str, deadline_s: float) -> AsyncConnection:
    for attempt in range(2):
        conn = await engine.connect()
        # The pooled connection's own dict, kept: after a lost connection SQLAlchemy will not
        # hand out conn.info again until the transaction is rolled back.
        info = conn.info
        info[_DEADLINE] = deadline_s
        try:
            # Driver autocommit plus our own BEGIN: psycopg would otherwise send BEGIN in a round
            # trip of its own before the first statement. This way BEGIN and both SET LOCALs go in
            # one simple-protocol message, and a request costs three round trips instead of four
            # (profiled in `make bench`: on this machine each round trip is mostly syscall CPU).
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql(opening)
            return conn
        except DBAPIError as error:
            _unwatched(info)
            await conn.close()
            # A pooled connection that died with a database restart shows up here, on the first
            # statement, before anything was done: SQLAlchemy has invalidated the pool, so one
            # more try gets a fresh connection (pre-ping, paid only when it fails).
            if attempt or not error.connection_invalidated:
                raise
    raise AssertionError("unreachable")


def _unwatched(info: dict[Any, Any]) -> None:
    """The connection as it goes back to the pool: no deadline, no watchdog armed (a statement that
    failed, or a cancellation, would leave one to sever the connection's next user)."""
    info.pop(_DEADLINE, None)
    _disarm(info)


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, *, lock_timeout_ms: int, statement_timeout_ms: int
) -> AsyncIterator[AsyncConnection]:
    """One transaction with lock_timeout and statement_timeout set; commits unless an error escapes.

    SET LOCAL, never SET: the limits end with the transaction, so nothing leaks to the next user
    of a pooled or PgBouncer-shared server connection. The queue's functions run in a
    `unit_of_work` around it, which reports their changes after the COMMIT.
    """
    conn = await _begin(
        engine,
        f"BEGIN; SET LOCAL lock_timeout = {int(lock_timeout_ms)};"
        f" SET LOCAL statement_timeout = {int(statement_timeout_ms)}",
        statement_timeout_ms / 1000 + DEADLINE_MARGIN_S,
    )
    info = conn.info
    try:
        yield conn
        await conn.exec_driver_sql("COMMIT")
    except DBAPIError as error:
        if is_read_only(error):
            drop_pool(engine, await conn.get_raw_connection())
        raise
    finally:
        _unwatched(info)
        # Without a COMMIT the transaction is still open on the server; returning the connection
        # to the pool rolls it back (psycopg's rollback() asks the server, not the autocommit flag).
        await conn.close()  # rolls back whatever was not committed


@asynccontextmanager
async def unit_of_work(
    engine: AsyncEngine, *, lock_timeout_ms: int, statement_timeout_ms: int
) -> AsyncIterator[Transaction]:
    """A `transaction` as a unit of work (db/unit.py): the log lines and metrics of the changes
    made in it are emitted after its COMMIT, and never without it."""
    async with transaction(
        engine, lock_timeout_ms=lock_timeout_ms, statement_timeout_ms=statement_timeout_ms
    ) as conn:
        unit = Transaction(conn)
        yield unit
    unit.commit()  # only reached after the COMMIT


# Compiled for PostgreSQL's own $1, $2 placeholders: psycopg's raw cursor sends them as they are,
# where a %(name)s query is parsed again on every call (psycopg caches that parse only for short
# statements, and the completion statement is long).
_DIALECT = PGDialect_psycopg(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]
# For each $n of a compiled statement: the key it is given by, its compiled name (given instead,
# as construct_params allows), its value when neither is given (already through its bind
# processor; _REQUIRED when one must be given), and its bind processor.
_REQUIRED = object()
Plan = list[tuple[str, str, Any, Callable[[Any], Any] | None]]
_COMPILED: dict[int, tuple[ClauseElement, str, SQLCompiler, Plan | None]] = {}


def _compiled(statement: ClauseElement) -> tuple[str, SQLCompiler, Plan | None]:
    """The statement compiled once per process (it is a module-level Core expression)."""
    cached = _COMPILED.get(id(statement))
    if cached is None or cached[0] is not statement:
        compiled = statement.compile(dialect=_DIALECT)
        assert isinstance(compiled, SQLCompiler)
        cached = _COMPILED[id(statement)] = (statement, str(compiled), compiled, _plan(compiled))
    return cached[1], cached[2], cached[3]


def _plan(compiled: SQLCompiler) -> Plan | None:
    """What `construct_params` would do for each parameter, decided once: it re-derives all of it on
    every call (3.5 % of a completion, docs/performance.md). None for a statement it does not cover
    (expanding or late-evaluated parameters, escaped names): those go through construct_params."""
    if compiled.escaped_bind_names:
        return None
    plan: Plan = []
    for name in compiled.positiontup or ():
        bind = compiled.binds[name]
        # A key other than its name is an anonymous bind's: a literal value of the statement.
        renamed = bind.key != name and not bind.key.startswith("%(")
        if bind.expanding or bind.literal_execute or bind.callable is not None or renamed:
            return None
        found = compiled._bind_processors.get(name)
        process = found if callable(found) else None
        default = _REQUIRED
        if not bind.required:
            default = process(bind.effective_value) if process else bind.effective_value
        plan.append((bind.key, name, default, process))
    return plan


def _arguments(compiled: SQLCompiler, plan: Plan | None, parameters: dict[str, Any]) -> list[Any]:
    if plan is None:
        values = compiled.construct_params(parameters) or {}
        processors = compiled._bind_processors
        return [
            process(values[name]) if callable(process := processors.get(name)) else values[name]
            for name in compiled.positiontup or ()
        ]
    arguments = []
    for key, name, default, processor in plan:
        if key in parameters or name in parameters:
            value = parameters[key] if key in parameters else parameters[name]
            arguments.append(processor(value) if processor else value)
        elif default is _REQUIRED:
            raise KeyError(f"the statement needs a value for {key!r}")
        else:
            arguments.append(default)
    return arguments


class OneRoundTrip(Reports):
    """A transaction of a few statements, sent with its limits in ONE round trip, without BEGIN or
    COMMIT: a pipeline (psycopg pipeline mode, on the raw driver connection of a pooled connection)
    whose messages up to its Sync are one implicit transaction in PostgreSQL's extended protocol.
    The limits go first, as `set_config(..., is_local => true)`, the SET LOCAL of an expression: they
    hold for the statements after them and end with the transaction. If a statement fails,
    PostgreSQL skips the rest and rolls the whole transaction back at the Sync.

    A statement marked `.execution_options(generic_plan=True)` runs with plan_cache_mode
    force_generic_plan: once psycopg has prepared it (REVIEW_QUEUE_PREPARE_THRESHOLD), PostgreSQL
    plans it once per connection instead of on every call (the completion statement: about 0.5 ms
    of planning per call otherwise; docs/performance.md). Mark only statements whose plan does not
    depend on their values (tests/integration/db/test_query_plans.py checks the completion's). Unprepared
    statements (REVIEW_QUEUE_PREPARE_THRESHOLD=0, for PgBouncer) are planned on every call anyway.

    The statements are SQLAlchemy Core expressions, compiled once; only their execution bypasses
    SQLAlchemy's async adapter. A connection found dead (a database restart) is replaced once, so
    use it only for steps that are safe to repeat: a completion (a repeat answers already_resolved),
    a renewal, a lease (at worst, items leased on a connection that died after its commit wait for
    the reclaimer, as a crashed reviewer's do) or a release (at worst, a release that committed
    just before its connection died answers LEASE_NOT_HELD when repeated).

    A unit of work (db/unit.py): reports handed to `after_commit` run once the pipeline has
    committed, never when it failed.
    """

    def __init__(self, engine: AsyncEngine, *, lock_timeout_ms: int, statement_timeout_ms: int) -> None:
        super().__init__()
        self.engine = engine
        self.limits = [str(int(lock_timeout_ms)), str(int(statement_timeout_ms))]
        self.statement_timeout_ms = statement_timeout_ms
        self.used = False
        self.failed_step: int | None = None  # which of the steps raised, when one did

    async def execute(self, statement: ClauseElement, parameters: dict[str, Any]) -> list[Record]:
        """One statement in its own transaction: its rows."""
        return (await self.execute_all([(statement, parameters)]))[-1]

    async def execute_all(self, steps: list[Step]) -> list[list[Record]]:
        """The statements in order, in one transaction: the rows of each."""
        if self.used:
            raise RuntimeError("OneRoundTrip runs one transaction: open another for more")
        self.used = True
        queries = []
        generic = False
        for statement, parameters in steps:
            sql, compiled, plan = _compiled(statement)
            queries.append((sql, _arguments(compiled, plan, parameters)))
            generic = generic or (
                isinstance(statement, Executable)
                and bool(statement.get_execution_options().get("generic_plan"))
            )
        limits = [*self.limits, "force_generic_plan" if generic else "auto"]
        for attempt in range(2):
            # The pooled DBAPI connection itself, not an AsyncConnection around it: half the cost
            # of a checkout (docs/performance.md). Returning it runs the pool's reset on return,
            # which awaits the driver, so it goes through greenlet_spawn as SQLAlchemy's own does.
            pooled = await self.engine.raw_connection()
            raw: psycopg.AsyncConnection[Any] = pooled.driver_connection  # type: ignore[assignment]
            stale = False
            # Each statement may take statement_timeout on a live server; a hung one never answers.
            watchdog = _watchdog(raw, len(queries) * self.statement_timeout_ms / 1000 + DEADLINE_MARGIN_S)
            try:
                rows = await self._run(raw, limits, queries)
                self.commit()  # the pipeline's Sync committed it
                return rows
            except psycopg.OperationalError:
                stale = raw.broken
                if attempt or not stale:
                    raise
                # Dead before anything was done: one more try, on another connection.
            except ReadOnlySqlTransaction:
                # A standby, or a primary being demoted: the whole transaction was refused, so one
                # more try on a new connection, which target_session_attrs=read-write sends to the
                # new leader (when there is one yet).
                stale = True
                if attempt:
                    raise
            finally:
                watchdog.cancel()
                if stale:
                    drop_pool(self.engine, pooled)
                await _give_back(pooled, raw)
        raise AssertionError("unreachable")

    async def _run(
        self, raw: psycopg.AsyncConnection[Any], limits: list[str], queries: list[tuple[str, list[Any]]]
    ) -> list[list[Record]]:
        cursors = [psycopg.AsyncRawCursor(raw) for _ in queries]
        try:
            await raw.set_autocommit(True)  # no BEGIN: the pipeline is the transaction
            async with raw.pipeline():
                await raw.execute(_LIMITS, limits)
                for cursor, (sql, arguments) in zip(cursors, queries, strict=True):
                    await cursor.execute(sql, arguments)
            return [await _records(cursor) for cursor in cursors]
        except psycopg.Error as error:
            # psycopg keeps a result on each cursor whose statement ran; the first without one failed.
            ran = [c.pgresult is not None and c.pgresult.status != ExecStatus.FATAL_ERROR for c in cursors]
            self.failed_step = ran.index(False) if False in ran else None
            server = _server_error(error)
            if server is error:
                raise
            raise server from None
        finally:
            if not raw.broken:
                # After an error at the Sync (the implicit COMMIT) psycopg leaves the connection in
                # pipeline mode: these fail too, and it is closed instead of pooled (_give_back).
                with contextlib.suppress(psycopg.Error):
                    if raw.info.transaction_status != TransactionStatus.IDLE:
                        await raw.rollback()
                    await raw.set_autocommit(False)


def _server_error(error: BaseException) -> BaseException:
    """What the server said, when psycopg raised its own error while handling it. An error at the
    Sync, where the implicit transaction commits (a lock timeout on NOTIFY's queue lock, a deferred
    constraint), comes out of the pipeline as "cannot exit pipeline mode while busy", with the
    server's error as its context: that one says what happened (db.errors.classify)."""
    found: BaseException | None = error
    while found is not None:
        if isinstance(found, psycopg.Error) and found.sqlstate is not None:
            return found
        found = found.__context__
    return error


async def _give_back(pooled: PoolProxiedConnection, raw: psycopg.AsyncConnection[Any]) -> None:
    """Back to the pool only as it came out of it; a cancellation can land between any two of
    _run's steps and leave it otherwise, and such a connection is closed instead."""
    back = greenlet_spawn(pooled.close if _as_handed_out(raw) else pooled.invalidate)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        # Unwinding a cancellation, when another one is the most likely: see the return through.
        await _to_completion(back)
    else:
        # Inline: a task per request costs 5 % of a completion's instructions. A cancellation that
        # lands in it anyway makes SQLAlchemy discard the connection, never lose it.
        await back


def _as_handed_out(raw: psycopg.AsyncConnection[Any]) -> bool:
    return (
        not raw.broken
        and not raw.autocommit
        and raw.pgconn.pipeline_status == PipelineStatus.OFF
        and raw.info.transaction_status == TransactionStatus.IDLE
    )


async def _to_completion(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run `cleanup` to its end even if the caller is cancelled meanwhile (a server shutting down,
    a timeout around the request), then re-raise the cancellation: a connection abandoned halfway
    back to the pool is lost to it. SQLAlchemy closes its own connections the same way."""
    task = asyncio.ensure_future(cleanup)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as error:
            cancelled = error
    if cancelled is not None:
        raise cancelled
    task.result()


_LIMITS = (
    "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true),"
    " set_config('plan_cache_mode', %s, true)"
)


async def _records(cursor: psycopg.AsyncRawCursor[Any]) -> list[Record]:
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return []
    # The names straight from the result: psycopg's `description` builds a Column per field.
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [Record(zip(names, row, strict=True)) for row in await cursor.fetchall()]
