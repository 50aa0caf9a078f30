"""Exchange rates into the base currency: set (appended, never overwritten) and read."""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Text, bindparam, exists, func, or_, select, union_all
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.ext.asyncio import AsyncConnection

from db.queue.rows import PENDING, RESOLVED
from db.tables import fx_rate
from db.tables import review_queue_item as item


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


# Open items whose currency has no rate at all yet: each needs an approver whatever its amount (the
# completion's fail safe), so operators watch how many wait so. Read through the open items' partial
# indexes and a probe of the rate index per item, never the resolved history.
_WITHOUT_RATE = select(func.count()).where(
    # As the open items' two partial indexes' predicates (db/stats.py), so the planner can use them.
    or_(item.c.state == PENDING, item.c.state.not_in([PENDING, RESOLVED])),
    item.c.currency != bindparam("base_currency", type_=Text),
    ~exists().where(fx_rate.c.currency == item.c.currency, fx_rate.c.set_at <= func.now()),
)


async def items_without_rate(conn: AsyncConnection, *, base_currency: str) -> int:
    return int(await conn.scalar(_WITHOUT_RATE, {"base_currency": base_currency}) or 0)


@dataclass(frozen=True, slots=True)
class OpenInCurrency:
    currency: str
    open: int  # items not RESOLVED in this currency
    has_rate: bool  # the base currency, or a rate set: False means each needs an approver


_open_currency = union_all(
    # The open items' two partial indexes (db/stats.py), so the resolved history is never read.
    select(item.c.currency).where(item.c.state == PENDING),
    select(item.c.currency).where(item.c.state.not_in([PENDING, RESOLVED])),
).subquery("open_items")
_BY_CURRENCY = (
    select(
        _open_currency.c.currency,
        func.count(),
        (_open_currency.c.currency == bindparam("base_currency", type_=Text))
        | exists().where(fx_rate.c.currency == _open_currency.c.currency, fx_rate.c.set_at <= func.now()),
    )
    .group_by(_open_currency.c.currency)
    .order_by(func.count().desc(), _open_currency.c.currency)
)


async def open_by_currency(conn: AsyncConnection, *, base_currency: str) -> list[OpenInCurrency]:
    """Open items per currency, most first, each with whether its currency can be converted yet."""
    rows = await conn.execute(_BY_CURRENCY, {"base_currency": base_currency})
    return [OpenInCurrency(currency, int(count), bool(has_rate)) for currency, count, has_rate in rows]
