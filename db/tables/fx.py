"""The exchange rates the amounts in other currencies are compared by."""

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Numeric,
    Table,
    Text,
    func,
)

from db.tables.base import metadata

# Exchange rates into the base currency (2026_12_06_1900): one row per rate set, never changed (the
# application role may only insert and read). The rate of a currency at an instant is the last one
# set before it; the base currency's is 1 by definition and never stored.
fx_rate = Table(
    "fx_rate",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("currency", Text, nullable=False),
    Column("rate", Numeric(asdecimal=True), nullable=False),  # one unit of `currency` in the base currency
    Column("set_by", Text, nullable=False),
    Column("set_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_code"),
    CheckConstraint("rate > 0 AND rate = round(rate, 10) AND rate < 1e12", name="rate_bounds"),
    Index("ix_fx_rate_currency_set_at", "currency", "set_at", "id"),
)
