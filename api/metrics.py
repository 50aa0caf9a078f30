"""HTTP metrics, the access log, and the Prometheus exposition of everything."""

import logging
import os
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from db.audit import SealLag
from db.partitions import TrailGauges
from db.reports import SlaFigures
from db.stats import QueueGauges
from db.webhooks import DeliveryGauges

log = logging.getLogger("review_queue.access")

REQUESTS = Counter(
    "review_queue_http_requests_total",
    "HTTP requests by route template and status.",
    ["method", "route", "status"],
)
LATENCY = Histogram(
    "review_queue_http_request_duration_seconds",
    "HTTP request latency by route template.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
# Seed: LOCK_CONTENTION. A table-level lock elsewhere made a request hit lock_timeout.
LOCK_TIMEOUTS = Counter(
    "review_queue_lock_timeouts_total", "Requests that hit PostgreSQL lock_timeout (503).", ["route"]
)
AUTH_FAILURES = Counter(
    "review_queue_auth_failures_total",
    "Requests refused 401, by reason: missing, malformed, unknown (or revoked) token, or a refused"
    " provider_token (an OIDC JWT or opaque token).",
    ["reason"],
)
OIDC_SIGN_INS = Counter(
    "review_queue_oidc_sign_ins_total",
    "Desk sign-ins with the identity provider, by outcome: signed_in, or the sign_in_error code.",
    ["outcome"],
)
OIDC_INTROSPECTIONS = Counter(
    "review_queue_oidc_introspections_total",
    "Calls to the identity provider's introspection endpoint (RFC 7662) for opaque API tokens, by"
    " outcome: active (a caller), refused (inactive, or not for this API), unavailable (no answer).",
    ["outcome"],
)
DB_UNAVAILABLE = Counter(
    "review_queue_database_unavailable_total", "Requests answered 503 DATABASE_UNAVAILABLE.", ["route"]
)


class AccessLog:
    """One log line and one metrics sample per request, labelled by route template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", "unmatched")  # never the raw path: bounded labels
            REQUESTS.labels(scope["method"], route, str(status)).inc()
            LATENCY.labels(scope["method"], route).observe(elapsed)
            log.info(
                "http_request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                    "client": (scope.get("client") or ("?",))[0],
                },
            )


# The SLA gauges' window: the items that fell due in the last week (the recording rule
# review_queue:sla_attainment_7d:ratio in deploy/prometheus/alerts.yml divides them).
SLA_WINDOW_DAYS = 7


class _QueueCollector(Collector):
    def __init__(
        self,
        gauges: QueueGauges,
        max_inflight: int,
        lag: SealLag,
        deliveries: DeliveryGauges,
        sla: SlaFigures,
        trail: TrailGauges,
        retain_days: int,
        without_rate: int,
    ) -> None:
        self.without_rate = without_rate
        self.gauges, self.max_inflight, self.lag = gauges, max_inflight, lag
        self.deliveries, self.sla, self.trail, self.retain_days = deliveries, sla, trail, retain_days

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = self.gauges
        yield GaugeMetricFamily(
            "review_queue_items_without_rate",
            "Open items in a currency without an exchange rate: each needs an approver whatever its amount.",
            value=self.without_rate,
        )
        yield GaugeMetricFamily(
            "review_queue_pending_items", "Items waiting for a reviewer.", value=g.pending
        )
        yield GaugeMetricFamily("review_queue_assigned_items", "Items leased right now.", value=g.assigned)
        yield GaugeMetricFamily(
            "review_queue_quarantined_items",
            "Items quarantined after REVIEW_QUEUE_MAX_ATTEMPTS leases, waiting for an admin's requeue.",
            value=g.quarantined,
        )
        yield GaugeMetricFamily(
            "review_queue_awaiting_approval_items",
            "Proposals at or above their code's approval threshold, waiting for an approver (leased or not).",
            value=g.awaiting_approval,
        )
        yield GaugeMetricFamily(
            "review_queue_approval_leases", "Approval leases held right now.", value=g.approval_leases
        )
        yield GaugeMetricFamily(
            "review_queue_expired_unreclaimed_items",
            "Leases past lease_expires_at still ASSIGNED (seed: LEASE_LEAK, STARVATION).",
            value=g.expired_unreclaimed,
        )
        yield GaugeMetricFamily(
            "review_queue_oldest_pending_age_seconds",
            "Age of the oldest PENDING item; 0 when none (seed: STARVATION).",
            value=g.oldest_pending_age_s or 0.0,
        )
        yield GaugeMetricFamily(
            "review_queue_overdue_items",
            "Open (not RESOLVED) items past their due_at.",
            value=g.overdue,
        )
        yield GaugeMetricFamily(
            "review_queue_oldest_overdue_seconds",
            "How far past its due_at the most overdue open item is; 0 when none is overdue.",
            value=g.oldest_overdue_s or 0.0,
        )
        yield GaugeMetricFamily(
            "review_queue_inflight_ratio",
            "ASSIGNED items / REVIEW_QUEUE_MAX_INFLIGHT (seed: LEASE_LEAK; alert above 0.9).",
            value=g.assigned / self.max_inflight,
        )
        yield GaugeMetricFamily(
            "review_queue_audit_unsealed_events",
            "Committed events not yet in the hash chain (the sealer runs every reclaim interval).",
            value=self.lag.unsealed,
        )
        yield GaugeMetricFamily(
            "review_queue_audit_oldest_unsealed_age_seconds",
            "Age of the oldest committed event not yet in the hash chain; 0 when none.",
            value=self.lag.oldest_unsealed_age_s,
        )
        lag = GaugeMetricFamily(
            "review_queue_webhook_delivery_lag_seconds",
            "Age of the oldest event an active webhook subscription has not delivered yet; 0 when none.",
            labels=["subscription"],
        )
        for name, seconds in self.deliveries.lag_s.items():
            lag.add_metric([name], seconds)
        yield lag
        yield GaugeMetricFamily(
            "review_queue_webhook_failing_subscriptions",
            "Webhook subscriptions whose retrying gave up (REVIEW_QUEUE_WEBHOOK_GIVE_UP_H)"
            "; POST /webhooks/{name}/redeliver resumes one.",
            value=self.deliveries.failing,
        )

        yield GaugeMetricFamily(
            "review_queue_event_partitions_ahead_seconds",
            "Time until the event trail's last monthly partition ends: no event can be written after"
            " it (the reclaimer keeps REVIEW_QUEUE_EVENT_MONTHS_AHEAD months).",
            value=self.trail.ahead_s,
        )
        yield GaugeMetricFamily(
            "review_queue_trail_oldest_event_age_seconds",
            "Age of the oldest event the live hash chain holds (what `review-queue archive` moves"
            " first); 0 when nothing is sealed.",
            value=self.trail.oldest_event_age_s,
        )
        yield GaugeMetricFamily(
            "review_queue_trail_retention_seconds",
            "REVIEW_QUEUE_RETAIN_RESOLVED_DAYS in seconds: the archive moves nothing younger.",
            value=self.retain_days * 86400,
        )
        yield GaugeMetricFamily(
            "review_queue_sla_fell_due_items",
            f"Items whose due_at passed in the last {SLA_WINDOW_DAYS} days (docs/reports.md).",
            value=self.sla.fell_due,
        )
        yield GaugeMetricFamily(
            "review_queue_sla_on_time_items",
            f"... of which a decision was in effect at their due_at (last {SLA_WINDOW_DAYS} days).",
            value=self.sla.on_time,
        )


def exposition(
    gauges: QueueGauges,
    max_inflight: int,
    lag: SealLag,
    deliveries: DeliveryGauges,
    sla: SlaFigures,
    trail: TrailGauges,
    retain_days: int,
    without_rate: int = 0,
) -> bytes:
    """Counters of this process (or of all processes, in multiprocess mode) plus queue gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        counters = generate_latest(registry)
    else:
        counters = generate_latest(REGISTRY)
    queue = CollectorRegistry()
    queue.register(
        _QueueCollector(gauges, max_inflight, lag, deliveries, sla, trail, retain_days, without_rate)
    )
    return counters + generate_latest(queue)
