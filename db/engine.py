"""Connections: which database, how the pool behaves, and what every transaction sets first."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from db import post_commit
from db.embedded import embedded_owner_url, embedded_url


def _sqlalchemy(raw: str) -> str:
    url = make_url(raw.replace("postgres://", "postgresql://", 1))
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def database_url(configured: str | None, data_dir: Path) -> str:
    """What the service connects as: the configured URL when set, else the embedded server's
    application role."""
    return _sqlalchemy(configured or embedded_url(data_dir))


def migration_url(migration: str | None, configured: str | None, data_dir: Path) -> str:
    """What migrations run as: REVIEW_QUEUE_MIGRATION_DATABASE_URL, else DATABASE_URL (one role
    for both), else the embedded server's owner role."""
    return _sqlalchemy(migration or configured or embedded_owner_url(data_dir))


def libpq_url(url: str, database: str | None = None) -> str:
    """A SQLAlchemy URL as psycopg/libpq takes it directly (optionally for another database)."""
    parsed = make_url(url).set(drivername="postgresql")
    if database:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 5,
    pool_timeout_s: float = 1.0,
    connect_timeout_s: int = 2,
    prepare_threshold: int | None = 5,
) -> AsyncEngine:
    return create_async_engine(
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


async def _begin(engine: AsyncEngine, opening: str) -> AsyncConnection:
    for attempt in range(2):
        conn = await engine.connect()
        try:
            # Driver autocommit plus our own BEGIN: psycopg would otherwise send BEGIN in a round
            # trip of its own before the first statement. This way BEGIN and both SET LOCALs go in
            # one simple-protocol message, and a request costs three round trips instead of four
            # (profiled in `make bench`: on this machine each round trip is mostly syscall CPU).
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql(opening)
            return conn
        except DBAPIError as error:
            await conn.close()
            # A pooled connection that died with a database restart shows up here, on the first
            # statement, before anything was done: SQLAlchemy has invalidated the pool, so one
            # more try gets a fresh connection (pre-ping, paid only when it fails).
            if attempt or not error.connection_invalidated:
                raise
    raise AssertionError("unreachable")


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, *, lock_timeout_ms: int, statement_timeout_ms: int
) -> AsyncIterator[AsyncConnection]:
    """One transaction with lock_timeout and statement_timeout set; commits unless an error escapes.

    SET LOCAL, never SET: the limits end with the transaction, so nothing leaks to the next user
    of a pooled or PgBouncer-shared server connection. The log lines and metrics of the changes
    made in it (db/telemetry.py, db/post_commit.py) are emitted after the COMMIT, and never without it.
    """
    conn = await _begin(
        engine,
        f"BEGIN; SET LOCAL lock_timeout = {int(lock_timeout_ms)};"
        f" SET LOCAL statement_timeout = {int(statement_timeout_ms)}",
    )
    pending, collecting = post_commit.collect()
    try:
        yield conn
        await conn.exec_driver_sql("COMMIT")
    finally:
        post_commit.stop_collecting(collecting)
        # Without a COMMIT the transaction is still open on the server; returning the connection
        # to the pool rolls it back (psycopg's rollback() asks the server, not the autocommit flag).
        await conn.close()  # rolls back whatever was not committed
    post_commit.emit(pending)  # only reached after the COMMIT


class Record(dict[str, Any]):
    """A result row of `OneRoundTrip.execute`, read like SQLAlchemy's: `row.name`, `row._mapping`."""

    __slots__ = ()

    @property
    def _mapping(self) -> dict[str, Any]:
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


_COMPILED: dict[int, tuple[ClauseElement, str, SQLCompiler]] = {}


def _compiled(engine: AsyncEngine, statement: ClauseElement) -> tuple[str, SQLCompiler]:
    """The statement compiled once per process (it is a module-level Core expression)."""
    cached = _COMPILED.get(id(statement))
    if cached is None or cached[0] is not statement:
        compiled = statement.compile(dialect=engine.dialect)
        assert isinstance(compiled, SQLCompiler)
        cached = _COMPILED[id(statement)] = (statement, str(compiled), compiled)
    return cached[1], cached[2]


class OneRoundTrip:
    """A transaction of ONE statement, sent with its BEGIN, its SET LOCAL limits and its COMMIT in
    one round trip (psycopg pipeline mode) on the raw driver connection of a pooled connection.

    The statement is a SQLAlchemy Core expression, compiled once; only its execution bypasses
    SQLAlchemy's async adapter. If the statement fails, PostgreSQL skips the rest of the pipeline
    (the COMMIT included) and the connection's return to the pool rolls the transaction back.
    A connection found dead (a database restart) is replaced once, so use it only for statements
    that are safe to repeat (completion: a repeat answers already_resolved).
    """

    def __init__(self, engine: AsyncEngine, *, lock_timeout_ms: int, statement_timeout_ms: int) -> None:
        self.engine = engine
        self.opening = (
            "BEGIN",
            f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}",
            f"SET LOCAL statement_timeout = {int(statement_timeout_ms)}",
        )
        self.used = False

    async def execute(self, statement: ClauseElement, parameters: dict[str, Any]) -> list[Record]:
        if self.used:
            raise RuntimeError("OneRoundTrip runs one statement: open another transaction for more")
        self.used = True
        sql, compiled = _compiled(self.engine, statement)
        params = dict(compiled.construct_params(parameters) or {})
        for name, process in compiled._bind_processors.items():
            if name in params and callable(process):
                params[name] = process(params[name])
        for attempt in range(2):
            async with self.engine.connect() as conn:
                raw: psycopg.AsyncConnection[Any] = (await conn.get_raw_connection()).driver_connection  # type: ignore[assignment]
                try:
                    return await self._run(raw, sql, params)
                except psycopg.OperationalError:
                    if attempt or not raw.broken:
                        raise
                    await conn.invalidate()  # dead before anything was done: one more try
        raise AssertionError("unreachable")

    async def _run(self, raw: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]) -> list[Record]:
        await raw.set_autocommit(True)  # our own BEGIN, inside the pipeline
        try:
            cursor = raw.cursor()
            async with raw.pipeline():
                for opening in self.opening:
                    await raw.execute(opening)
                await cursor.execute(sql, params)
                await raw.execute("COMMIT")
            names = [column.name for column in cursor.description or ()]
            return [Record(zip(names, row, strict=True)) for row in await cursor.fetchall()]
        finally:
            if not raw.broken:
                if raw.info.transaction_status != TransactionStatus.IDLE:
                    await raw.rollback()
                await raw.set_autocommit(False)
