"""A hung server, not a dead one: PostgreSQL's postmaster and every backend stopped with SIGSTOP, so
nothing answers and nothing closes a connection (over a Unix socket, keepalives and
tcp_user_timeout cannot help either). A `transaction` (db/engine.py: the deliverer, the reclaimer,
and every route but the lease and completion ones, which have their own watchdog) must give up
within its statement_timeout + DEADLINE_MARGIN_S, and the engine must work again once the server
resumes. The same under Patroni, end to end: tests/system/test_failover.py's frozen leader."""

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from db.engine import DEADLINE_MARGIN_S, create_engine, transaction
from db.errors import classify
from tests.support.servers import OwnPostgres

STATEMENT_TIMEOUT_MS = 500


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnPostgres]:
    own = OwnPostgres(tmp_path)
    yield own
    _signal_all(own, signal.SIGCONT)
    own.stop()


def _server_pids(own: OwnPostgres) -> list[int]:
    postmaster = int((own.pgdata / "postmaster.pid").read_text().splitlines()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    return [postmaster, *map(int, children)]


def _signal_all(own: OwnPostgres, sig: signal.Signals) -> None:
    for pid in _server_pids(own):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_transaction_on_a_frozen_server_gives_up_within_its_deadline(server: OwnPostgres) -> None:
    async def scenario() -> tuple[float, BaseException | None, int]:
        engine = create_engine(server.url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            async with transaction(
                engine, lock_timeout_ms=100, statement_timeout_ms=STATEMENT_TIMEOUT_MS
            ) as conn:
                await conn.execute(text("SELECT 1"))  # the pool now holds a connection to the server
            _signal_all(server, signal.SIGSTOP)
            started, failed = time.monotonic(), None
            try:
                async with asyncio.timeout(30):  # the test's own bound: the bug hangs until SIGCONT
                    async with transaction(
                        engine, lock_timeout_ms=100, statement_timeout_ms=STATEMENT_TIMEOUT_MS
                    ) as conn:
                        await conn.execute(text("SELECT 1"))
            except (DBAPIError, TimeoutError) as error:
                failed = error
            took = time.monotonic() - started
            _signal_all(server, signal.SIGCONT)
            # Resumed: the severed connection is gone from the pool, and a new one works.
            async with transaction(
                engine, lock_timeout_ms=100, statement_timeout_ms=STATEMENT_TIMEOUT_MS
            ) as conn:
                after = int(await conn.scalar(text("SELECT 2")) or 0)
            return took, failed, after
        finally:
            await engine.dispose()

    took, failed, after = asyncio.run(scenario())
    assert not isinstance(failed, TimeoutError), (
        f"the transaction waited on the frozen server for {took:.1f} s"
    )
    assert isinstance(failed, DBAPIError), "a frozen server answered"
    # A lost connection, which the API answers 503 and the deliverer and reclaimer retry.
    assert classify(failed) is not None, failed
    assert took < STATEMENT_TIMEOUT_MS / 1000 + DEADLINE_MARGIN_S + 3, took
    assert after == 2
