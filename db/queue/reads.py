"""Reads: an item, lists of items, an item's events, a reviewer's decisions, lost leases."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Numeric,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, array
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from db.queue.enqueue import SPREAD
from db.queue.rows import (
    _BY_ID,
    _ITEM_COLUMNS,
    Item,
    _item,
)
from db.tables import fx_rate
from db.tables import review_queue_event as event
from db.tables import review_queue_item as item
from db.tokens import fold_subject
from db.unit import Unit


async def get_item(unit: Unit, *, item_id: UUID) -> Item | None:
    rows = await unit.execute(_BY_ID, {"item_id": item_id})
    return _item(rows[0]) if rows else None


@dataclass(frozen=True, slots=True)
class ItemFilter:
    state: str | None = None
    leased_by: str | None = None
    resolved_by: str | None = None
    ledger_entity: str | None = None
    match_decision: str | None = None
    idempotency_key: str | None = None
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    due_before: datetime | None = None  # exclusive
    min_amount: Decimal | None = None  # abs(variance_amount), inclusive
    max_amount: Decimal | None = None  # abs(variance_amount), inclusive
    search: str | None = None  # a prefix of the id, the key, the entity or a context value (_search)
    # With a currency, the amount bounds are amounts of it; without, of the base currency, which
    # each item's amount is converted into at its currency's latest rate.
    currency: str | None = None
    base_currency: str = "USD"
    # The lowest and the highest rate into the base currency, 1 among them (list_items reads them):
    # the bound on the amount itself that narrows a converted range through the amount's indexes.
    # None: no such bound (the exact comparison alone: right, but the amount's indexes go unused).
    rate_range: tuple[Decimal, Decimal] | None = None


ListOrder = Literal["created_at", "due_at"]


# Every prefix, up to _PREFIX_CAP characters, of the item's key, entity and context values,
# lower-cased (review_queue_item_search_prefixes, 2026_12_07_0120, GIN-indexed): a term is one element.
_PREFIX_CAP = 32
_PREFIXES = func.review_queue_item_search_prefixes(
    item.c.idempotency_key, item.c.ledger_entity, item.c.context, type_=ARRAY(Text)
)
# The same values, lower-cased, each after this separator: a longer term's exact check.
_SEPARATOR = "\x1f"
_SEARCH_TEXT = func.review_queue_item_search_text(
    item.c.idempotency_key, item.c.ledger_entity, item.c.context, type_=Text
)
_UUID_TEXT = "00000000-0000-0000-0000-000000000000"


def like_escaped(term: str) -> str:
    """`term` matching itself only in a LIKE pattern (escape character: backslash)."""
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def id_prefix_range(term: str) -> tuple[UUID, UUID] | None:
    """The ids whose canonical text starts with `term` (any letter case), as a range of the primary
    key (UUIDs order as their hex digits do); None when no id's text starts so."""
    folded = term.lower()
    shapes = zip(folded, _UUID_TEXT, strict=False)
    fits = len(folded) <= len(_UUID_TEXT) and all(
        c == "-" if shape == "-" else c in "0123456789abcdef" for c, shape in shapes
    )
    if not fits:
        return None
    rest = _UUID_TEXT[len(folded) :]
    return UUID(folded + rest), UUID(folded + rest.replace("0", "f"))


def _search(term: str) -> ColumnElement[bool]:
    """A prefix, in any letter case, of the id (a range of the primary key), or of the key, the
    entity or any string or number in the context, nested too: the term's first 32 characters are
    an element of the item's prefixes (ix_review_queue_item_search: the planner reads its posting
    list for a rare term, or walks the list order and filters for a common one); a longer term is
    then checked whole. Both sides are lower-cased by PostgreSQL, so that they fold alike."""
    folded = func.lower(literal(term, Text))
    found: ColumnElement[bool] = _PREFIXES.contains(array([func.left(folded, _PREFIX_CAP)]))
    if len(term) > _PREFIX_CAP:
        # A term with the separator in it could match across two values; no one types one.
        pattern = func.lower(literal(f"%{_SEPARATOR}{like_escaped(term)}%", Text))
        found = and_(found, _SEARCH_TEXT.like(pattern, escape="\\"))
    matches = [found]
    if (ids := id_prefix_range(term)) is not None:
        matches.append(item.c.id.between(*ids))
    return or_(*matches)


