"""Comments: a note on an item's trail (issue 42). A COMMENTED event, chained like every event;
the item itself is not touched."""

from functools import partial
from uuid import UUID

from sqlalchemy import Text, bindparam, func, insert, literal_column, select

from db import telemetry
from db.queue.reads import _EVENT_COLUMNS, Event
from db.queue.rows import item_after
from db.tables import review_queue_event as event
from db.tables import review_queue_item as item
from db.unit import Unit

# One statement: the event takes the item's epoch and trace id; no row of the item is locked or
# written, so a comment never waits for a lease, a completion or an approval in flight.
_COMMENT = (
    insert(event)
    .from_select(
        ["item_id", "event", "actor", "lease_epoch", "trace_id", "details", "item_after"],
        select(
            item.c.id,
            literal_column("'COMMENTED'", Text),
            bindparam("actor", type_=Text),
            item.c.lease_epoch,
            item.c.trace_id,
            func.jsonb_build_object("text", bindparam("text", type_=Text)),
            item_after(item.c),  # unchanged by the comment: as the statement reads it
        ).where(item.c.id == bindparam("item_id")),
    )
    .returning(*_EVENT_COLUMNS)
)


async def comment_on_item(unit: Unit, *, item_id: UUID, actor: str, text: str) -> Event | None:
    """Append a COMMENTED event with `text` to the item's trail; None when there is no such item."""
    rows = await unit.execute(_COMMENT, {"item_id": item_id, "actor": actor, "text": text})
    if not rows:
        return None
    comment = Event(*rows[0].values())
    unit.after_commit(partial(telemetry.commented, comment))
    return comment
