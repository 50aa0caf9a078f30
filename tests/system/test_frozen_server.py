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
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from api.settings import Settings
from cli import reclaimer
from db.engine import DEADLINE_MARGIN_S, create_engine, transaction
from db.errors import classify
from tests.support import reclaimed_of, seed_expired
from tests.support.postgres import make_settings
from tests.support.relay import Relay
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


# The reclaim loop's steps (cli/reclaimer.py's _reclaim_round), and the RESOLVED rollup. Not the
# reports' closed days: their transactions may take minutes, so may their watchdog, and they run in
# a loop of their own (the next test).
Step = Callable[[AsyncEngine, Settings], Awaitable[object]]
RECLAIM_STEPS: dict[str, Step] = {
    "drain": lambda engine, settings: reclaimer.drain(engine, settings, actor="frozen-test"),
    "event months": reclaimer.add_event_months,
    "seal": reclaimer.seal,
    "leak check": reclaimer.warn_on_leak,
    "RESOLVED rollup": reclaimer.roll_up,
}


def test_every_step_of_the_reclaim_loop_gives_up_on_a_frozen_server(db_url: str) -> None:
    """Each step on a pooled connection to a server that froze: a lost connection within the
    deadline, so the loop backs off and reconnects (to the new primary, after a failover). The leak
    check once read outside a `transaction`, with no watchdog, and held the reclaimer on Patroni's
    frozen leader until it resumed (tests/system/test_failover.py, in CI)."""
    limit = STATEMENT_TIMEOUT_MS / 1000 + DEADLINE_MARGIN_S + 3

    async def gives_up(engine: AsyncEngine, step: Step) -> str:
        settings = make_settings(db_url, statement_timeout_ms=STATEMENT_TIMEOUT_MS, pg_lock_timeout_ms=100)
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit + 10):  # the test's own bound
                await step(engine, settings)
        except TimeoutError:
            return f"still waiting after {time.monotonic() - started:.1f} s"
        except DBAPIError as error:
            took = time.monotonic() - started
            return "" if classify(error) is not None and took <= limit else f"{error!r} after {took:.1f} s"
        return "answered by a frozen server"

    async def scenario() -> dict[str, str]:
        async with Relay(db_url) as relay:
            # An engine per step, as the loop's own: a pool of one connection, open when it froze.
            engines = [create_engine(relay.through(), pool_size=1, max_overflow=0) for _ in RECLAIM_STEPS]
            try:
                for engine in engines:
                    async with transaction(
                        engine, lock_timeout_ms=100, statement_timeout_ms=STATEMENT_TIMEOUT_MS
                    ) as conn:
                        await conn.execute(text("SELECT 1"))
                relay.freeze()
                found = await asyncio.gather(*map(gives_up, engines, RECLAIM_STEPS.values()))
            finally:
                relay.thaw()
                for engine in engines:
                    await engine.dispose()
        return {name: wrong for name, wrong in zip(RECLAIM_STEPS, found, strict=True) if wrong}

    assert asyncio.run(scenario()) == {}


def test_the_reclaim_loop_goes_on_while_the_reports_rollup_waits(
    db_url: str, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reports' closed days may wait on a frozen primary for minutes (their statement timeout):
    meanwhile expired leases still go back to the queue."""
    waiting = asyncio.Event()

    async def rollup_on_a_frozen_primary(*_: object) -> None:
        waiting.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(reclaimer, "roll_up_days", rollup_on_a_frozen_primary)

    async def scenario() -> int:
        stop = asyncio.Event()
        settings = make_settings(db_url, reclaim_interval_s=1)
        loops = asyncio.create_task(reclaimer.run_forever(settings, db_url, stop))
        try:
            async with asyncio.timeout(30):
                await waiting.wait()
            seed_expired(sql, 3, prefix="while-rolling-up-")
            for _ in range(300):
                if reclaimed_of(sql, "while-rolling-up-") == 3:
                    return 3
                await asyncio.sleep(0.1)
            return 0
        finally:
            stop.set()
            loops.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loops

    assert asyncio.run(scenario()) == 3, "reclaiming waited for the reports' rollup"
