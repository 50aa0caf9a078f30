"""The resolution catalogue: what a completion may say, and which codes need an approver."""

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from api.deps import Admin, AnyRole, Conn
from api.routing import QueueRoute
from api.schemas import ResolutionCodeIn, ResolutionCodeOut, ResolutionsOut
from db import queue

router = APIRouter(route_class=QueueRoute, tags=["resolutions"])

Code = Annotated[
    str,
    Path(
        pattern=r"^[A-Z][A-Z0-9_]{0,63}$",
        description="The code: A-Z, 0-9 and _, starting with a letter, at most 64 characters.",
    ),
]


@router.get("/resolutions", operation_id="listResolutions", summary="List the active resolution codes")
async def list_resolutions(conn: Conn, _: AnyRole) -> ResolutionsOut:
    """The codes a completion may use, with their note rule and approval threshold (any role)."""
    codes = await queue.list_resolution_codes(conn)
    return ResolutionsOut(resolutions=[ResolutionCodeOut.model_validate(c) for c in codes])


@router.put(
    "/resolutions/{code}",
    operation_id="putResolution",
    summary="Create or update a resolution code (admin)",
    responses={201: {"model": ResolutionCodeOut, "description": "The code was created."}},
)
async def put_resolution(
    code: Code, body: ResolutionCodeIn, conn: Conn, _: Admin, response: Response
) -> ResolutionCodeOut:
    """Create (201) or replace (200) a code. Codes are never deleted: send `active: false` to
    deactivate one, and old decisions keep their meaning."""
    created, saved = await queue.put_resolution_code(conn, code=code, **body.model_dump())
    if created:
        response.status_code = status.HTTP_201_CREATED
    return ResolutionCodeOut.model_validate(saved)
