"""The change feed: every event across items, in an order a consumer that stores its cursor can trust.

The walk is the sealer's (db/audit.py): events of transactions below `pg_snapshot_xmin`, by
position (xid, id). Everything below that line has ended, so no event can still appear behind a
position already served: an open transaction holding a low identity value holds the feed back
and its events come after it commits, never skipped. `xid` is `xid8`, the 64-bit epoch-extended
transaction id: it never wraps around, so positions compare as plain numbers for the life of the
cluster (docs/integrations.md has the one operational caveat: a logical dump restored into a new
cluster).

(xid, id) is not always an item's own order. Each event is written by the statement that locks its
item's row, so within one item the event id is the true order; but a transaction can take its xid
(at its first write) before another that then writes an event of the same item first (a batch
completion waiting on a row a concurrent renew holds, say). Walking by position alone would
serve such an item's events out of order. So an event is served at the first position, in walk
order, among its own and its item's later events:

- at position p, the item's events after the "barrier" (its latest earlier event at or below p's
  xid) up to p itself are served, in id order: normally p alone, sometimes p's predecessors whose
  positions come later;
- a position whose event was already served that way (a later event of its item sits at an
  earlier position) serves nothing.

Both rules read only committed events whose positions are behind xmin, so they give the same
answer however often a page is read: every event is served exactly once in a walk from the start,
each item's events in their own order, and a stored cursor never skips one.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import UUID as SA_UUID
from sqlalchemy.types import BigInteger, Text

from db.queue import Item
from db.queue.rows import AFTER_FIELDS
from db.vocabulary import EVENTS

MAX_XID = 2**64 - 1
MAX_ID = 2**63 - 1
# How many positions a filtered page looks at before it answers with what it found (maybe
# nothing) and the position it reached, so a filter that matches rarely still moves the cursor.
FILTERED_SCAN = 1000

# The webhook type of each event (Standard Webhooks' `type`): one for every event, 1:1.
TYPES: dict[str, str] = {name: "item." + name.lower() for name in EVENTS}
EVENTS_OF_TYPE = {t: name for name, t in TYPES.items()}


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """A place in the walk: everything at or before it has been served."""

    xid: int
    id: int

    def encode(self) -> str:
        """The opaque cursor: 32 hex digits. Every string of that form (with the id's top bit
        clear) is a valid position, so the pattern in api/schemas/codecs.py is the whole contract."""
        return f"{self.xid:016x}{self.id:016x}"

    @classmethod
    def decode(cls, cursor: str) -> "Position":
        return cls(int(cursor[:16], 16), int(cursor[16:], 16))


START = Position(0, 0)


@dataclass(frozen=True, slots=True)
class FeedEvent:
    id: int
    item_id: UUID
    event: str
    actor: str
    at: datetime
    lease_epoch: int
    trace_id: UUID
    details: dict[str, Any]
    item: Item  # as it stood right after the event ("event"), or for an older event as it is now
    item_as_of: Literal["event", "now"]
    cursor: Position  # read on after this to get the events after this one

    @property
    def type(self) -> str:
        return TYPES[self.event]

    @property
    def webhook_id(self) -> str:
        """Standard Webhooks' `webhook-id`: the same for every delivery of this event."""
        return f"evt_{self.id}"


@dataclass(frozen=True, slots=True)
class FeedPage:
    events: list[FeedEvent]
    next: Position  # where the walk got to (the cursor passed in when nothing new)


_EVENT_FIELDS = "f.id, f.item_id, f.event, f.actor, f.at, f.lease_epoch, f.trace_id, f.details, f.item_after"

# Positions from the cursor, below xmin, on ix_review_queue_event_xid_id; for each, what it
# serves (the rules above, on ix_review_queue_event_item_id_id), filtered by event; then one
# marker row (no event) for the last position looked at.
_PAGE = text(
    f"""
    WITH positions AS MATERIALIZED (
        SELECT e.xid, e.id, e.item_id FROM review_queue_event e
        WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
          AND (e.xid, e.id) > (CAST(:xid AS xid8), :id)
        ORDER BY e.xid, e.id
        LIMIT :scan
    ),
    served AS (
        SELECT p.xid AS p_xid, p.id AS p_id, f.*
        FROM positions p
        CROSS JOIN LATERAL (
            SELECT coalesce(
                (SELECT b.id FROM review_queue_event b
                 WHERE b.item_id = p.item_id AND b.id < p.id AND b.xid <= p.xid
                 ORDER BY b.id DESC LIMIT 1), 0) AS barrier
        ) AS b
        -- In a select list, EXISTS stays a per-position index probe; as a WHERE NOT EXISTS the
        -- planner may make it an anti join over the whole table.
        CROSS JOIN LATERAL (
            SELECT EXISTS (
                SELECT FROM review_queue_event g
                WHERE g.item_id = p.item_id AND g.id > p.id AND g.xid < p.xid
            ) AS early
        ) AS s
        -- OFFSET 0 keeps this a per-position lookup on (item_id, id): pulled up into a join, a
        -- selective filter on the event makes the planner scan the whole table instead.
        CROSS JOIN LATERAL (
            SELECT {_EVENT_FIELDS} FROM review_queue_event f
            WHERE f.item_id = p.item_id AND f.id > b.barrier AND f.id <= p.id
              AND (CAST(:types AS text[]) IS NULL OR f.event = ANY(CAST(:types AS text[])))
            OFFSET 0
        ) AS f
        WHERE NOT s.early
    )
    SELECT page.p_xid::text AS position_xid, page.p_id AS position_id,
           id, item_id, event, actor, at, lease_epoch, trace_id, details, item_after FROM (
        SELECT * FROM served
        UNION ALL
        (SELECT xid, id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM positions
         ORDER BY xid DESC, id DESC LIMIT 1)
    ) AS page
    ORDER BY page.p_xid, page.p_id, page.id NULLS LAST  -- xid8, not its text
    """
).bindparams(bindparam("types", type_=ARRAY(Text)))