async def list_items(
    unit: Unit,
    *,
    where: ItemFilter,
    after: tuple[datetime, UUID] | None,
    limit: int,
    order: ListOrder = "created_at",
) -> list[Item]:
    """Items in (created_at, id) or (due_at, id) order, strictly after the keyset position `after`."""
    if where.currency is None and (where.min_amount, where.max_amount) != (None, None):
        (rates,) = await unit.execute(_RATE_RANGE, {})
        where = replace(where, rate_range=(rates["lowest"], rates["highest"]))
    statement = list_query(where=where, after=after, limit=limit, order=order)
    if where.search is None and (where.min_amount, where.max_amount) == (None, None):
        return [_item(r) for r in await unit.execute(statement, {})]
    _, rows = await unit.execute_all([(_PLAN_FOR_THE_VALUES, {}), (statement, {})])
    return [_item(r) for r in rows]


# A search, or an amount range, is planned for its values on every call. Once psycopg has prepared
# the statement (REVIEW_QUEUE_PREPARE_THRESHOLD runs), PostgreSQL may switch to its generic plan,
# costed with a default selectivity whatever the values (LIKE's 0.5 %, an inequality's third): for a
# term or an amount one item in a million has, that plan may walk the whole list order filtering
# each row rather than read the few the index holds. For its transaction only (is_local).
_PLAN_FOR_THE_VALUES = select(func.set_config("plan_cache_mode", "force_custom_plan", True))


# Every rate ever set (a superset of the latest ones, so a safe range): a small table.
_RATE_RANGE = select(
    func.least(1, func.min(fx_rate.c.rate)).label("lowest"),
    func.greatest(1, func.max(fx_rate.c.rate)).label("highest"),
)


def list_query(
    *, where: ItemFilter, after: tuple[datetime, UUID] | None, limit: int, order: ListOrder
) -> Any:
    """The statement of list_items (tests/integration/db/test_query_plans.py reads its plans).

    By due_at: one open state reads its partial index in that order (PENDING, or the other open
    states'), one ledger entity its index, the rest the (due_at, id) index; a search reads the
    matching rows by their indexes and orders only those."""
    column = item.c[order]
    query = select(*_ITEM_COLUMNS)
    for name in ("state", "leased_by", "resolved_by", "ledger_entity", "match_decision", "idempotency_key"):
        value = getattr(where, name)
        if value is not None:
            # An identity is found whatever the letter case it is typed in.
            folded = name in ("leased_by", "resolved_by")
            query = query.where(item.c[name] == (fold_subject(value) if folded else value))
    if where.created_after is not None:
        query = query.where(item.c.created_at >= where.created_after)
    if where.created_before is not None:
        query = query.where(item.c.created_at < where.created_before)
    if where.due_before is not None:
        query = query.where(item.c.due_at < where.due_before)
    if where.currency is not None:
        query = query.where(item.c.currency == where.currency)
    query = query.where(*_amount_bounds(where))
    if where.search is not None:
        query = query.where(_search(where.search))
    if after is not None:
        # The bound on the leading column alone lets an index that orders only by it (the partial
        # ones, by due_at) start at the position too.
        query = query.where(column >= after[0], tuple_(column, item.c.id) > tuple_(*after))
    if where.state is not None or (where.match_decision, where.min_amount, where.max_amount) == (None,) * 3:
        return query.order_by(column, item.c.id).limit(limit)
    # A match decision or an amount with no state: the resolved history is read through its own
    # partial indexes on them (ix_review_queue_item_resolved_match, _resolved_abs_amount, written
    # once per item, at its resolution), the open items through theirs, each part ordered and cut
    # to a page, then the parts merged.
    parts = union_all(
        *(
            query.where(part).order_by(_part_order(part, column), item.c.id).limit(limit)
            for part in _STATE_PARTS
        )
    )
    merged = parts.subquery("parts")
    return select(merged).order_by(merged.c[order], merged.c.id).limit(limit)


def _latest_rate(base_currency: str) -> Any:
    """An item's currency's latest rate into the base currency (1 for the base currency itself, none
    read), read backwards along ix_fx_rate_currency_set_at as the completion statement does; NULL
    when its currency has no rate yet."""
    return case(
        (item.c.currency == base_currency, literal(Decimal(1), Numeric())),
        else_=select(fx_rate.c.rate)
        .where(fx_rate.c.currency == item.c.currency, fx_rate.c.set_at <= func.now())
        .order_by(fx_rate.c.set_at.desc(), fx_rate.c.id.desc())
        .limit(1)
        .scalar_subquery(),
    )


