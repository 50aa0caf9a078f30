"""The catalogue-wide approval policy: materiality, the threshold every code is held to.

A completion needs an approver when abs(variance_amount) is at or above its code's approval
threshold or the materiality threshold, whichever is lower (`approval_threshold` below). The
completion statement (db/queue/completion.py) evaluates that expression itself, so a change committed by an
admin meanwhile is wholly before or after it, as a change of the code's own threshold is.
"""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from db.tables import approval_policy as policy

_MATERIALITY = select(policy.c.materiality_threshold).scalar_subquery()


def approval_threshold(code_threshold: ColumnElement[Any]) -> ColumnElement[Any]:
    """The amount from which a completion with the code needs an approver: the lower of the code's
    own threshold and materiality (LEAST ignores NULL: a code without one gets materiality)."""
    return func.least(code_threshold, _MATERIALITY)


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    materiality_threshold: Decimal
    updated_at: datetime
    updated_by: str | None


_COLUMNS = (policy.c.materiality_threshold, policy.c.updated_at, policy.c.updated_by)


async def get_policy(conn: AsyncConnection) -> ApprovalPolicy:
    return ApprovalPolicy(*(await conn.execute(select(*_COLUMNS))).one())


async def put_policy(conn: AsyncConnection, *, materiality_threshold: Decimal, actor: str) -> ApprovalPolicy:
    statement = (
        policy.update()
        .values(materiality_threshold=materiality_threshold, updated_at=func.now(), updated_by=actor)
        .returning(*_COLUMNS)
    )
    return ApprovalPolicy(*(await conn.execute(statement)).one())
