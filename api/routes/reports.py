"""The controller's reports: SLA attainment, throughput, backlog, and the decisions export
(docs/reports.md defines every figure). Reviewers and approvers read their own throughput only."""

import asyncio
import csv
import io
import logging
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse

from api.deps import Auditor, ReadConn, StatsReader, request_read_transaction
from api.errors import problem_responses
from api.routing import QueueRoute
from api.schemas import (
    MAX_BUCKETS,
    BacklogFiguresOut,
    BacklogOut,
    BacklogPointOut,
    BacklogQuery,
    BucketQuery,
    DecisionRowOut,
    DecisionsQuery,
    PeriodQuery,
    SlaBucketOut,
    SlaFiguresOut,
    SlaOut,
    SlaQuery,
    ThroughputOut,
    period_rules,
)
from api.schemas.money import amount_text
from db import reports

log = logging.getLogger("review_queue.api")
router = APIRouter(route_class=QueueRoute, tags=["reports"])

CSV = "text/csv"
NDJSON = "application/x-ndjson"
# Everyone may see their own throughput; the other reports are the controller's and the auditor's.
OWN_ROWS_ONLY = ("reviewer", "approver")


def _refuse(field: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("query", field), "msg": message, "type": "value_error"}])


def _period(query: PeriodQuery, bucket: str = "day", *, limit: bool = True) -> reports.Period:
    """The query's period, or a 422 naming the parameter: the rules across parameters that a JSON
    Schema cannot state (docs/reports.md, "Periods")."""
    start, end = query.from_, query.to
    if end <= start:
        raise _refuse("to", f"must be after from ({start.isoformat()})")
    step = 7 if bucket == "week" else 1
    if step == 7:
        for field, day in (("from", start), ("to", end)):
            if day.weekday() != 0:
                raise _refuse(field, f"week buckets run Monday to Monday; {day.isoformat()} is a {day:%A}")
    buckets = (end - start).days // step
    if limit and buckets > MAX_BUCKETS[bucket]:
        raise _refuse("to", f"at most {MAX_BUCKETS[bucket]} {bucket} buckets in one report, not {buckets}")
    return reports.Period(start, end, query.tz, step)


async def _computed(query: PeriodQuery, compute: Callable[[], Any]) -> Any:
    try:
        return await compute()
    except reports.UnknownTimeZone:
        # Python's tz database knows the name (the query model checked) and PostgreSQL's does not.
        raise _refuse("tz", f"PostgreSQL does not know the time zone {query.tz!r}") from None


def _report(query: PeriodQuery, bucket: str, as_of: Any) -> dict[str, Any]:
    return {"from_": query.from_, "to": query.to, "tz": query.tz, "bucket": bucket, "as_of": as_of}


@router.get(
    "/reports/sla",
    operation_id="getSlaReport",
    openapi_extra=period_rules("day", "week"),
    summary="SLA attainment per day or week",
    responses=problem_responses("VALIDATION_ERROR"),
)
async def sla_report(query: Annotated[SlaQuery, Query()], conn: ReadConn, _: Auditor) -> SlaOut:
    """Per bucket: the items that fell due in it, resolved on time, resolved late, still open past
    due, and the attainment (on time / fell due). Roles auditor and admin."""
    period = _period(query, query.bucket)
    entity = query.ledger_entity
    report = await _computed(query, lambda: reports.sla(conn, period=period, ledger_entity=entity))
    return SlaOut(
        **_report(query, query.bucket, report.as_of),
        ledger_entity=query.ledger_entity,
        buckets=[SlaBucketOut.model_validate(b, from_attributes=True) for b in report.buckets],
        total=SlaFiguresOut.model_validate(report.total, from_attributes=True),
    )


