"""Field types: deadlines, bounded strings, identities, dates and the item's context (money is in
api/schemas/money.py).

Each is an `Annotated` type whose documented schema is exactly what it accepts.
"""

import functools
import json
import re
import zoneinfo
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from typing_extensions import TypeAliasType

from db.vocabulary import MatchDecision as MatchDecision  # the contract's vocabulary, written once
from db.vocabulary import State as State


def _storable(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and a lone surrogate cannot be encoded: refuse both
    # here as a 422 instead of letting the driver fail with a 500.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return value


# PostgreSQL text cannot hold NUL: the documented pattern says so, and _storable also refuses lone
# surrogates (which JSON can carry as escapes, and which no schema generator produces).
NO_NUL = r"^[^\u0000]*$"


Text200 = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=NO_NUL), AfterValidator(_storable)
]
Note = Annotated[str, StringConstraints(max_length=4000, pattern=NO_NUL), AfterValidator(_storable)]
Reason = Annotated[str, StringConstraints(max_length=500, pattern=NO_NUL), AfterValidator(_storable)]
# A comment on an item's trail: something to read, so not only spaces, tabs and line breaks
# (spelled out: regex engines disagree on what \s is).
CommentText = Annotated[
    str,
    StringConstraints(min_length=1, max_length=2000, pattern=r"^[^\u0000]*[^\u0000\t\n\r ][^\u0000]*$"),
    AfterValidator(_storable),
]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value: object) -> object:
    # pydantic alone would also take "1700000000" (Unix seconds), "2026-01-01T00:00Z" and the like.
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 timestamp with an offset, e.g. 2026-01-01T00:00:00Z")
    return value


Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]

# A deadline: RFC 3339 with its offset, years 1970-2999 (so that it stays a timestamp every
# client and PostgreSQL round-trip in UTC). The pattern is the whole contract: the documented
# schema carries it, and the validator applies the same one.
DUE_AT_PATTERN = (
    r"^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
_DUE_AT = re.compile(DUE_AT_PATTERN)


def _due_at(value: object) -> object:
    if not isinstance(value, str) or not _DUE_AT.fullmatch(value):
        raise ValueError(
            "must be an RFC 3339 timestamp with an offset, years 1970-2999, e.g. 2026-12-04T17:00:00Z"
        )
    return value


def _in_utc(value: datetime) -> datetime:
    # The same instant in UTC: PostgreSQL reads offsets up to 15:59 only, and RFC 3339 (and the
    # pattern) allow up to 23:59 (+23:59 was a 500).
    return value.astimezone(UTC)


DueAt = Annotated[
    AwareDatetime,
    BeforeValidator(_due_at),
    AfterValidator(_in_utc),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "pattern": DUE_AT_PATTERN,
            "examples": ["2026-12-04T17:00:00Z"],
        },
        mode="validation",
    ),
]


def _json_integer(value: object) -> object:
    # What JSON Schema calls an integer: a number with no fraction (2 or 2.0, which api.routing
    # parses to a Decimal). Not `true`, which lax mode takes for 1, and not the string "2".
    if isinstance(value, bool | str):
        raise ValueError("must be a JSON integer")
    if isinstance(value, Decimal) and value.is_finite():
        # Looked at before int(): int(Decimal("1E+1000000")) is minutes of CPU, with the event loop stopped.
        if value and value.adjusted() > 18:
            raise ValueError("is far out of range")
        if value == value.to_integral_value():
            return int(value)
    return value


# JSON integers in a range. (The bounds go before the validator, or pydantic documents them as
# `ge`/`le` instead of JSON Schema's minimum/maximum.)
BatchSize = Annotated[int, Field(ge=1, le=200), BeforeValidator(_json_integer)]
ReclaimBatch = Annotated[int, Field(ge=1, le=1000), BeforeValidator(_json_integer)]
MAX_WAIT_S = 20  # the longest long poll of POST /leases
WaitSeconds = Annotated[int, Field(ge=0, le=MAX_WAIT_S), BeforeValidator(_json_integer)]

Timestamp = Annotated[
    datetime, PlainSerializer(lambda d: d.astimezone(UTC).isoformat(), return_type=str, when_used="json")
]


Resolution = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")]


class Strict(BaseModel):
    # Unknown fields are refused, so a body can never smuggle in leased_by, state or the like.
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        # FastAPI validates bodies with from_attributes=True, and api.routing parses a JSON number
        # into a Decimal, which pydantic would then read as an object with no attributes: a body
        # of `1.5` would pass as `{}`.
        if not isinstance(data, dict | BaseModel):
            raise ValueError("must be a JSON object")
        return data


MAX_CONTEXT_BYTES = 16 * 1024
MAX_CONTEXT_DEPTH = 32  # the context object itself is the first level


