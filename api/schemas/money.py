"""Money in its currency: amounts as finance writes them, in the currency's own decimals (ISO 4217),
thresholds and bounds that are never negative. Decimal in, a decimal string out, never a float.

Each is an `Annotated` type whose documented schema is exactly what it accepts.
"""

import functools
import re
from decimal import Decimal
from typing import Annotated, Any

from iso4217 import Currency as Iso4217
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

# A decimal string exactly as finance writes it: no exponent, no sign but '-', no spaces, no
# digit separators, ASCII digits only (Python's Decimal would take "1_000.50", " 12.50 ", "+5",
# "1e5" and Arabic-Indic digits).
MONEY_PATTERN = r"^-?[0-9]{1,16}(\.[0-9]{1,2})?$"
_MONEY_STRING = re.compile(MONEY_PATTERN)


def _money_input(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError('must be a decimal string such as "12.50" or a JSON number, not a boolean')
    if isinstance(value, str) and not _MONEY_STRING.fullmatch(value):
        raise ValueError(
            'must be a decimal string of up to 16 integer and 2 fraction digits, e.g. "-12.50"'
            " (no exponent, spaces, '+' or separators)"
        )
    return value


_CENT = Decimal("0.01")


def _money(value: Decimal) -> Decimal:
    if not value.is_finite():
        raise ValueError("must be a finite number")
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if exponent < -2:
        raise ValueError("at most 2 fraction digits; the amount is never rounded")
    # adjusted() reads the exponent; abs() would compute in the decimal context and overflow
    # (decimal.Overflow, a 500) on a JSON number such as 1E+1000000.
    if value and value.adjusted() >= 16:
        raise ValueError("at most 16 integer digits")
    # Exact (at most 18 digits by now); 0E+1000000 becomes 0.00, which PostgreSQL can read.
    return value.quantize(_CENT)


# Decimal in (a string like "12.50" or a JSON number parsed straight to Decimal, see
# api.routing), a string with exactly two decimals out. The documented input schema is exactly
# what is accepted: the string pattern, or a number of cents within the limits.
Money = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["12.50"]),
    BeforeValidator(_money_input),
    AfterValidator(_money),
    PlainSerializer(lambda d: f"{d:.2f}", return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": MONEY_PATTERN},
                {"type": "number", "multipleOf": 0.01, "exclusiveMinimum": -1e16, "exclusiveMaximum": 1e16},
            ],
            "examples": ["12.50"],
        },
        mode="validation",
    ),
    WithJsonSchema(
        {"type": "string", "pattern": r"^-?[0-9]{1,16}\.[0-9]{2}$", "examples": ["12.50"]},
        mode="serialization",
    ),
]


MAX_DECIMALS = 3  # what the amount column holds (ck_review_queue_item_amount_bounds)


@functools.cache
def currencies() -> dict[str, int]:
    """The ISO 4217 codes an item's amount may be in, with their minor units (decimals), from the
    `iso4217` package's copy of the ISO list: every currency with 0 to 3 decimals. Left out: funds,
    metals and codes without minor units (XAU, XDR, XTS, XXX ...), and the two units of account with
    four decimals (CLF, UYW), which three-decimal storage could not hold unrounded."""
    return {c.code: c.exponent for c in Iso4217 if c.exponent is not None and 0 <= c.exponent <= MAX_DECIMALS}


def minor_units(code: str) -> int:
    return currencies()[code]


def _known_currency(value: str) -> str:
    if value not in currencies():
        raise ValueError("must be an ISO 4217 currency code with 0 to 3 decimals, such as EUR, JPY or KWD")
    return value


CurrencyCode = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Z]{3}$"),
    AfterValidator(_known_currency),
    WithJsonSchema({"type": "string", "enum": sorted(currencies()), "examples": ["EUR"]}, mode="validation"),
    WithJsonSchema({"type": "string", "pattern": r"^[A-Z]{3}$", "examples": ["EUR"]}, mode="serialization"),
]


def decimals_problem(amount: Decimal, currency: str) -> str | None:
    """Why `amount` cannot be an amount in `currency` (more decimals than its minor units), as a
    sentence naming them; None when it can. Amounts are never rounded."""
    exponent = amount.as_tuple().exponent
    assert isinstance(exponent, int)
    decimals = minor_units(currency)
    if -exponent <= decimals:
        return None
    allowed = "no decimals" if decimals == 0 else f"at most {decimals} decimal{'s' if decimals > 1 else ''}"
    written = f"{-exponent} decimal{'s' if -exponent > 1 else ''}"
    return f"{amount} has {written}; an amount in {currency} has {allowed} (ISO 4217 minor units)"


def in_minor_units(amount: Decimal, currency: str) -> Decimal:
    """The amount written with exactly its currency's decimals (exact: checked before)."""
    return amount.quantize(Decimal(1).scaleb(-minor_units(currency)))


def amount_text(amount: Decimal, currency: str) -> str:
    """An amount as the API writes it: exactly its currency's decimals ("1500" JPY, "12.50" USD,
    "1.234" KWD), never through a float."""
    return f"{amount:.{minor_units(currency) if currency in currencies() else MAX_DECIMALS}f}"