@router.get(
    "/reports/throughput",
    operation_id="getThroughputReport",
    openapi_extra=period_rules("day", "week"),
    summary="Decisions per reviewer per day or week",
    responses=problem_responses("VALIDATION_ERROR"),
    response_model=ThroughputOut,
)
async def throughput_report(
    query: Annotated[BucketQuery, Query()], conn: ReadConn, principal: StatsReader
) -> Response:
    """Per bucket and reviewer: decisions by outcome, the holder's releases apart (a release is not
    a decision), and the median and 90th percentile of the time from lease to decision. Roles
    auditor and admin see every reviewer; reviewers and approvers see their own rows only."""
    period = _period(query, query.bucket)
    own = principal.subject if principal.role in OWN_ROWS_ONLY else None
    rows, as_of = await _computed(query, lambda: reports.throughput_json(conn, period=period, reviewer=own))
    # A year of days at 40 reviewers is 16,000 rows: PostgreSQL writes them as JSON (in
    # ThroughputRowOut's shape; tests/integration/api/test_reports.py holds them to what the
    # model would send),
    # and they are set into the envelope, which is the model's, as the last field.
    envelope = ThroughputOut(**_report(query, query.bucket, as_of), reviewer=own, rows=[])
    body = envelope.model_dump_json(by_alias=True)
    return Response(body.removesuffix("[]}") + rows + "}", media_type="application/json")


@router.get(
    "/reports/backlog",
    operation_id="getBacklogReport",
    openapi_extra=period_rules("day"),
    summary="Open items by age at the end of each day",
    responses=problem_responses("VALIDATION_ERROR"),
)
async def backlog_report(query: Annotated[BacklogQuery, Query()], conn: ReadConn, _: Auditor) -> BacklogOut:
    """Per day that has begun: the items open at its end (or now, for today), by age since enqueue;
    with `by=currency`, also split by the currency each item had then. Rebuilt from the event trail,
    so it is true for the past. Roles auditor and admin."""
    period = _period(query, "day")
    split = query.by == "currency"
    report = await _computed(query, lambda: reports.backlog(conn, period=period, by_currency=split))

    def bands(counts: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(reports.AGE_BANDS, counts, strict=True))

    return BacklogOut(
        **_report(query, "day", report.as_of),
        by=query.by,
        bands=list(reports.AGE_BANDS),
        points=[
            BacklogPointOut(
                start=p.start,
                at=p.at,
                open=p.open,
                by_age=bands(p.by_age),
                by_currency=None
                if p.by_currency is None
                else {
                    code: BacklogFiguresOut(open=sum(counts), by_age=bands(counts))
                    for code, counts in p.by_currency.items()
                },
            )
            for p in report.points
        ],
    )


# --- the decisions export ----------------------------------------------------------------------

COLUMNS = list(DecisionRowOut.model_fields)
# A cell a spreadsheet would run as a formula (or whose leading tab or CR it would eat) gets a
# leading apostrophe, as OWASP advises; a plain decimal number (a negative amount) stays a number.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def spreadsheet_safe(cell: str) -> str:
    if cell.startswith(_FORMULA_START) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"  # as in the NDJSON
    return spreadsheet_safe(str(value))


def _csv_lines(rows: list[dict[str, Any]], *, header: bool) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)  # RFC 4180: quoted when needed, CRLF line ends
    if header:
        writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[c]) for c in COLUMNS])
    return out.getvalue().encode()


def _ndjson_lines(rows: list[dict[str, Any]], *, header: bool) -> bytes:
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _plain(page: list[reports.Decision]) -> list[dict[str, Any]]:
    """Each decision as DecisionRowOut writes it (amounts with their currency's decimals, instants
    RFC 3339 in UTC), without building a model per row: the export's rows are many."""
    return [
        {
            "event_id": d.event_id,
            "item_id": str(d.item_id),
            "idempotency_key": d.idempotency_key,
            "ledger_entity": d.ledger_entity,
            "variance_amount": amount_text(d.variance_amount, d.currency),
            "currency": d.currency,
            "match_decision": d.match_decision,
            "resolution": d.resolution,
            "note": d.note,
            "resolved_by": d.resolved_by,
            "resolved_at": _instant(d.resolved_at),
            "approved_by": d.approved_by,
            "approved_at": _instant(d.approved_at),
            "due_at": _instant(d.due_at),
            "on_time": d.on_time,
            "reopened_at": _instant(d.reopened_at),
            "rate": d.rate,
            "base_amount": d.base_amount,
        }
        for d in page
    ]


