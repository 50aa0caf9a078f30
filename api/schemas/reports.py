"""Reports (docs/reports.md)."""

from datetime import date
from decimal import Decimal
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema, field_serializer

from api.schemas.fields import IsoDate, Strict, Text200, Timestamp, TimeZone
from api.schemas.money import AmountOut, amount_text

# The longest period per bucket size: a year (and a leap day) of days, a year (and a week) of weeks.
MAX_BUCKETS = {"day": 366, "week": 53}
_FROM = "The first day of the period, a local date in `tz` (inclusive)."
_TO = "The day after the period's last day, a local date in `tz` (exclusive); after `from`."
_MONDAYS = " A Monday when `bucket` is `week`."
_AT_MOST = (
    f" At most {MAX_BUCKETS['day']} days after `from` ({MAX_BUCKETS['week']} weeks when `bucket` is `week`)."
)


def period_rules(*buckets: str) -> dict[str, Any]:
    """The period's rules across parameters, which a JSON Schema cannot state, as an OpenAPI
    extension of the operation (`x-period`), so that generated clients and fuzzers can read them:
    `to` after `from`; per bucket size of the report, at most so many buckets; weeks from a Monday."""
    rules: dict[str, Any] = {"to_after_from": True}
    if buckets:
        rules["max_buckets"] = {b: MAX_BUCKETS[b] for b in buckets}
    if "week" in buckets:
        rules["week_starts_on"] = "Monday"
    return {"x-period": rules}


class PeriodQuery(Strict):
    from_: IsoDate = Field(alias="from", description=_FROM)
    to: IsoDate = Field(description=_TO)
    tz: TimeZone = Field(
        default="UTC",
        description="IANA time zone of the dates and the buckets: each day runs from local midnight to"
        " local midnight (23 or 25 hours across a DST change).",
    )


class BucketQuery(PeriodQuery):
    from_: IsoDate = Field(alias="from", description=_FROM + _MONDAYS)
    to: IsoDate = Field(description=_TO + _AT_MOST + _MONDAYS)
    bucket: Literal["day", "week"] = Field(
        default="day",
        description="`week`: ISO weeks, Monday to Monday; `from` and `to` must then be Mondays.",
    )


class SlaQuery(BucketQuery):
    ledger_entity: Text200 | None = Field(default=None, description="Only this ledger entity's items.")


class BacklogQuery(PeriodQuery):
    to: IsoDate = Field(description=_TO + f" At most {MAX_BUCKETS['day']} days after `from`.")
    bucket: Literal["day"] = Field(default="day", description="The backlog is measured at each day's end.")
    by: Literal["currency"] | None = Field(
        default=None,
        description="`currency`: each point also split by the currency each open item had at that moment"
        " (`by_currency`).",
    )


class DecisionsQuery(PeriodQuery):
    pass


# Exact decimals as strings: a ratio to 4 places, seconds to the microsecond.
Attainment = Annotated[
    Decimal,
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^[01]\.[0-9]{4}$", "examples": ["0.9375"]}),
]
Seconds = Annotated[
    Decimal,
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+\.[0-9]{6}$", "examples": ["754.000000"]}),
]


class ReportOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: date = Field(alias="from")
    to: date
    tz: str
    bucket: Literal["day", "week"]
    as_of: Timestamp = Field(description="The database's clock when the report was computed.")


class SlaFiguresOut(BaseModel):
    fell_due: int = Field(description="Items whose due_at is in the bucket and has passed (as_of).")
    on_time: int = Field(description="... resolved at their due_at: a decision was in effect then.")
    late: int = Field(description="... not resolved at their due_at, resolved now.")
    open_past_due: int = Field(description="... not resolved at their due_at, not resolved now.")
    attainment: Attainment | None = Field(
        description="on_time / fell_due, to 4 decimal places (half up); null when nothing fell due."
    )


class SlaBucketOut(SlaFiguresOut):
    start: date = Field(description="The bucket's first day (a Monday for weeks).")


class SlaOut(ReportOut):
    ledger_entity: str | None
    buckets: list[SlaBucketOut]
    total: SlaFiguresOut


class ThroughputRowOut(BaseModel):
    start: date
    reviewer: str
    resolved: int
    submitted_for_approval: int
    approved: int
    rejected: int
    released: int = Field(
        description="Leases the holder handed back (an admin's override release is not): not a decision,"
        " so neither in `decisions` nor in the times to decision."
    )
    decisions: int = Field(description="resolved + submitted_for_approval + approved + rejected.")
    median_lease_to_decision_s: Seconds | None = Field(
        description="Nearest-rank median of the time from the lease each decision ended to the decision;"
        " null when the reviewer made none in the bucket (only releases)."
    )
    p90_lease_to_decision_s: Seconds | None = Field(description="Nearest-rank 90th percentile of the same.")


class ThroughputOut(ReportOut):
    reviewer: str | None = Field(
        description="Set when the rows are the caller's own only (roles reviewer and approver)."
    )
    rows: list[ThroughputRowOut] = Field(
        description="One per bucket and reviewer with a decision or a release."
    )


class BacklogFiguresOut(BaseModel):
    open: int = Field(description="Items of the currency open at `at`.")
    by_age: dict[str, int] = Field(description="... by age since enqueue.")


class BacklogPointOut(BaseModel):
    start: date = Field(description="The day.")
    at: Timestamp = Field(description="Its end (the next local midnight), or as_of for the day in progress.")
    open: int = Field(description="Items open at `at`.")
    by_age: dict[str, int] = Field(description="... by age since enqueue: 0-1d, 1-3d, 3-7d, 7-30d, 30d+.")
    by_currency: dict[str, BacklogFiguresOut] | None = Field(
        default=None,
        description="With `by=currency`: per ISO 4217 code with items open at `at` (as the item's currency"
        " stood then: a revision can change it), the same counts; they add up to `open` and `by_age`."
        " Null otherwise.",
    )


class BacklogOut(ReportOut):
    by: Literal["currency"] | None = Field(default=None, description="`currency` when the points are split.")
    bands: list[str]
    points: list[BacklogPointOut] = Field(description="One per day that has begun.")


class DecisionRowOut(BaseModel):
    """One decision, as a line of the NDJSON export (and a row of the CSV export, same order)."""

    event_id: int
    item_id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: AmountOut = Field(
        description="The figures the decision was made on, with exactly its currency's decimals."
    )
    currency: str = Field(description="ISO 4217 code of variance_amount.")

    @field_serializer("variance_amount", when_used="json")
    def _amount(self, amount: Decimal) -> str:
        return amount_text(amount, self.currency)

    match_decision: str
    resolution: str
    note: str | None
    resolved_by: str
    resolved_at: Timestamp
    approved_by: str | None
    approved_at: Timestamp | None
    due_at: Timestamp
    on_time: bool = Field(description="resolved_at <= due_at.")
    reopened_at: Timestamp | None = Field(description="When the decision was reopened, if it was.")
    rate: str | None = Field(
        description="The exchange rate into the base currency the completion converted at (an approval's:"
        " its submission's), exact decimal text as the trail recorded it; 1 in the base currency; null"
        " when the currency had no rate (an approver was needed whatever the amount) or before currencies.",
        examples=["1.0850"],
    )
    base_amount: str | None = Field(
        description="variance_amount times rate, exactly, unrounded: the base-currency amount the thresholds"
        " were compared with; null with no rate.",
        examples=["10307.500000"],
    )

    model_config = ConfigDict(from_attributes=True)
