"""Items: enqueue, read, complete."""

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Response, status

from api.deps import AnyRole, Conn, Ingest, Reviewer
from api.errors import ProblemError
from api.routing import QueueRoute
from api.schemas import CompleteIn, CompleteOut, ItemIn, ItemOut
from db import queue

router = APIRouter(route_class=QueueRoute, tags=["items"])

ItemId = Annotated[UUID, Path(description="The item's id (a UUID).")]


@router.post(
    "/items",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ItemOut, "description": "The same key and payload arrived before."}},
)
async def enqueue(body: ItemIn, conn: Conn, _: Ingest, response: Response) -> ItemOut:
    """Enqueue an item for review; idempotent on `idempotency_key`."""
    outcome, item = await queue.enqueue_item(conn, new=queue.NewItem(**body.model_dump()))
    if outcome == "conflict":
        raise ProblemError(
            "IDEMPOTENCY_CONFLICT",
            f"idempotency_key {body.idempotency_key!r} exists with a different payload",
            extra={"item_id": str(item.id)},
        )
    if outcome == "existing":
        response.status_code = status.HTTP_200_OK
    return ItemOut.model_validate(item)


@router.get("/items/{item_id}")
async def get_item(item_id: ItemId, conn: Conn, _: AnyRole) -> ItemOut:
    item = await queue.get_item(conn, item_id=item_id)
    if item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    return ItemOut.model_validate(item)


@router.post("/items/{item_id}/complete")
async def complete(item_id: ItemId, body: CompleteIn, conn: Conn, principal: Reviewer) -> CompleteOut:
    """Resolve an item you hold. A retry with the same resolution answers `already_resolved`."""
    outcome, item = await queue.complete_item(
        conn, item_id=item_id, reviewer=principal.subject, resolution=body.resolution, note=body.note
    )
    if outcome == "not_found" or item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    if outcome == "resolution_conflict":
        raise ProblemError(
            "RESOLUTION_CONFLICT",
            f"you already resolved this item as {item.resolution}, not {body.resolution}",
        )
    if outcome == "lease_not_held":
        raise ProblemError("LEASE_NOT_HELD", f"you do not hold the lease on item {item_id}")
    return CompleteOut(outcome=outcome, item=ItemOut.model_validate(item))
