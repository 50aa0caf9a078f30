"""A unit of work: what every queue function (db/queue/) runs its statements in and hands the
reports of its changes to.

Two implement it: `db.engine.OneRoundTrip` (a few statements sent in one round trip, for the hot
routes) and `Transaction` (an open transaction on an AsyncConnection, from `db.engine.unit_of_work`).
Either way a queue function gets the same rows back (`Record`) and reports its log lines and
metrics (db/telemetry.py) through `after_commit`, which runs them once the unit has committed and
never when it rolls back: a "resolved" line never describes a change that did not happen.

Its own module, free of prometheus_client: the CLI must not create a metric before `serve` has
chosen multiprocess mode (tests/system/test_cli.py).
"""

from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ClauseElement

Report = Callable[[], None]
Step = tuple[ClauseElement, dict[str, Any]]


class Record(dict[str, Any]):
    """A result row, read like SQLAlchemy's: `row.name`, `row._mapping`."""

    __slots__ = ()

    @property
    def _mapping(self) -> dict[str, Any]:
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Unit(Protocol):
    # Which of the steps of the last `execute_all` raised, when one did.
    failed_step: int | None

    async def execute(self, statement: ClauseElement, parameters: dict[str, Any]) -> list[Record]:
        """One statement: its rows."""
        ...

    async def execute_all(self, steps: list[Step]) -> list[list[Record]]:
        """The statements in order: the rows of each."""
        ...

    def after_commit(self, report: Report) -> None:
        """Run `report` once the unit has committed; never if it does not."""
        ...


class Reports:
    """The reports of a unit, kept until it has committed."""

    def __init__(self) -> None:
        self.pending: list[Report] = []
        self.committed = False

    def after_commit(self, report: Report) -> None:
        if self.committed:
            report()
        else:
            self.pending.append(report)

    def commit(self) -> None:
        """The unit has committed: run what was kept, and from now on run reports at once."""
        self.committed = True
        pending, self.pending = self.pending, []
        for report in pending:
            report()


class Transaction(Reports):
    """A unit over a transaction open on `connection`, one round trip per statement. Whoever
    commits the transaction calls `commit()` after it (`db.engine.unit_of_work` does); the reports
    of a transaction that rolls back are dropped with this object."""

    def __init__(self, connection: AsyncConnection) -> None:
        super().__init__()
        self.connection = connection
        self.failed_step: int | None = None

    async def execute(self, statement: ClauseElement, parameters: dict[str, Any]) -> list[Record]:
        result = await self.connection.execute(statement, parameters)  # type: ignore[call-overload]
        if not result.returns_rows:
            return []
        names = list(result.keys())
        return [Record(zip(names, row, strict=True)) for row in result]

    async def execute_all(self, steps: list[Step]) -> list[list[Record]]:
        rows = []
        for number, (statement, parameters) in enumerate(steps):
            self.failed_step = number
            rows.append(await self.execute(statement, parameters))
        self.failed_step = None
        return rows
