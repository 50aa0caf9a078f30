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


@router.get("/stats", operation_id="getStats", summary="Queue statistics")
async def get_stats(conn: ReadConn, _: StatsReader, settings: SettingsDep) -> StatsOut:
    """Queue depth, age, leases in flight and per reviewer, overdue and aging figures (roles reviewer,
    auditor, admin)."""
    gauges = await stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
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