async def _pages(
    request: Request, first: list[reports.Decision], lo: Any, hi: Any
) -> AsyncIterator[list[reports.Decision]]:
    """The decisions, a page at a time, each read in a short transaction of its own: between two
    pages, while the client has not yet taken the last one, no connection and no transaction is
    held (a client that stops reading blocks only this generator, in its send)."""
    page = first
    while True:
        yield page
        if len(page) < reports.DECISIONS_PAGE:
            return
        after = (page[-1].resolved_at, page[-1].event_id)
        # Give way first: a request waiting for a pooled connection gets it before the next page
        # (a fast reader would otherwise take it back each time, and a small pool never free up).
        await asyncio.sleep(0)
        async with request_read_transaction(request) as conn:
            page = await reports.decisions_page(conn, lo=lo, hi=hi, after=after)


async def _export(
    request: Request,
    query: DecisionsQuery,
    conn: ReadConn,
    media_type: str,
    encode: Callable[..., bytes],
) -> StreamingResponse:
    period = _period(query, limit=False)
    # The period and the first page in the request's own transaction, committed before the body is
    # sent: a database that is away is a 503 problem, not a truncated file.
    lo, hi = await _computed(
        query, lambda: reports.decision_bounds(conn, start=period.start, end=period.end, tz=period.tz)
    )
    first = await reports.decisions_page(conn, lo=lo, hi=hi, after=None)

    async def body() -> AsyncIterator[bytes]:
        header = True
        try:
            async for page in _pages(request, first, lo, hi):
                yield encode(_plain(page), header=header)
                header = False
        except Exception as error:
            # The status line is long gone: the connection is cut without the chunked body's end,
            # so that no client takes a partial file for a whole one.
            log.warning("report_export_interrupted", extra={"path": request.url.path, "error": repr(error)})
            raise

    extension = "csv" if media_type == CSV else "ndjson"
    filename = f"decisions-{period.start.isoformat()}-to-{period.end.isoformat()}.{extension}"
    return StreamingResponse(
        body(),
        media_type=f"{media_type}; charset=utf-8" if media_type == CSV else media_type,
        headers={"Content-Disposition": f'attachment; filename="{filename}"', "Cache-Control": "no-store"},
    )


_EXPORT_RESPONSES = problem_responses("VALIDATION_ERROR", "DATABASE_UNAVAILABLE")


@router.get(
    "/reports/decisions.csv",
    operation_id="exportDecisionsCsv",
    openapi_extra=period_rules(),
    summary="Every decision of a period, as CSV",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {CSV: {"schema": {"type": "string"}}},
            "description": "A header row, then one row per decision in (resolved_at, event_id) order; the"
            " columns of DecisionRowOut. Cells a spreadsheet would run as a formula start with an"
            " apostrophe.",
        },
        **_EXPORT_RESPONSES,
    },
)
async def decisions_csv(
    request: Request, query: Annotated[DecisionsQuery, Query()], conn: ReadConn, _: Auditor
) -> StreamingResponse:
    """Every decision (RESOLVED or APPROVED event) made in the period, streamed. Roles auditor and
    admin; the desk's session cookie works too, so a link can download it."""
    return await _export(request, query, conn, CSV, _csv_lines)


@router.get(
    "/reports/decisions.ndjson",
    operation_id="exportDecisionsNdjson",
    openapi_extra=period_rules(),
    summary="Every decision of a period, as NDJSON",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {NDJSON: {"schema": {"type": "string"}}},
            "description": "One DecisionRowOut JSON object per line, in (resolved_at, event_id) order.",
        },
        **_EXPORT_RESPONSES,
    },
)
async def decisions_ndjson(
    request: Request, query: Annotated[DecisionsQuery, Query()], conn: ReadConn, _: Auditor
) -> StreamingResponse:
    """The same decisions as the CSV export, one JSON object per line. Roles auditor and admin."""
    return await _export(request, query, conn, NDJSON, _ndjson_lines)