def _amount_bounds(where: ItemFilter) -> list[ColumnElement[bool]]:
    """min_amount and max_amount on abs(variance_amount): of the given currency as they stand, or
    else of its base-currency equivalent at the latest rates. An item whose currency has no rate has
    no equivalent and meets no bound. The exact comparison is per row; beside it, a bound on the
    amount itself that every match meets (the amount times the highest rate reaches min_amount, the
    lowest keeps it under max_amount), a constant the planner can estimate, so that the amount's
    indexes still narrow the rows to read."""
    amount = func.abs(item.c.variance_amount)
    if where.currency is not None:
        return [
            *([amount >= where.min_amount] if where.min_amount is not None else []),
            *([amount <= where.max_amount] if where.max_amount is not None else []),
        ]
    converted = amount * _latest_rate(where.base_currency)
    out: list[ColumnElement[bool]] = []
    if where.min_amount is not None:
        out.append(converted >= where.min_amount)
    if where.max_amount is not None:
        out.append(converted <= where.max_amount)
    if where.rate_range is not None:
        lowest, highest = where.rate_range
        # Rounded outwards, so that the bound never leaves out a row the exact comparison keeps.
        with localcontext(prec=40, rounding=ROUND_FLOOR):
            out += [amount >= where.min_amount / highest] if where.min_amount is not None else []
        with localcontext(prec=40, rounding=ROUND_CEILING):
            out += [amount <= where.max_amount / lowest] if where.max_amount is not None else []
    return out


# Every item is in exactly one part, each written as its partial indexes' predicate, in literals
# so that a generic plan (a statement prepared after a few runs) still matches those indexes.
_OTHER_OPEN_PART = text("review_queue_item.state NOT IN ('PENDING', 'RESOLVED')")
_STATE_PARTS = (
    text("review_queue_item.state = 'RESOLVED'"),
    text("review_queue_item.state = 'PENDING'"),
    _OTHER_OPEN_PART,
)


def _part_order(part: Any, column: Any) -> Any:
    """How a part orders its page. The other open states (leased, awaiting approval, quarantined:
    bounded by the leases in flight) have no index in enqueue order, and the planner, taking their
    rows for spread through the table, walked the whole history's (created_at, id) index to find
    the newest (5 s at 10M items). The same order as an expression no index gives: the rows are
    fetched by their partial index, then sorted. By due_at they have ix_review_queue_item_open_due."""
    if part is _OTHER_OPEN_PART and column is item.c.created_at:
        return column + literal_column("interval '0'")
    return column


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    item_id: UUID
    event: str
    actor: str
    at: datetime
    lease_epoch: int
    trace_id: UUID
    details: dict[str, Any]


# An event as the API shows it: not the sealer's xid, nor the reports' copy of a lease start.
_EVENT_COLUMNS = [c for c in event.c if c.name not in ("xid", "leased_at", "item_after")]

# Keyset by the event id (an identity: it only grows), on ix_review_queue_event_item_id_id. No event
# of an item precedes its ENQUEUED, which is stamped now() while the item is created up to a batch's
# spread later (a microsecond per position, db/queue/enqueue.py), so `at >= since`, the item's
# created_at less that spread, lets PostgreSQL skip the trail's months before it: it plans and
# probes only the partitions from the item's month on, not every month kept (docs/capacity.md).
_EVENTS = (
    select(*_EVENT_COLUMNS)
    .where(
        event.c.item_id == bindparam("item_id"),
        event.c.at >= bindparam("since", type_=DateTime(timezone=True)),
        event.c.id > bindparam("after"),
    )
    .order_by(event.c.id)
    .limit(bindparam("limit"))
)


async def item_events(
    unit: Unit, *, item_id: UUID, since: datetime, after: int | None, limit: int
) -> list[Event]:
    """The item's events oldest first, strictly after the event id `after`; `since` is the item's
    created_at."""
    params = {"item_id": item_id, "since": since - SPREAD, "after": after or 0, "limit": limit}
    return [Event(*r.values()) for r in await unit.execute(_EVENTS, params)]


# The decisions of a reviewer: what they resolved, submitted for approval, approved or rejected.
DECISION_EVENTS = ("RESOLVED", "SUBMITTED_FOR_APPROVAL", "APPROVED", "REJECTED")
# Written exactly as the partial index's predicate, so that the planner matches it in every plan.
_IS_DECISION = text(f"review_queue_event.event IN ({', '.join(repr(e) for e in DECISION_EVENTS)})")


