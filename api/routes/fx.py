"""Exchange rates into the base currency: kept with who set them and when, never overwritten."""

from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import AnyRole, Conn, Ingest, SettingsDep
from api.errors import ProblemError, problem_responses
from api.routing import QueueRoute
from api.schemas.fx import RateHistoryOut, RateHistoryQuery, RateIn, RateOut, RatesOut
from api.schemas.money import CurrencyCode
from db import fx

router = APIRouter(route_class=QueueRoute, tags=["fx-rates"])

CurrencyPath = Annotated[CurrencyCode, Path(description="ISO 4217 code.", examples=["EUR"])]


def _out(rate: fx.Rate) -> RateOut:
    return RateOut(
        currency=rate.currency, rate=format(rate.rate, "f"), set_by=rate.set_by, set_at=rate.set_at
    )


@router.put(
    "/fx-rates/{currency}",
    operation_id="setFxRate",
    summary="Set a currency's rate into the base currency (ingest, admin)",
    responses=problem_responses("BASE_CURRENCY"),
)
async def set_rate(
    currency: CurrencyPath, body: RateIn, conn: Conn, principal: Ingest, settings: SettingsDep
) -> RateOut:
    """A new rate from now on (a treasury feed posts them with an ingest token); the earlier ones are
    kept as history. The base currency's rate is 1 by definition: 409 BASE_CURRENCY."""
    if currency == settings.base_currency:
        raise ProblemError("BASE_CURRENCY", f"{currency} is the base currency: its rate is 1 by definition")
    return _out(await fx.set_rate(conn, currency=currency, rate=Decimal(body.rate), actor=principal.subject))


@router.get("/fx-rates", operation_id="listFxRates", summary="The latest rate of each currency")
async def list_rates(conn: Conn, _: AnyRole, settings: SettingsDep) -> RatesOut:
    """The latest rate of every currency that has one, into `base_currency`. Any role."""
    return RatesOut(
        base_currency=settings.base_currency, rates=[_out(r) for r in await fx.latest_rates(conn)]
    )


@router.get("/fx-rates/{currency}/history", operation_id="fxRateHistory", summary="Every rate a currency had")
async def rate_history(
    currency: CurrencyPath, query: Annotated[RateHistoryQuery, Query()], conn: Conn, _: AnyRole
) -> RateHistoryOut:
    """Every rate set for the currency, newest first, with who set it and when. Any role."""
    rates = await fx.rate_history(conn, currency=currency, limit=query.limit)
    return RateHistoryOut(currency=currency, rates=[_out(r) for r in rates])
