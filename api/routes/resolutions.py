"""The resolution catalogue: what a completion may say, and which codes need an approver."""

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from api.deps import Admin, AnyRole, Conn, SettingsDep, Work
from api.routing import QueueRoute
from api.schemas import (
    ResolutionCodeIn,
    ResolutionCodeOut,
    ResolutionPolicyIn,
    ResolutionPolicyOut,
    ResolutionsOut,
)
from api.settings import Settings
from db import catalogue, queue

router = APIRouter(route_class=QueueRoute, tags=["resolutions"])

Code = Annotated[
    str,
    Path(
        pattern=r"^[A-Z][A-Z0-9_]{0,63}$",
        description="The code: A-Z, 0-9 and _, starting with a letter, at most 64 characters.",
    ),
]


@router.get("/resolutions", operation_id="listResolutions", summary="List the active resolution codes")
async def list_resolutions(unit: Work, _: AnyRole) -> ResolutionsOut:
    """The codes a completion may use, with their note rule and approval threshold (any role)."""
    codes = await queue.list_resolution_codes(unit)
    return ResolutionsOut(resolutions=[ResolutionCodeOut.model_validate(c) for c in codes])


def _policy_out(policy: catalogue.ApprovalPolicy, settings: Settings) -> ResolutionPolicyOut:
    return ResolutionPolicyOut(
        materiality_threshold=policy.materiality_threshold,
        updated_at=policy.updated_at,
        updated_by=policy.updated_by,
        base_currency=settings.base_currency,
    )


# Before /resolutions/{code}: FastAPI tries routes in order, and `policy` is a path segment too.
@router.get(
    "/resolutions/policy",
    operation_id="getResolutionPolicy",
    summary="Read the catalogue-wide approval policy",
)
async def get_policy(conn: Conn, _: AnyRole, settings: SettingsDep) -> ResolutionPolicyOut:
    """Materiality: the amount from which every completion needs an approver, whatever its code
    (unless the code's own approval_threshold is lower), and the base currency. Any role."""
    return _policy_out(await catalogue.get_policy(conn), settings)


@router.put(
    "/resolutions/policy",
    operation_id="putResolutionPolicy",
    summary="Set the catalogue-wide approval policy (admin)",
)
async def put_policy(
    body: ResolutionPolicyIn, conn: Conn, principal: Admin, settings: SettingsDep
) -> ResolutionPolicyOut:
    """Set the materiality threshold. The completion statement reads it, so a completion committed
    meanwhile is wholly before or after the change; the row keeps who changed it and when."""
    saved = await catalogue.put_policy(
        conn, materiality_threshold=body.materiality_threshold, actor=principal.subject
    )
    return _policy_out(saved, settings)


@router.put(
    "/resolutions/{code}",
    operation_id="putResolution",
    summary="Create or update a resolution code (admin)",
    responses={201: {"model": ResolutionCodeOut, "description": "The code was created."}},
)
async def put_resolution(
    code: Code, body: ResolutionCodeIn, unit: Work, _: Admin, response: Response
) -> ResolutionCodeOut:
    """Create (201) or replace (200) a code. Codes are never deleted: send `active: false` to
    deactivate one, and old decisions keep their meaning."""
    created, saved = await queue.put_resolution_code(unit, code=code, **body.model_dump())
    if created:
        response.status_code = status.HTTP_201_CREATED
    return ResolutionCodeOut.model_validate(saved)