AMOUNT_PATTERN = r"^-?[0-9]{1,16}(\.[0-9]{1,3})?$"
_AMOUNT_STRING = re.compile(AMOUNT_PATTERN)


def _amount_input(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError('must be a decimal string such as "12.50" or a JSON number, not a boolean')
    if isinstance(value, str) and not _AMOUNT_STRING.fullmatch(value):
        raise ValueError(
            'must be a decimal string of up to 16 integer and 3 fraction digits, e.g. "-12.50"'
            " (no exponent, spaces, '+' or separators)"
        )
    return value


def _amount(value: Decimal) -> Decimal:
    if not value.is_finite():
        raise ValueError("must be a finite number")
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if exponent < -MAX_DECIMALS:
        raise ValueError(f"at most {MAX_DECIMALS} fraction digits (KWD's); the amount is never rounded")
    if value and value.adjusted() >= 16:
        raise ValueError("at most 16 integer digits")
    if exponent > 0:  # 0E+1000000, 1E+3 as a JSON number: written out, as PostgreSQL keeps it
        value = value.quantize(Decimal(1))
    return value


# Out: exactly the currency's decimals ("1500" JPY, "12.50" USD, "1.234" KWD).
AmountOut = Annotated[
    Decimal,
    WithJsonSchema(
        {"type": "string", "pattern": r"^-?[0-9]{1,16}(\.[0-9]{1,3})?$", "examples": ["12.50"]},
        mode="serialization",
    ),
]


def amount_fits_currency(data: Any) -> Any:
    """A body's variance_amount with more decimals than its `currency` has (both given and well
    formed): refused with the sentence naming the currency's decimals, before the amount's own type
    answers more vaguely. Absent currency: the route checks against the base currency."""
    code = data.get("currency") if isinstance(data, dict) else None
    if isinstance(code, str) and code in currencies():
        amount = data.get("variance_amount")
        if isinstance(amount, str) and re.fullmatch(r"-?[0-9]{1,16}\.[0-9]{1,32}", amount):
            amount = Decimal(amount)
        if isinstance(amount, Decimal) and amount.is_finite():
            problem = decimals_problem(amount, code)
            if problem is not None:
                raise PydanticCustomError("currency_minor_units", problem)
    return data


# An item's amount as sent: up to three decimals here; the item's currency then allows its own
# number (api/routes/items.py), and the answer writes exactly that many (amount_text).
Amount = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["12.50"]),
    BeforeValidator(_amount_input),
    AfterValidator(_amount),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": AMOUNT_PATTERN},
                {"type": "number", "multipleOf": 0.001, "exclusiveMinimum": -1e16, "exclusiveMaximum": 1e16},
            ],
            "examples": ["12.50"],
        },
        mode="validation",
    ),
]


def _unsigned_input(value: object) -> object:
    if isinstance(value, str) and value.startswith("-"):
        raise ValueError("must not be negative")
    return value


def _not_negative(value: Decimal) -> Decimal:
    if value < 0:
        raise ValueError("must not be negative")
    return value.copy_abs()  # -0 as a JSON number is 0


# An approval threshold: Money that is never negative (it is compared with an absolute amount).
Threshold = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["10000.00"]),
    BeforeValidator(_money_input),
    BeforeValidator(_unsigned_input),
    AfterValidator(_money),
    AfterValidator(_not_negative),
    PlainSerializer(lambda d: f"{d:.2f}", return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^[0-9]{1,16}(\.[0-9]{1,2})?$"},
                {"type": "number", "multipleOf": 0.01, "minimum": 0, "exclusiveMaximum": 1e16},
            ],
            "examples": ["10000.00"],
        },
        mode="validation",
    ),
    WithJsonSchema(
        {"type": "string", "pattern": r"^[0-9]{1,16}\.[0-9]{2}$", "examples": ["10000.00"]},
        mode="serialization",
    ),
]

# A bound on abs(variance_amount) (GET /items' min_amount and max_amount): what the amount column
# holds, three decimals (a KWD amount: "1.234") and below 1e16, never negative; a query value is a
# string, so the string alone is the schema. Beyond either limit: a 422 whose sentence names it.
AMOUNT_BOUND_PATTERN = r"^[0-9]{1,16}(\.[0-9]{1,3})?$"
_AMOUNT_BOUND = re.compile(AMOUNT_BOUND_PATTERN)


def _amount_bound_input(value: object) -> object:
    if isinstance(value, str) and not value.startswith("-") and not _AMOUNT_BOUND.fullmatch(value):
        raise ValueError(
            "must be a decimal string of up to 16 integer digits (below 1e16, the amount column's bound)"
            " and 3 fraction digits (KWD's), e.g. \"1000.50\" (no exponent, spaces, '+' or separators)"
        )
    return value


AmountBound = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["1000.50"]),
    BeforeValidator(_amount_bound_input),
    BeforeValidator(_unsigned_input),
    AfterValidator(_amount),
    AfterValidator(_not_negative),
    WithJsonSchema({"type": "string", "pattern": AMOUNT_BOUND_PATTERN, "examples": ["1000.50"]}),
]
