"""Evidence for auditors: the hash chain's events as NDJSON, in chain order (docs/audit.md)."""

import logging
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from api.deps import Auditor, request_transaction
from api.errors import problem_responses
from api.routing import QueueRoute
from db import audit
from db.errors import classify

router = APIRouter(route_class=QueueRoute, tags=["audit"])
log = logging.getLogger("review_queue.api")

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
    verifies on its own. Seqs moved to files by `review-queue archive` are not in the database: an
    export asked to start among them starts after the last archived seq (each line names its seq)."""
    # Like every query route: a typo is an answer, not a silently ignored filter.
    unknown = sorted(set(request.query_params) - {"from", "to"})
    if unknown:
        raise RequestValidationError(
            [
                {"loc": ("query", name), "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
                for name in unknown
            ]
        )
    # Not the request's `Conn`, and no transaction held while the client reads: pages of the chain,
    # each read in a short transaction of its own and sent before the next is read, so a client
    # that stops reading costs a socket and one page of memory, never a pooled connection (20
    # auditors who stopped reading once held the whole pool). The first page is read before the
    # answer, so a database that is away is still a 503.
    async with request_transaction(request) as conn:
        await audit.one_snapshot(conn)
        position = await audit.export_start(conn, first=first, last=last)
        page, after = await audit.export_page(conn, at=position)

    async def body() -> AsyncIterator[bytes]:
        chunk, at = page, after
        while True:
            if chunk:
                yield chunk
            if at is None:
                return
            # Read to its end even if the client leaves meanwhile, so that its connection goes back
            # to the pool (a cancelled close would leave it to the garbage collector).
            with anyio.CancelScope(shield=True):
                chunk, at = await _next_page(request, at)

    return StreamingResponse(body(), media_type=NDJSON)


PAGE_ATTEMPTS = 3


async def _next_page(request: Request, at: audit.ExportPosition) -> tuple[bytes, audit.ExportPosition | None]:
    """A page, in a transaction of its own. The answer has begun, so a database that is busy (the
    pool exhausted, a lock or statement timeout) is tried again a few times rather than turned
    into a 503; if it stays away, the stream is cut off without its final chunk, which clients see
    as an incomplete transfer (docs/audit.md: resume with from=<the last seq received + 1>)."""
    for attempt in range(1, PAGE_ATTEMPTS + 1):
        try:
            async with request_transaction(request) as conn:
                return await audit.export_page(conn, at=at)
        except Exception as error:
            reason = classify(error)
            if reason is None or attempt == PAGE_ATTEMPTS:
                log.warning("audit_export_cut_off", extra={"after_seq": at.after, "reason": reason})
                raise
            await anyio.sleep(0.5 * attempt)
    raise AssertionError("unreachable")