_ITEM_FIELDS = [f.name for f in dataclasses.fields(Item)]
_ITEMS = text(f"SELECT {', '.join(_ITEM_FIELDS)} FROM review_queue_item WHERE id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(SA_UUID(as_uuid=True)))
)


async def read(
    conn: AsyncConnection, *, after: Position, limit: int, events: Sequence[str] | None = None
) -> FeedPage:
    """Up to `limit` events after `after` (whole positions: one position that serves several
    events may go over), only of the named `events` when given, each with its item as it stood
    right after the event."""
    scan = limit if events is None else max(limit, FILTERED_SCAN)
    params = {"xid": str(after.xid), "id": after.id, "scan": scan, "types": list(events) if events else None}
    rows = (await conn.execute(_PAGE, params)).all()
    # Rows come by position (the marker last); a position's events stay together on one page.
    by_position: list[tuple[Position, list[tuple[Any, ...]]]] = []
    reached = after
    for row in rows:
        position = Position(int(row[0]), int(row[1]))
        if row[2] is None:
            reached = position
            continue
        if not by_position or by_position[-1][0] != position:
            by_position.append((position, []))
        by_position[-1][1].append(tuple(row[2:]))
    taken: list[tuple[Position, Position, tuple[Any, ...]]] = []  # (position, cursor, event)
    previous = after
    for position, served in by_position:
        if taken and len(taken) + len(served) > limit:
            reached = previous
            break
        # Only the position's last event may carry the position: resuming after an earlier one
        # must serve the rest of the position again.
        for n, fields in enumerate(served):
            taken.append((position, position if n == len(served) - 1 else previous, fields))
        previous = position
    items = await _items(conn, {fields[1] for _, _, fields in taken})
    return FeedPage(events=[_event(fields, items, cursor) for _, cursor, fields in taken], next=reached)


_BY_ID = text(f"SELECT {_EVENT_FIELDS} FROM review_queue_event f WHERE f.id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(BigInteger))
)


async def events_by_id(conn: AsyncConnection, ids: Sequence[int]) -> dict[int, FeedEvent]:
    """These events, each with its item as it stood right after it (a retry says what happened
    then, however the item has moved on since), for a webhook retry of an event the cursor has
    passed (their `cursor` is START: a retry never moves a cursor)."""
    if not ids:
        return {}
    rows = (await conn.execute(_BY_ID, {"ids": list(ids)})).all()
    items = await _items(conn, {row[1] for row in rows})
    return {row[0]: _event(tuple(row), items, START) for row in rows}


def _event(fields: tuple[Any, ...], items: Mapping[UUID, Item], cursor: Position) -> FeedEvent:
    """An event row (its fields, then item_after) with its item: the row's changeable columns from
    item_after, the ones that never change from the item's row; an event written before issue 42
    has no item_after, and gets its item as it is now."""
    id_, item_id, name, actor, at, lease_epoch, trace_id, details, after = fields
    current = items[item_id]
    return FeedEvent(
        id=id_,
        item_id=item_id,
        event=name,
        actor=actor,
        at=at,
        lease_epoch=lease_epoch,
        trace_id=trace_id,
        details=details,
        item=current if after is None else as_it_stood(current, after, lease_epoch=lease_epoch),
        item_as_of="now" if after is None else "event",
        cursor=cursor,
    )


_TIMES = frozenset({"leased_at", "lease_expires_at", "resolved_at", "prepared_at", "approved_at"})


def as_it_stood(current: Item, after: Sequence[Any], *, lease_epoch: int) -> Item:
    """The item an event's item_after describes (a jsonb array in AFTER_FIELDS order: the amount as
    text, times as ISO 8601); never a lease token, whoever reads."""
    values: dict[str, Any] = {}
    for n, name in enumerate(AFTER_FIELDS):
        value = after[n] if n < len(after) else None
        if value is not None and name in _TIMES:
            value = datetime.fromisoformat(value)
        elif value is not None and name == "variance_amount":
            value = Decimal(value)
        values[name] = value
    return dataclasses.replace(current, **values, lease_epoch=lease_epoch, lease_nonce=None)


async def _items(conn: AsyncConnection, ids: set[UUID]) -> dict[UUID, Item]:
    if not ids:
        return {}
    rows = await conn.execute(_ITEMS, {"ids": list(ids)})
    return {row.id: Item(**dict(row._mapping)) for row in rows}


# e.xid, qualified: a bare `xid` in ORDER BY names the output column `xid::text`, and as text
# "99999" sorts after "100000", so the head stuck there once the cluster's xids crossed a power of
# ten, and every long-poll at the head waited out its wait_s (api/feed_watch.py).
_HEAD = text(
    "SELECT e.xid::text, e.id FROM review_queue_event e"
    " WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY e.xid DESC, e.id DESC LIMIT 1"
)


async def head(conn: AsyncConnection) -> Position:
    """The last position a walk can reach now: a subscription created now starts here."""
    row = (await conn.execute(_HEAD)).first()
    return START if row is None else Position(int(row[0]), int(row[1]))
