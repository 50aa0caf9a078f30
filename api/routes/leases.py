"""Leases: hand out the oldest pending items to the caller, waiting for work when asked to."""

import asyncio
from datetime import timedelta
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Request

from api.deps import APPROVER_ROLES, Reviewer, SettingsDep, one_round_trip
from api.errors import ProblemError
from api.routing import QueueRoute
from api.schemas import ItemOut, LeaseIn, LeaseOut
from api.settings import Settings
from db import queue
from db.notify import WorkSignal

router = APIRouter(route_class=QueueRoute, tags=["leases"])


async def _lease_once(
    request: Request,
    settings: Settings,
    reviewer: str,
    batch_size: int,
    ledger_entity: str | None,
    which: queue.Queue,
    item_id: UUID | None,
    role: str,
) -> list[queue.Item]:
    # Not the Conn dependency (it holds one transaction for the whole request): each attempt is
    # its own short transaction, committed before the next wait, so a waiting request holds no
    # pooled connection and no transaction. The lock and the lease go in one round trip.
    return await queue.lease_items(
        one_round_trip(request),
        reviewer=reviewer,
        batch_size=batch_size,
        lease_duration=timedelta(milliseconds=settings.lock_timeout_ms),
        cap=settings.max_leases_per_reviewer,
        ledger_entity=ledger_entity,
        queue=which,
        item_id=item_id,
        override_return=role == "admin",
    )


async def _disconnected(request: Request) -> None:
    """Return when the client goes away. The body has been read, so the next ASGI message is
    http.disconnect (uvicorn sends it as soon as the socket closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.post("/leases", operation_id="leaseItems", summary="Lease pending items")
async def lease(
    request: Request,
    principal: Reviewer,
    settings: SettingsDep,
    body: Annotated[LeaseIn | None, Body()] = None,
) -> LeaseOut:
    """Lease up to `batch_size` pending items, earliest `due_at` first, then oldest; an empty list when
    none are pending. With `ledger_entity`, only that entity's items.

    With `queue: "approval"` (roles approver, admin) the items are proposals awaiting approval that
    someone else prepared; they stay AWAITING_APPROVAL while you hold them, and go back to the
    approval queue (never to PENDING) when released or reclaimed. Approve or reject them.

    With `item_id`, exactly that item, if it can be leased by you now (PENDING, or for the approval
    queue someone else's unheld proposal; you are under the cap): the same statement and guards, and
    an empty list otherwise. A reviewer who releases an item is not handed it again by their own
    leases for REVIEW_QUEUE_RELEASE_COOLDOWN_S (others get it in its old place); naming it by
    `item_id` takes it back. A proposal an approver rejected is returned to its preparer for
    REVIEW_QUEUE_REJECTED_RETURN_S: their lease gets it ahead of due order, and nobody else's lease
    takes it (named by `item_id`, an admin's does); then anyone's, in its due-date place.

    With `wait_s`, a call that finds nothing waits up to that many seconds and answers as soon as
    something can be leased (woken by PostgreSQL LISTEN/NOTIFY on enqueue, release and reclaim).
    Each item carries its `lease_token`. You never hold more than
    REVIEW_QUEUE_MAX_LEASES_PER_REVIEWER items at once: at the cap the list is empty.
    """
    body = body or LeaseIn()
    if body.queue == "approval" and principal.role not in APPROVER_ROLES:
        raise ProblemError(
            "FORBIDDEN",
            f"role {principal.role!r} may not lease from the approval queue; needs one of approver, admin",
            extra={"required_roles": list(APPROVER_ROLES)},
        )
    batch_size = body.batch_size or settings.batch_size
    signal: WorkSignal = request.app.state.work_signal
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait_s
    gone: asyncio.Task[None] | None = None
    try:
        while True:
            seen = signal.generation  # before the attempt: a wake-up during it is not lost
            # Every attempt applies the entity filter: work of another entity wakes the wait, but
            # is not handed out, and the wait goes on.
            items = await _lease_once(
                request,
                settings,
                principal.subject,
                batch_size,
                body.ledger_entity,
                body.queue,
                body.item_id,
                principal.role,
            )
            remaining = deadline - loop.time()
            if items or remaining <= 0:
                break
            gone = gone or asyncio.ensure_future(_disconnected(request))
            woken = asyncio.ensure_future(signal.wait(seen, remaining))
            await asyncio.wait({woken, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                woken.cancel()
                break  # nobody to hand items to: lease nothing more
    finally:
        if gone is not None:
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
    return LeaseOut(items=[ItemOut.of(i, principal.subject) for i in items])
