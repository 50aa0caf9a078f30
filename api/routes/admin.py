"""Operator actions: reclaim abandoned leases now."""

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Body

from api.deps import Admin, Conn, SettingsDep
from api.routing import QueueRoute
from api.schemas import ReclaimedOut, ReclaimIn, ReclaimOut
from db import queue

router = APIRouter(route_class=QueueRoute, tags=["admin"])


@router.post("/admin/reclaim")
async def reclaim(
    conn: Conn,
    principal: Admin,
    settings: SettingsDep,
    body: Annotated[ReclaimIn | None, Body()] = None,
) -> ReclaimOut:
    """Return leases expired for longer than `reclaim_after_s` to the queue, oldest expiry first."""
    reclaimed = await queue.reclaim_expired(
        conn,
        reclaim_batch=(body or ReclaimIn()).reclaim_batch,
        grace=timedelta(seconds=settings.reclaim_after_s),
        actor=principal.subject,
        max_attempts=settings.max_attempts,
    )
    return ReclaimOut(reclaimed=len(reclaimed), items=[ReclaimedOut.model_validate(r) for r in reclaimed])
