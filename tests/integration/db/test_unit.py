"""db/unit.py: both units of work (db.engine.OneRoundTrip, and the Transaction of
db.engine.unit_of_work) give the same rows for the same statements, say which step failed, and run
the reports handed to `after_commit` only after their COMMIT, never when they roll back."""

import ast
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Integer, bindparam, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import OneRoundTrip, create_engine, unit_of_work
from db.tables import review_queue_item as item
from db.unit import Record, Unit
from tests.support import seed_items

pytestmark = pytest.mark.anyio

KINDS = ["one_round_trip", "transaction"]
_TOUCH = update(item).values(ledger_entity="CHANGED").returning(item.c.id)
_FAIL = select(1 / bindparam("zero", type_=Integer))  # division by zero, on the server
_QUEUE = Path(__file__).resolve().parents[3] / "db" / "queue"


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout_s=10)
    yield engine
    await engine.dispose()


async def _in_unit(engine: AsyncEngine, kind: str, work: Callable[[Unit], Awaitable[None]]) -> None:
    limits = {"lock_timeout_ms": 1000, "statement_timeout_ms": 5000}
    if kind == "one_round_trip":
        await work(OneRoundTrip(engine, **limits))
        return
    async with unit_of_work(engine, **limits) as unit:
        await work(unit)


def _entities(sql: psycopg.Connection) -> list[str]:
    return [r[0] for r in sql.execute("SELECT ledger_entity FROM review_queue_item").fetchall()]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_report_runs_once_after_the_commit(
    engine: AsyncEngine, sql: psycopg.Connection, kind: str
) -> None:
    seed_items(sql, 1)
    seen: list[list[str]] = []  # what the database held when the report ran

    async def work(unit: Unit) -> None:
        unit.after_commit(lambda: seen.append(_entities(sql)))
        await unit.execute_all([(_TOUCH, {})])

    await _in_unit(engine, kind, work)
    assert seen == [["CHANGED"]], "the report ran before the change was committed, or not once"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_unit_that_rolls_back_reports_nothing(
    engine: AsyncEngine, sql: psycopg.Connection, kind: str
) -> None:
    seed_items(sql, 1)
    reported: list[str] = []

    async def work(unit: Unit) -> None:
        unit.after_commit(lambda: reported.append("reported"))
        await unit.execute_all([(_TOUCH, {}), (_FAIL, {"zero": 0})])

    with pytest.raises((DBAPIError, psycopg.Error)):
        await _in_unit(engine, kind, work)
    assert reported == []
    assert _entities(sql) == ["ACME-CORP"]


async def test_a_transaction_left_by_an_error_reports_nothing(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    """Its statements all succeeded, but the caller's error means no COMMIT: nothing is reported."""
    seed_items(sql, 1)
    reported: list[str] = []

    async def work(unit: Unit) -> None:
        unit.after_commit(lambda: reported.append("reported"))
        await unit.execute(_TOUCH, {})
        raise RuntimeError("the commit never happens")

    with pytest.raises(RuntimeError):
        await _in_unit(engine, "transaction", work)
    assert reported == []
    assert _entities(sql) == ["ACME-CORP"]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_failed_step_is_named(engine: AsyncEngine, sql: psycopg.Connection, kind: str) -> None:
    seed_items(sql, 1)
    units: list[Unit] = []

    async def work(unit: Unit) -> None:
        units.append(unit)
        await unit.execute_all([(_TOUCH, {}), (_FAIL, {"zero": 0}), (_TOUCH, {})])

    with pytest.raises((DBAPIError, psycopg.Error)):
        await _in_unit(engine, kind, work)
    assert units[0].failed_step == 1


async def test_both_units_give_the_same_rows(engine: AsyncEngine, sql: psycopg.Connection) -> None:
    seed_items(sql, 2)
    statement = select(item.c.id, item.c.variance_amount, item.c.created_at).order_by(item.c.id)
    got: dict[str, list[list[Record]]] = {}
    for kind in KINDS:

        async def work(unit: Unit, kind: str = kind) -> None:
            got[kind] = await unit.execute_all(
                [(statement, {}), (update(item).values(attempts=item.c.attempts), {})]
            )

        await _in_unit(engine, kind, work)
    rows, nothing = got["one_round_trip"]
    assert got["transaction"] == [rows, nothing]
    assert nothing == []
    assert len(rows) == 2
    assert all(type(r) is Record for kind in KINDS for r in got[kind][0])
    assert rows[0].variance_amount == rows[0]["variance_amount"] == rows[0]._mapping["variance_amount"]


def test_queue_functions_know_only_the_unit() -> None:
    """No queue function takes a connection or asks which unit it was given (one code path each)."""
    for path in sorted(_QUEUE.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & {"AsyncConnection", "OneRoundTrip", "Transaction"}, path.name
        assert not any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id == "isinstance"
            and any(isinstance(a, ast.Name) and a.id == "unit" for a in n.args)
            for n in ast.walk(tree)
        ), path.name
