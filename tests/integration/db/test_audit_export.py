"""The export's pages (db.audit.export_start, export_page): each read in a transaction of its own,
together they are the chain as it stood when the export began, linked across page boundaries."""

import asyncio

import psycopg
import pytest

from db import audit, chain
from db.engine import create_engine, transaction
from tests.support.audit import add_events, seal


def export(
    db_url: str, *, first: int, last: int, limit: int, grow: psycopg.Connection | None = None
) -> bytes:
    """An export read page by page, each page in its own transaction; `grow` seals more events
    between the first page and the second."""

    async def run() -> bytes:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as conn:
                at: audit.ExportPosition | None = await audit.export_start(conn, first=first, last=last)
            pages = []
            while at is not None:
                async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as conn:
                    page, at = await audit.export_page(conn, at=at, limit=limit)
                pages.append(page)
                if grow is not None and len(pages) == 1:
                    await asyncio.to_thread(add_events, grow, 4)
                    await asyncio.to_thread(seal, db_url)
            return b"".join(pages)
        finally:
            await engine.dispose()

    return asyncio.run(run())


@pytest.mark.parametrize("limit", [1, 3, 10, 1000])
def test_pages_are_the_chain_as_it_stood_when_the_export_began(
    db_url: str, sql: psycopg.Connection, limit: int
) -> None:
    add_events(sql, 10)
    assert seal(db_url) == 10
    whole = export(db_url, first=1, last=2**63 - 1, limit=limit, grow=sql)
    result = chain.verify_lines(whole.splitlines(keepends=True))
    assert result.broken is None, result.broken
    assert (result.first_seq, result.last_seq, result.events) == (1, 10, 10)  # not the 4 sealed since
    assert sql.execute("SELECT max(seq) FROM review_queue_chain").fetchone() == (14,)
    # A range across pages links into its first line and verifies on its own, against the whole.
    part = export(db_url, first=4, last=9, limit=limit)
    assert part.splitlines(keepends=True) == whole.splitlines(keepends=True)[3:9]
    assert chain.verify_lines(part.splitlines(keepends=True)).broken is None


def test_a_range_beyond_the_head_is_empty(db_url: str, sql: psycopg.Connection) -> None:
    add_events(sql, 3)
    seal(db_url)
    assert export(db_url, first=4, last=2**63 - 1, limit=2) == b""
    assert export(db_url, first=1, last=2, limit=2).count(b"\n") == 2
