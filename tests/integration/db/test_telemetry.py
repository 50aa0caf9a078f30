"""A log line (or a metric) that says something happened describes a committed change: inside
`db.engine.unit_of_work` the reports wait for the COMMIT, and a transaction that rolls back reports
nothing. Each maker-checker transition is checked both ways."""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from db import queue
from db.engine import create_engine, unit_of_work
from db.unit import Transaction, Unit
from tests.support import seed_items

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)
Change = Callable[[Unit], Awaitable[object]]


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, pool_size=2, max_overflow=0)
    yield engine
    await engine.dispose()


async def _in_transaction(engine: AsyncEngine, change: Change, *, commit: bool) -> None:
    async with unit_of_work(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as unit:
        await change(unit)
        if not commit:
            raise RuntimeError("the commit never happens")


def _lines(caplog: pytest.LogCaptureFixture, message: str) -> list[str]:
    return [r.__dict__["item_id"] for r in caplog.records if r.getMessage() == message]


async def _check_reported_after_commit_only(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture, message: str, change: Change, item_id: str
) -> None:
    caplog.clear()
    with pytest.raises(RuntimeError):
        await _in_transaction(engine, change, commit=False)
    assert _lines(caplog, message) == [], f"{message} logged for a change that was rolled back"

    async def change_then_look(unit: Unit) -> None:
        await change(unit)
        assert _lines(caplog, message) == [], f"{message} logged before the commit"

    await _in_transaction(engine, change_then_look, commit=True)
    assert _lines(caplog, message) == [item_id], f"{message} not logged exactly once after the commit"


async def _lease(engine: AsyncEngine, reviewer: str, queue_name: queue.Queue = "review") -> queue.Item:
    async with engine.begin() as conn:
        (leased,) = await queue.lease_items(
            Transaction(conn),
            reviewer=reviewer,
            batch_size=1,
            lease_duration=LEASE,
            cap=100,
            queue=queue_name,
        )
    return leased


async def _submitted(engine: AsyncEngine, sql: psycopg.Connection) -> queue.Item:
    """An item alice proposed (25,000.00 as ADJUSTMENT_POSTED): AWAITING_APPROVAL."""
    seed_items(sql, 1, amount="25000.00")
    leased = await _lease(engine, "alice")
    async with engine.begin() as conn:
        outcome, _ = await queue.complete_item(
            Transaction(conn),
            item_id=leased.id,
            reviewer="alice",
            resolution="ADJUSTMENT_POSTED",
            note="JE-1",
        )
    assert outcome == "submitted_for_approval"
    return leased


async def test_a_submission_is_reported_only_after_its_commit(
    engine: AsyncEngine, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reconciliation.review_queue.lease")
    seed_items(sql, 1, amount="25000.00")
    leased = await _lease(engine, "alice")

    async def submit(unit: Unit) -> None:
        outcome, _ = await queue.complete_item(
            unit, item_id=leased.id, reviewer="alice", resolution="ADJUSTMENT_POSTED", note="JE-1"
        )
        assert outcome == "submitted_for_approval"

    await _check_reported_after_commit_only(
        engine, caplog, "review_item_submitted_for_approval", submit, str(leased.id)
    )


async def test_an_approval_is_reported_only_after_its_commit(
    engine: AsyncEngine, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reconciliation.review_queue.lease")
    proposal = await _submitted(engine, sql)
    await _lease(engine, "bob", "approval")

    async def approve(unit: Unit) -> None:
        outcome, _ = await queue.approve_item(unit, item_id=proposal.id, approver="bob")
        assert outcome == "approved"

    await _check_reported_after_commit_only(engine, caplog, "review_item_approved", approve, str(proposal.id))


async def test_a_rejection_is_reported_only_after_its_commit(
    engine: AsyncEngine, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reconciliation.review_queue.lease")
    proposal = await _submitted(engine, sql)
    await _lease(engine, "bob", "approval")

    async def reject(unit: Unit) -> None:
        outcome, _ = await queue.reject_item(unit, item_id=proposal.id, approver="bob", reason="no")
        assert outcome == "rejected"

    await _check_reported_after_commit_only(engine, caplog, "review_item_rejected", reject, str(proposal.id))