def _plain_json(value: Any, *, depth: int = 1) -> Any:
    """The context as plain JSON values: NUL-free text, numbers a double holds exactly, at most
    MAX_CONTEXT_DEPTH levels deep (checked on the way down, before any deeper recursion)."""
    if isinstance(value, dict | list) and depth > MAX_CONTEXT_DEPTH:
        raise ValueError(f"nested deeper than {MAX_CONTEXT_DEPTH} levels")
    if isinstance(value, dict):
        return {_storable(k): _plain_json(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_json(v, depth=depth + 1) for v in value]
    if isinstance(value, str):
        return _storable(value)
    if isinstance(value, Decimal):
        # api.routing parses JSON fractions as Decimal; a context is for reading, so a number is
        # kept as a double when it is one exactly, and refused (send it as a string) otherwise.
        as_float = float(value) if value.is_finite() else None
        if as_float is None or Decimal(repr(as_float)) != value:
            raise ValueError(f"the number {value} is not exactly a double; send it as a string")
        return as_float
    return value


def _stored_json(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_stored_json(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        return "[" + ",".join(_stored_json(v) for v in value) + "]"
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")  # as jsonb keeps a number: 1e300 is 301 digits
    return json.dumps(value, ensure_ascii=False)


def stored_size(context: dict[str, Any]) -> int:
    """The bytes of a context as compact JSON with each number written out as PostgreSQL's jsonb
    keeps it: measured as stored, not as sent (110 times 1e300 is 620 bytes sent, 33 KB stored).
    jsonb's text adds a space after each separator, at most half as much again: under its CHECK."""
    return len(_stored_json(context).encode())


def _context_size(value: dict[str, Any]) -> dict[str, Any]:
    size = stored_size(value)
    if size > MAX_CONTEXT_BYTES:
        raise ValueError(f"at most {MAX_CONTEXT_BYTES} bytes of compact JSON as stored, got {size}")
    return value


NulFree = Annotated[str, StringConstraints(pattern=NO_NUL)]
# Recursive, so that the documented schema says what is accepted at every depth (no NUL in any
# key or string): the API fuzzer's valid examples are then exactly the accepted ones.
# A key that does not match the pattern is refused too (patternProperties alone would allow it).
_NO_OTHER_KEYS = Field(json_schema_extra={"additionalProperties": False})
ContextValue = TypeAliasType(
    "ContextValue",
    "NulFree | int | float | bool | list[ContextValue]"
    " | Annotated[dict[NulFree, ContextValue], _NO_OTHER_KEYS] | None",
)

Context = Annotated[
    dict[NulFree, ContextValue],
    _NO_OTHER_KEYS,
    BeforeValidator(_plain_json),
    AfterValidator(_context_size),
    Field(
        description="Facts for the reviewer (account, counterparty, value dates, links): any JSON"
        " object up to 16 KiB as compact JSON, each number counted as stored (written out in full:"
        " 1e300 counts 301 bytes), nested at most 32 levels. Stored as given and returned with the"
        " item; part of the idempotency comparison. Shown as text, never as HTML.",
        examples=[{"account": "ACME-EUR-001", "counterparty": "Globex", "value_date": "2026-11-30"}],
    ),
]


Subject = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$"),
    Field(description="A token's subject (a reviewer's name).", examples=["bob"]),
]
AdminReason = Annotated[Reason, StringConstraints(min_length=1)]


# A calendar date as written in ISO 8601, years 1970-2999 (pydantic alone would take Unix seconds).
ISO_DATE_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
_ISO_DATE = re.compile(ISO_DATE_PATTERN)


def _iso_date(value: object) -> object:
    if not isinstance(value, str) or not _ISO_DATE.fullmatch(value):
        raise ValueError("must be a date written YYYY-MM-DD, years 1970-2999, e.g. 2026-11-02")
    return value


IsoDate = Annotated[
    date,
    BeforeValidator(_iso_date),
    WithJsonSchema(
        {"type": "string", "format": "date", "pattern": ISO_DATE_PATTERN, "examples": ["2026-11-02"]},
        mode="validation",
    ),
]

TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]{0,31}(/[A-Za-z0-9_+-]{1,32}){0,2}$"
# In Python's list of IANA names, but not zones: the host's own setting, and the placeholder zone.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def time_zones() -> frozenset[str]:
    """The IANA time zone names the reports take (Python's tz database; PostgreSQL has its own)."""
    return frozenset(zoneinfo.available_timezones() - _NOT_ZONES) | {"UTC"}


def _time_zone(value: str) -> str:
    if value not in time_zones():
        raise ValueError("must be an IANA time zone name, such as Europe/Berlin or UTC")
    return value


TimeZone = Annotated[
    str,
    StringConstraints(pattern=TIME_ZONE_PATTERN, max_length=64),
    AfterValidator(_time_zone),
    Field(examples=["Europe/Berlin"]),
]
