"""What every state change reports: the seed's log line and a Prometheus counter.

Both are reported by the function that made the change (db/queue/), so the API, the
reclaimer and the CLI report a transition identically, and both are emitted after the COMMIT:
a queue function hands them to its unit of work (`unit.after_commit`, db/unit.py), which runs
them once it has committed and drops them if it does not, so a "resolved" line never describes a
change that was rolled back.
In multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by `review-queue serve`) the counters of
every API worker and the reclaimer child are summed at scrape time.
"""

import logging
from collections.abc import Iterable
from typing import Any, Protocol
from uuid import UUID

from prometheus_client import Counter

# The seed's logger name and event names.
log = logging.getLogger("reconciliation.review_queue.lease")

ENQUEUED = Counter("review_queue_items_enqueued_total", "Items created by POST /items or /items/batch.")
LEASED = Counter("review_queue_items_leased_total", "Leases handed out (one per item).")
RENEWED = Counter("review_queue_items_renewed_total", "Lease renewals (heartbeats).")
RELEASED = Counter("review_queue_items_released_total", "Items handed back by their holder.")
RECLAIMED = Counter("review_queue_items_reclaimed_total", "Expired leases returned to the queue.")
RESOLVED = Counter("review_queue_items_resolved_total", "Items resolved, by resolution.", ["resolution"])
QUARANTINED = Counter(
    "review_queue_items_quarantined_total", "Items quarantined after REVIEW_QUEUE_MAX_ATTEMPTS leases."
)
REQUEUED = Counter("review_queue_items_requeued_total", "Quarantined items put back in the queue.")
REOPENED = Counter("review_queue_items_reopened_total", "Resolved items reopened by an admin.")
SUBMITTED = Counter(
    "review_queue_items_submitted_for_approval_total",
    "Completions at or above their code's approval threshold.",
)
APPROVED = Counter(
    "review_queue_items_approved_total", "Proposals approved (and so resolved) by an approver."
)
REJECTED = Counter(
    "review_queue_items_rejected_total", "Proposals rejected back to the queue by an approver."
)

# Resolutions are free text, so their label is bounded: the first MAX_RESOLUTION_LABELS values a
# process sees get a series of their own, every later one is counted as "other".
MAX_RESOLUTION_LABELS = 50
_resolution_labels: set[str] = set()


class _Row(Protocol):
    @property
    def id(self) -> UUID: ...
    @property
    def trace_id(self) -> UUID: ...
    @property
    def source_hash(self) -> str: ...
    @property
    def match_decision(self) -> str: ...


def fields(row: _Row, **extra: Any) -> dict[str, Any]:
    """The seed's log fields for one item."""
    return {
        "trace_id": str(row.trace_id),
        "source_hash": row.source_hash,
        "match_decision": row.match_decision,
        "item_id": str(row.id),
        **extra,
    }


def enqueued(count: int) -> None:
    ENQUEUED.inc(count)


def leased(items: Iterable[_Row], reviewer: str) -> None:
    for item in items:
        LEASED.inc()
        log.info("review_item_leased", extra=fields(item, worker_id=reviewer))


def renewed(item: _Row, reviewer: str) -> None:
    RENEWED.inc()
    log.info("review_item_lease_renewed", extra=fields(item, worker_id=reviewer))


def released(item: _Row, reviewer: str, reason: str | None) -> None:
    RELEASED.inc()
    log.info("review_item_released", extra=fields(item, worker_id=reviewer, reason=reason))


def resolution_label(resolution: str) -> str:
    if resolution not in _resolution_labels and len(_resolution_labels) >= MAX_RESOLUTION_LABELS:
        return "other"
    _resolution_labels.add(resolution)
    return resolution


def resolved(item: _Row, reviewer: str, **extra: Any) -> None:
    RESOLVED.labels(resolution=resolution_label(extra.get("resolution", ""))).inc()
    log.info("review_item_resolved", extra=fields(item, worker_id=reviewer, **extra))


def completion_noop(item: _Row, reviewer: str, reason: str) -> None:
    log.info("review_item_completion_noop", extra=fields(item, worker_id=reviewer, reason=reason))


def reclaimed(item: _Row, **extra: Any) -> None:
    RECLAIMED.inc()
    log.warning("review_item_lease_reclaimed", extra=fields(item, **extra))


def quarantined(item: _Row, actor: str) -> None:
    QUARANTINED.inc()
    log.warning("review_item_quarantined", extra=fields(item, worker_id=actor))


def requeued(item: _Row, actor: str, reason: str) -> None:
    REQUEUED.inc()
    log.info("review_item_requeued", extra=fields(item, worker_id=actor, reason=reason))


def reopened(item: _Row, actor: str, reason: str, previous_resolution: str | None) -> None:
    REOPENED.inc()
    log.info(
        "review_item_reopened",
        extra=fields(item, worker_id=actor, reason=reason, previous_resolution=previous_resolution),
    )


def submitted(item: _Row, preparer: str, **extra: Any) -> None:
    SUBMITTED.inc()
    log.info("review_item_submitted_for_approval", extra=fields(item, worker_id=preparer, **extra))


def approved(item: _Row, approver: str, **extra: Any) -> None:
    APPROVED.inc()
    RESOLVED.labels(resolution=resolution_label(extra.get("resolution") or "")).inc()
    log.info("review_item_approved", extra=fields(item, worker_id=approver, **extra))


def rejected(item: _Row, approver: str, **extra: Any) -> None:
    REJECTED.inc()
    log.info("review_item_rejected", extra=fields(item, worker_id=approver, **extra))


REVISED = Counter(
    "review_queue_items_revised_total", "Source revisions applied, by the state they found.", ["state"]
)
REASSIGNED = Counter("review_queue_items_reassigned_total", "Leases an admin moved to another reviewer.")
OVERRIDDEN = Counter("review_queue_items_admin_released_total", "Leases an admin released for their holder.")


def revised(item: _Row, actor: str, **extra: Any) -> None:
    REVISED.labels(state=str(extra.get("previous_state"))).inc()
    log.warning("review_item_revised", extra=fields(item, worker_id=actor, **extra))


def admin_released(item: _Row, actor: str, previous_holder: str, reason: str) -> None:
    OVERRIDDEN.inc()
    log.warning(
        "review_item_released_by_admin",
        extra=fields(item, worker_id=actor, previous_holder=previous_holder, reason=reason),
    )


def reassigned(item: _Row, actor: str, previous_holder: str, leased_by: str, reason: str) -> None:
    REASSIGNED.inc()
    log.warning(
        "review_item_reassigned",
        extra=fields(
            item, worker_id=actor, previous_holder=previous_holder, leased_by=leased_by, reason=reason
        ),
    )


COMMENTED = Counter("review_queue_items_commented_total", "Comments appended to items' trails.")


class _Comment(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def item_id(self) -> UUID: ...
    @property
    def trace_id(self) -> UUID: ...
    @property
    def actor(self) -> str: ...


def commented(comment: _Comment) -> None:
    """The comment's text stays in the trail: the log line says who commented on what, not what."""
    COMMENTED.inc()
    log.info(
        "review_item_commented",
        extra={
            "item_id": str(comment.item_id),
            "trace_id": str(comment.trace_id),
            "event_id": comment.id,
            "worker_id": comment.actor,
        },
    )
