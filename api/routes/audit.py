"""Evidence for auditors: the hash chain's events as NDJSON, in chain order (docs/audit.md)."""

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from api.deps import Auditor, request_transaction
from api.errors import problem_responses
from api.routing import QueueRoute
from db import audit

router = APIRouter(route_class=QueueRoute, tags=["audit"])

BIGINT_MAX = 2**63 - 1
NDJSON = "application/x-ndjson"


@router.get(
    "/audit/export",
    operation_id="exportAudit",
    summary="Export the audit hash chain as NDJSON",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {NDJSON: {"schema": {"type": "string"}}},
            "description": "One JSON object per line: seq, prev_hash, hash and the event, in chain order.",
        },
        **problem_responses("UNAUTHENTICATED", "FORBIDDEN", "VALIDATION_ERROR", "DATABASE_UNAVAILABLE"),
    },
)
async def export(
    request: Request,
    _: Auditor,
    first: Annotated[int, Query(alias="from", ge=1, le=BIGINT_MAX, description="First seq.")] = 1,
    last: Annotated[
        int, Query(alias="to", ge=1, le=BIGINT_MAX, description="Last seq (default: the head).")
    ] = BIGINT_MAX,
) -> StreamingResponse:
    """Stream the chain from seq `from` to `to` (roles auditor, admin); verify it offline with
    `review-queue audit verify --file`. Each line carries the hash it links to, so a range
    verifies on its own."""
    # Like every query route: a typo is an answer, not a silently ignored filter.
    unknown = sorted(set(request.query_params) - {"from", "to"})
    if unknown:
        raise RequestValidationError(
            [
                {"loc": ("query", name), "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
                for name in unknown
            ]
        )
    # Not the request's `Conn`: that transaction commits before the response is sent, and this
    # body is read after. The stream has its own connection and transaction, opened here (so a
    # database that is away is still a 503) and closed when the last line is sent.
    stack = AsyncExitStack()
    conn = await stack.enter_async_context(request_transaction(request))
    try:
        previous = await audit.link_into(conn, first=first)
    except BaseException:
        await stack.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in audit.export_ndjson(conn, first=first, last=last, previous=previous):
                yield chunk
        finally:
            # A client that goes away cancels the stream; the connection still goes back to the
            # pool (its transaction rolled back) rather than to the garbage collector.
            with anyio.CancelScope(shield=True):
                await stack.aclose()

    return StreamingResponse(body(), media_type=NDJSON)
