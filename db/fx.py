"""Exchange rates into the base currency: set (appended, never overwritten) and read."""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import bindparam, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.ext.asyncio import AsyncConnection

from db.tables import fx_rate


@dataclass(frozen=True, slots=True)
class Rate:
    currency: str
    rate: Decimal
    set_by: str
    set_at: datetime


_COLUMNS = (fx_rate.c.currency, fx_rate.c.rate, fx_rate.c.set_by, fx_rate.c.set_at)
# The newest rate of each currency: DISTINCT ON over the (currency, set_at, id) index.
_LATEST = (
    select(*_COLUMNS)
    .ext(distinct_on(fx_rate.c.currency))
    .order_by(fx_rate.c.currency, fx_rate.c.set_at.desc(), fx_rate.c.id.desc())
)
_HISTORY = (
    select(*_COLUMNS)
    .where(fx_rate.c.currency == bindparam("currency"))
    .order_by(fx_rate.c.set_at.desc(), fx_rate.c.id.desc())
    .limit(bindparam("limit"))
)


async def set_rate(conn: AsyncConnection, *, currency: str, rate: Decimal, actor: str) -> Rate:
    """A new rate for the currency from now on; the earlier ones stay, as history."""
    statement = fx_rate.insert().values(currency=currency, rate=rate, set_by=actor).returning(*_COLUMNS)
    return Rate(*(await conn.execute(statement)).one())


async def latest_rates(conn: AsyncConnection) -> list[Rate]:
    return [Rate(*row) for row in await conn.execute(_LATEST)]


async def rate_history(conn: AsyncConnection, *, currency: str, limit: int) -> list[Rate]:
    return [Rate(*row) for row in await conn.execute(_HISTORY, {"currency": currency, "limit": limit})]
