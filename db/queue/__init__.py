"""The queue's statements: enqueue, lease, renew, release, complete, reclaim, read.

Each state change is ONE statement. A lease or reclaim that first SELECTs and then UPDATEs
from the application reopens the window in which two workers take the same row (the
seed's DOUBLE_LEASE); here the row lock, the guard, the write and its audit event are one
round trip. A data-modifying CTE inserts the event from the UPDATE's RETURNING, so a state
change without its event, or an event without its change, cannot exist.

Functions take the connection first and never commit: the caller owns the transaction.

One module per stage of the item's life, each importing the shared pieces from `rows`:
`rows` (the Item, its states and columns, the guards and event CTEs every statement shares),
`enqueue`, `lease` (lease, renew, release, reclaim), `completion`, `approval`, `admin`
(requeue, reopen, release and reassign by an admin), `revision`, `catalogue` (resolution codes)
and `reads`. Callers use `from db import queue` and `queue.<name>`: the public names are here.
"""

from db.queue.admin import (
    Overridden,
    ReassignOutcome,
    ReopenOutcome,
    RequeueOutcome,
    admin_release_item,
    admin_release_reviewer,
    reassign_item,
    reopen_item,
    requeue_item,
)
from db.queue.approval import ApprovalOutcome, approve_item, reject_item
from db.queue.catalogue import (
    ResolutionCode,
    deactivate_resolution_code,
    get_resolution_code,
    list_resolution_codes,
    put_resolution_code,
)
from db.queue.comments import comment_on_item
from db.queue.completion import (
    CompleteOutcome,
    Completion,
    complete_item,
    complete_items,
    source_changed,
)
from db.queue.enqueue import EnqueueOutcome, NewItem, enqueue_item, enqueue_items
from db.queue.lease import (
    HolderOutcome,
    Reclaimed,
    lease_items,
    reclaim_expired,
    release_lease,
    renew_lease,
)
from db.queue.reads import (
    DECISION_EVENTS,
    Decision,
    Event,
    ItemFilter,
    ListOrder,
    LostLease,
    decisions,
    get_item,
    item_events,
    list_items,
    list_query,
    lost_leases,
)
from db.queue.revision import Revision, RevisionOutcome, revise_item
from db.queue.rows import (
    ASSIGNED,
    AWAITING_APPROVAL,
    PENDING,
    QUARANTINED,
    RESOLVED,
    Item,
    Queue,
)

__all__ = [
    "ASSIGNED",
    "AWAITING_APPROVAL",
    "DECISION_EVENTS",
    "PENDING",
    "QUARANTINED",
    "RESOLVED",
    "ApprovalOutcome",
    "CompleteOutcome",
    "Completion",
    "Decision",
    "EnqueueOutcome",
    "Event",
    "HolderOutcome",
    "Item",
    "ItemFilter",
    "ListOrder",
    "LostLease",
    "NewItem",
    "Overridden",
    "Queue",
    "ReassignOutcome",
    "Reclaimed",
    "ReopenOutcome",
    "RequeueOutcome",
    "ResolutionCode",
    "Revision",
    "RevisionOutcome",
    "admin_release_item",
    "admin_release_reviewer",
    "approve_item",
    "comment_on_item",
    "complete_item",
    "complete_items",
    "deactivate_resolution_code",
    "decisions",
    "enqueue_item",
    "enqueue_items",
    "get_item",
    "get_resolution_code",
    "item_events",
    "lease_items",
    "list_items",
    "list_query",
    "list_resolution_codes",
    "lost_leases",
    "put_resolution_code",
    "reassign_item",
    "reclaim_expired",
    "reject_item",
    "release_lease",
    "renew_lease",
    "reopen_item",
    "requeue_item",
    "revise_item",
    "source_changed",
]
