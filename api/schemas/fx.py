"""Exchange rates into the base currency (issue 40)."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.fields import Strict, Timestamp

# One unit of the currency in the base currency: positive, up to 12 integer and 10 fraction digits,
# a decimal string (never a float). The pattern is the whole contract (zero does not match it).
# At least 1 (a non-zero integer part), or below 1 with a non-zero digit among the 10 decimals.
_BELOW_ONE = "|".join(f"0{{{k}}}[1-9][0-9]{{0,{9 - k}}}" for k in range(10))
RATE_PATTERN = rf"^(0{{0,11}}[1-9][0-9]{{0,{11}}}(\.[0-9]{{1,10}})?|0{{1,12}}\.({_BELOW_ONE}))$"

RateText = Annotated[
    str,
    StringConstraints(pattern=RATE_PATTERN),
    Field(examples=["1.0850"]),
]


class RateIn(Strict):
    rate: RateText = Field(description="The value of one unit of the currency in the base currency.")


class RateOut(BaseModel):
    currency: str = Field(examples=["EUR"])
    rate: Annotated[str, Field(pattern=r"^[0-9]{1,12}(\.[0-9]{1,10})?$", examples=["1.0850"])]
    set_by: str
    set_at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class RatesOut(BaseModel):
    base_currency: str = Field(description="Every rate is into it; its own rate is 1 by definition.")
    rates: list[RateOut] = Field(description="The latest rate of each currency that has one.")


class RateHistoryQuery(Strict):
    limit: int = Field(default=100, ge=1, le=1000)


class RateHistoryOut(BaseModel):
    currency: str
    rates: list[RateOut] = Field(description="Every rate set, newest first; none is ever changed.")
