"""Enqueue: new items in one statement, idempotent on their key."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Numeric,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from db import telemetry
from db.notify import notify_work
from db.queue.rows import _ITEM_COLUMNS, Item, _changed_items, _item
from db.tables import fx_rate
from db.tables import review_queue_item as item
from db.unit import Unit


@dataclass(frozen=True, slots=True)
class NewItem:
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    currency: str
    match_decision: str
    source_hash: str
    trace_id: UUID | None = None
    context: dict[str, Any] | None = None
    due_at: datetime | None = None  # None: created_at + the hours of the amount's SLA tier

    def matches(self, existing: Item) -> bool:
        """Same payload as a stored item? A retry that omits trace_id matches any trace_id, and one
        that omits due_at any due_at (a derived deadline depends on when the item first came and on
        the policy then, neither of which the sender chose); the context is part of the payload
        (none and none match)."""
        return (
            self.ledger_entity == existing.ledger_entity
            and self.variance_amount == existing.variance_amount
            and self.currency == existing.currency
            and self.match_decision == existing.match_decision
            and self.source_hash == existing.source_hash
            and (self.trace_id is None or self.trace_id == existing.trace_id)
            and (self.due_at is None or self.due_at == existing.due_at)
            and self.context == existing.context
        )


EnqueueOutcome = Literal["created", "existing", "conflict"]

# ON CONFLICT DO NOTHING makes a concurrent duplicate wait for the first insert and then
# insert nothing, instead of failing with a unique violation. Rows go in in key order so
# two overlapping batches lock keys in the same order and cannot deadlock.
_batch = (
    func.unnest(
        bindparam("idempotency_keys", type_=ARRAY(Text)),
        bindparam("ledger_entities", type_=ARRAY(Text)),
        bindparam("variance_amounts", type_=ARRAY(Numeric())),
        bindparam("currencies", type_=ARRAY(Text)),
        bindparam("match_decisions", type_=ARRAY(Text)),
        bindparam("source_hashes", type_=ARRAY(Text)),
        bindparam("trace_ids", type_=ARRAY(PG_UUID(as_uuid=True))),
        bindparam("positions", type_=ARRAY(BigInteger)),
        # JSON text, cast below: a text[] binds without a JSON serializer per element.
        bindparam("contexts", type_=ARRAY(Text)),
        bindparam("due_ats", type_=ARRAY(DateTime(timezone=True))),
    )
    .table_valued("k", "e", "a", "cur", "d", "h", "t", "p", "c", "due")
    .render_derived()
)
# The SLA tiers (REVIEW_QUEUE_SLA_TIERS) are base-currency amounts, like the approval thresholds:
# an item's tier is the highest its absolute amount reaches converted at its currency's latest rate
# set before this transaction began (the completion's rate, db/queue/completion.py); the base
# currency's rate is 1. No rate: the strictest tier (the fewest hours), whatever the amount, as four
# eyes fails safe: 9,000 JPY and 9,000 KWD are not given the time of 9,000 dollars.
_tiers = (
    func.unnest(
        bindparam("tier_floors", type_=ARRAY(Numeric())), bindparam("tier_hours", type_=ARRAY(Integer))
    )
    .table_valued("floor", "hours")
    .render_derived()
)
_rate = case(
    (_batch.c.cur == bindparam("base_currency", type_=Text), literal_column("1", Numeric())),
    else_=select(fx_rate.c.rate)
    .where(fx_rate.c.currency == _batch.c.cur, fx_rate.c.set_at <= func.now())
    .order_by(fx_rate.c.set_at.desc(), fx_rate.c.id.desc())
    .limit(1)
    .correlate(_batch)  # the new item's row, two levels out (inside the tiers' subquery)
    .scalar_subquery(),
)
_sla_hours = func.coalesce(
    select(_tiers.c.hours)
    .where(func.abs(_batch.c.a) * _rate >= _tiers.c.floor)
    .order_by(_tiers.c.floor.desc())
    .limit(1)
    .scalar_subquery(),
    select(func.min(_tiers.c.hours)).scalar_subquery(),
)
# One transaction shares one now(); a microsecond per position keeps a batch in request order in
# the queue. The items' ENQUEUED events are stamped now(), so an item of a batch is created up to
# SPREAD after its ENQUEUED: db/queue/reads.py reads an item's trail from created_at minus SPREAD.
SPREAD = timedelta(seconds=1)
_MAX_POSITIONS = SPREAD // timedelta(microseconds=1)
_created_at = func.now() + _batch.c.p * literal_column("interval '1 microsecond'")
_inserted = (
    insert(item)
    .from_select(
        [
            "idempotency_key",
            "ledger_entity",
            "variance_amount",
            "currency",
            "match_decision",
            "source_hash",
            "trace_id",
            "created_at",
            "context",
            "due_at",
        ],
        select(
            _batch.c.k,
            _batch.c.e,
            _batch.c.a,
            _batch.c.cur,
            _batch.c.d,
            _batch.c.h,
            func.coalesce(_batch.c.t, func.gen_random_uuid()),
            _created_at,
            cast(_batch.c.c, JSONB),
            # The database's clock, like every other time here.
            func.coalesce(_batch.c.due, _created_at + func.make_interval(0, 0, 0, 0, _sla_hours)),
        ).order_by(_batch.c.k),
    )
    .on_conflict_do_nothing(index_elements=[item.c.idempotency_key])
    .returning(*_ITEM_COLUMNS)
    .cte("inserted")
)
_ENQUEUE = _changed_items(_inserted, "ENQUEUED")
_BY_KEYS = select(*_ITEM_COLUMNS).where(
    item.c.idempotency_key == func.any(bindparam("idempotency_keys", type_=ARRAY(Text)))
)


async def enqueue_items(
    unit: Unit,
    *,
    new: Sequence[NewItem],
    actor: str,
    sla_tiers: Sequence[tuple[Decimal, int]],
    base_currency: str,
) -> list[tuple[EnqueueOutcome, Item]]:
    """Insert the new keys in one statement; answer per input, in input order. An item without a
    due_at is due after the hours of the highest of `sla_tiers` (base-currency amount, hours) its
    amount reaches in the base currency (no rate: the strictest)."""
    if len(new) > _MAX_POSITIONS:
        raise ValueError(f"at most {_MAX_POSITIONS} items in one statement, not {len(new)}")
    first: dict[str, int] = {}
    for position, candidate in enumerate(new):
        first.setdefault(candidate.idempotency_key, position)
    unique = [new[p] for p in first.values()]
    params = {
        "idempotency_keys": [n.idempotency_key for n in unique],
        "ledger_entities": [n.ledger_entity for n in unique],
        "variance_amounts": [n.variance_amount for n in unique],
        "currencies": [n.currency for n in unique],
        "match_decisions": [n.match_decision for n in unique],
        "source_hashes": [n.source_hash for n in unique],
        "trace_ids": [n.trace_id for n in unique],
        "positions": list(first.values()),
        "contexts": [None if n.context is None else json.dumps(n.context) for n in unique],
        "due_ats": [n.due_at for n in unique],
        "tier_floors": [floor for floor, _ in sla_tiers],
        "tier_hours": [hours for _, hours in sla_tiers],
        "base_currency": base_currency,
        "actor": actor,
    }
    created = {i.idempotency_key: i for i in map(_item, await unit.execute(_ENQUEUE, params))}
    if created:
        await notify_work(unit)  # once for the whole batch, delivered at commit
    unit.after_commit(partial(telemetry.enqueued, len(created)))
    missing = [k for k in first if k not in created]
    stored = dict(created)
    if missing:
        rows = await unit.execute(_BY_KEYS, {"idempotency_keys": missing})
        stored.update((i.idempotency_key, i) for i in map(_item, rows))
    results: list[tuple[EnqueueOutcome, Item]] = []
    for position, candidate in enumerate(new):
        existing = stored[candidate.idempotency_key]
        if candidate.idempotency_key in created and first[candidate.idempotency_key] == position:
            results.append(("created", existing))
        else:
            results.append(("existing" if candidate.matches(existing) else "conflict", existing))
    return results


async def enqueue_item(
    unit: Unit, *, new: NewItem, actor: str, sla_tiers: Sequence[tuple[Decimal, int]], base_currency: str
) -> tuple[EnqueueOutcome, Item]:
    (result,) = await enqueue_items(
        unit, new=[new], actor=actor, sla_tiers=sla_tiers, base_currency=base_currency
    )
    return result
