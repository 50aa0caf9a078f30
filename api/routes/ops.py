"""Operators' views: queue statistics and Prometheus metrics."""

from datetime import timedelta

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, Field

from api.deps import Conn, MetricsScraper, ReadConn, SettingsDep, StatsReader
from api.errors import problem_responses
from api.metrics import SLA_WINDOW_DAYS, exposition
from api.routing import QueueRoute
from db import audit, fx, partitions, reports, stats, webhooks

router = APIRouter(route_class=QueueRoute, tags=["operations"])


class StatsOut(BaseModel):
    counts: dict[str, int] = Field(
        description="Items by state: PENDING, ASSIGNED, RESOLVED, QUARANTINED, AWAITING_APPROVAL."
    )
    oldest_pending_age_s: float | None = Field(description="Seconds the oldest PENDING item has waited.")
    assigned: int
    max_inflight: int
    inflight_ratio: float = Field(description="assigned / max_inflight; above 0.9 the reclaimer warns.")
    expired_unreclaimed: int = Field(description="ASSIGNED rows whose lease_expires_at has passed.")
    reclaimable: int = Field(description="... and whose reclaim grace (reclaim_after_s) has passed too.")
    open_leases_by_reviewer: dict[str, int]
    approval_leases: int = Field(description="AWAITING_APPROVAL items an approver holds the lease of.")
    next_lease_expires_in_s: float | None = Field(
        description="Seconds until the soonest open lease expires (negative: lapsed, not yet reclaimed)."
    )
    overdue: int = Field(description="Open (not RESOLVED) items past their due_at.")
    oldest_overdue_s: float | None = Field(
        description="Seconds the most overdue open item is past its due_at; null when none is overdue."
    )
    aging: dict[str, int] = Field(
        description="Open items by age since enqueue: 0-1d, 1-3d, 3-7d, 7-30d, 30d+ (in that order)."
    )
    overdue_by_ledger_entity: dict[str, int] = Field(
        description=f"Overdue open items per ledger entity: the {stats.OVERDUE_ENTITIES} with most, most"
        " first."
    )
    open_by_currency: dict[str, int] = Field(
        description="Open (not RESOLVED) items per ISO 4217 currency, most first."
    )
    open_without_rate: int = Field(
        description="Open items in a currency with no exchange rate yet (GET /fx-rates): each needs an"
        " approver whatever its amount, until PUT /fx-rates/{currency} sets one."
    )
    currencies_without_rate: list[str] = Field(description="The currencies of those items, most items first.")


@router.get("/stats", operation_id="getStats", summary="Queue statistics")
async def get_stats(conn: ReadConn, _: StatsReader, settings: SettingsDep) -> StatsOut:
    """Queue depth, age, leases in flight and per reviewer, overdue and aging figures, open items per
    currency and those waiting without an exchange rate (roles reviewer, auditor, admin)."""
    gauges = await stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
    by_currency = await fx.open_by_currency(conn, base_currency=settings.base_currency)
    return StatsOut(
        counts={
            "PENDING": gauges.pending,
            "ASSIGNED": gauges.assigned,
            "QUARANTINED": gauges.quarantined,
            "AWAITING_APPROVAL": gauges.awaiting_approval,
            "RESOLVED": await stats.resolved_count(conn),
        },
        oldest_pending_age_s=gauges.oldest_pending_age_s,
        assigned=gauges.assigned,
        max_inflight=settings.max_inflight,
        inflight_ratio=gauges.assigned / settings.max_inflight,
        expired_unreclaimed=gauges.expired_unreclaimed,
        reclaimable=gauges.reclaimable,
        open_leases_by_reviewer=await stats.open_leases_by_reviewer(conn),
        approval_leases=gauges.approval_leases,
        next_lease_expires_in_s=await stats.next_lease_expiry_in_s(conn),
        overdue=gauges.overdue,
        oldest_overdue_s=gauges.oldest_overdue_s,
        aging=await stats.aging(conn),
        overdue_by_ledger_entity=await stats.overdue_by_ledger_entity(conn),
        open_by_currency={c.currency: c.open for c in by_currency},
        open_without_rate=sum(c.open for c in by_currency if not c.has_rate),
        currencies_without_rate=[c.currency for c in by_currency if not c.has_rate],
    )


@router.get(
    "/metrics",
    operation_id="getMetrics",
    summary="Prometheus metrics",
    dependencies=[MetricsScraper],
    response_class=Response,
    responses={
        200: {"content": {"text/plain; version=0.0.4": {}}, "description": "Prometheus text format."},
        **problem_responses("UNAUTHENTICATED", "FORBIDDEN", "DATABASE_UNAVAILABLE"),
    },
)
async def metrics(conn: Conn, settings: SettingsDep) -> Response:
    """Prometheus metrics (REVIEW_QUEUE_METRICS_TOKEN, or an admin token)."""
    gauges = await stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
    sla = await reports.sla_trailing(conn, days=SLA_WINDOW_DAYS)
    body = exposition(
        gauges,
        settings.max_inflight,
        await audit.seal_lag(conn),
        await webhooks.delivery_gauges(conn),
        sla,
        await partitions.trail_gauges(conn),
        settings.retain_resolved_days,
        await fx.items_without_rate(conn, base_currency=settings.base_currency),
    )
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
