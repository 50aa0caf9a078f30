"""Leases: hand out the oldest pending items to the caller."""

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Body

from api.deps import Conn, Reviewer, SettingsDep
from api.routing import QueueRoute
from api.schemas import ItemOut, LeaseIn, LeaseOut
from db import queue

router = APIRouter(route_class=QueueRoute, tags=["leases"])


@router.post("/leases", operation_id="leaseItems", summary="Lease pending items")
async def lease(
    conn: Conn,
    principal: Reviewer,
    settings: SettingsDep,
    body: Annotated[LeaseIn | None, Body()] = None,
) -> LeaseOut:
    """Lease up to `batch_size` pending items, oldest first; an empty list when none are pending.

    Each item carries its `lease_token`. You never hold more than
    REVIEW_QUEUE_MAX_LEASES_PER_REVIEWER items at once: at the cap the list is empty.
    """
    batch_size = body.batch_size if body and body.batch_size else settings.batch_size
    items = await queue.lease_items(
        conn,
        reviewer=principal.subject,
        batch_size=batch_size,
        lease_duration=timedelta(milliseconds=settings.lock_timeout_ms),
        cap=settings.max_leases_per_reviewer,
    )
    return LeaseOut(items=[ItemOut.of(i, principal.subject) for i in items])