@dataclass(frozen=True, slots=True)
class Rejection:
    by: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Decision:
    event: Event
    item: Item  # as it is now
    rejection: Rejection | None = None  # of a submission, the approver's rejection that answered it


_answer = event.alias("answer")
# What answered a submission: the item's next decision-or-revision event after it (on the index of
# (item_id, id), from the submission's month on). A REJECTED one is the rejection; an approval, a
# revision that sent the proposal back, or (after a revision) a new submission is not.
_ANSWER = (
    select(
        _answer.c.event.label("answer_event"),
        _answer.c.actor.label("answer_actor"),
        _answer.c.at.label("answer_at"),
        _answer.c.details["reason"].astext.label("answer_reason"),
    )
    .where(
        event.c.event == "SUBMITTED_FOR_APPROVAL",
        _answer.c.item_id == event.c.item_id,
        _answer.c.at >= event.c.at,
        _answer.c.id > event.c.id,
        # Literal (not an expanding IN): the plan tests EXPLAIN the statement as compiled.
        text("answer.event IN ('APPROVED', 'REJECTED', 'SUBMITTED_FOR_APPROVAL', 'REVISED')"),
    )
    .order_by(_answer.c.id)
    .limit(1)
    .lateral("answered")
)

# Newest first, keyset by the event id, on ix_review_queue_event_decisions_by_actor; each with its
# item as it is now (by primary key) and, of a submission, what answered it.
_DECISIONS = (
    # The event's columns by other names: both have an `id`, and rows are read by name.
    select(*(c.label(f"event_{c.name}") for c in _EVENT_COLUMNS), *_ITEM_COLUMNS, *_ANSWER.c)
    .select_from(event.join(item, item.c.id == event.c.item_id).outerjoin(_ANSWER, true()))
    .where(event.c.actor == bindparam("actor", type_=Text), _IS_DECISION, event.c.id < bindparam("before"))
    .order_by(event.c.id.desc())
    .limit(bindparam("limit"))
)


async def decisions(unit: Unit, *, actor: str, before: int | None, limit: int) -> list[Decision]:
    """The actor's decision events newest first, strictly before the event id `before`."""
    params = {"actor": actor, "before": before or 2**63 - 1, "limit": limit}
    rows = await unit.execute(_DECISIONS, params)
    # By position: the event's columns, then the item's.
    split = len(_EVENT_COLUMNS)
    return [
        Decision(
            Event(*list(r.values())[:split]),
            _item(r),
            Rejection(r.answer_actor, r.answer_reason, r.answer_at) if r.answer_event == "REJECTED" else None,
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class LostLease:
    """A holder's lease that expired and that the reclaimer took back: its RECLAIMED event."""

    item_id: UUID
    lease_expired_at: datetime
    reclaimed_at: datetime


_leased_since = event.alias("leased_since")
# Why a holder's call was refused, when the reclaimer ended their lease: the item's last RECLAIMED
# event naming them as the previous holder, unless they leased the item again after it. On the
# index of (item_id, id); read only for a refusal, after it.
_LOST = (
    select(
        event.c.item_id,
        cast(event.c.details["lease_expired_at"].astext, DateTime(timezone=True)).label("lease_expired_at"),
        event.c.at.label("reclaimed_at"),
    )
    .where(
        event.c.item_id == func.any(bindparam("item_ids", type_=ARRAY(PG_UUID(as_uuid=True)))),
        event.c.event == "RECLAIMED",
        event.c.details["previous_holder"].astext == bindparam("holder", type_=Text),
        ~exists().where(
            _leased_since.c.item_id == event.c.item_id,
            _leased_since.c.id > event.c.id,
            _leased_since.c.event == "LEASED",
            _leased_since.c.actor == bindparam("holder", type_=Text),
        ),
    )
    .order_by(event.c.item_id, event.c.id.desc())
)


async def lost_leases(unit: Unit, *, item_ids: Sequence[UUID], holder: str) -> dict[UUID, LostLease]:
    """For each item whose lease `holder` lost to the reclaimer (and has not leased again since):
    when the lease expired and when it was reclaimed."""
    found: dict[UUID, LostLease] = {}
    for row in await unit.execute(_LOST, {"item_ids": list(item_ids), "holder": holder}):
        found.setdefault(row.item_id, LostLease(*row.values()))  # the newest of each item comes first
    return found
