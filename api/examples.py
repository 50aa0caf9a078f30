"""Example bodies for the OpenAPI document: one per request and response model, shown in /docs and
by generated clients. tests/unit/api/test_openapi.py validates each against its own schema.

They are added to the generated document (`with_examples`) rather than to the models'
`json_schema_extra`, because FastAPI drops every null from the document it renders, and an item
without its null fields would not match its own schema."""

from typing import Any

from api.examples_reports import BACKLOG_OUT, SLA_OUT, THROUGHPUT_OUT

ITEM_ID = "0b8e6a52-3f0e-4c61-9d6e-5d0f2b7a9c11"
TRACE_ID = "5f1c2d3e-4b5a-4c6d-8e7f-90a1b2c3d4e5"
LEASE_TOKEN = "C45qUj8OTGGdbl0PK3qcEZo-H2wrfU6KscRdbn-Kmww"  # noqa: S105 - an example, not a secret

ITEM_IN: dict[str, Any] = {
    "idempotency_key": "ACME-2026-11-30-0042",
    "ledger_entity": "ACME-CORP",
    "variance_amount": "12.50",
    "currency": "USD",
    "match_decision": "PARTIAL",
    "source_hash": "sha256:9f2c",
}
ITEM_PENDING: dict[str, Any] = {
    "id": ITEM_ID,
    **ITEM_IN,
    "state": "PENDING",
    "leased_by": None,
    "leased_at": None,
    "lease_expires_at": None,
    "trace_id": TRACE_ID,
    "created_at": "2026-12-03T09:00:00+00:00",
    "resolution": None,
    "resolution_note": None,
    "resolved_by": None,
    "resolved_at": None,
    "attempts": 0,
    "lease_token": None,
    "prepared_by": None,
    "prepared_at": None,
    "proposed_resolution": None,
    "proposed_note": None,
    "approved_by": None,
    "approved_at": None,
    "due_at": "2026-12-08T09:00:00+00:00",
}
ITEM_ASSIGNED: dict[str, Any] = {
    **ITEM_PENDING,
    "state": "ASSIGNED",
    "leased_by": "alice",
    "leased_at": "2026-12-03T09:05:00+00:00",
    "lease_expires_at": "2026-12-03T09:05:30+00:00",
    "attempts": 1,
    "lease_token": LEASE_TOKEN,
}
ITEM_RESOLVED: dict[str, Any] = {
    **ITEM_ASSIGNED,
    "state": "RESOLVED",
    "resolution": "APPROVED",
    "resolution_note": "FX rounding",
    "resolved_by": "alice",
    "resolved_at": "2026-12-03T09:05:12+00:00",
    "lease_token": None,
}

ITEM_AWAITING_APPROVAL: dict[str, Any] = {
    **ITEM_ASSIGNED,
    "variance_amount": "25000.00",
    "state": "AWAITING_APPROVAL",
    "leased_by": None,
    "leased_at": None,
    "lease_expires_at": None,
    "lease_token": None,
    "prepared_by": "alice",
    "prepared_at": "2026-12-03T09:05:12+00:00",
    "proposed_resolution": "ADJUSTMENT_POSTED",
    "proposed_note": "JE-2026-1130-7",
}
ITEM_APPROVED: dict[str, Any] = {
    **ITEM_AWAITING_APPROVAL,
    "state": "RESOLVED",
    "leased_by": "bob",
    "leased_at": "2026-12-03T09:20:00+00:00",
    "lease_expires_at": "2026-12-03T09:20:30+00:00",
    "resolution": "ADJUSTMENT_POSTED",
    "resolution_note": "JE-2026-1130-7",
    "resolved_by": "alice",
    "resolved_at": "2026-12-03T09:20:09+00:00",
    "approved_by": "bob",
    "approved_at": "2026-12-03T09:20:09+00:00",
}
RESOLUTION_CODE_IN = {
    "label": "Adjustment posted",
    "description": "A correcting journal entry was posted; give its reference in the note.",
    "requires_note": True,
    "approval_threshold": "10000.00",
    "active": True,
}
RESOLUTION_CODE_OUT = {
    "code": "ADJUSTMENT_POSTED",
    **RESOLUTION_CODE_IN,
    "updated_at": "2026-12-03T08:00:00+00:00",
    "effective_approval_threshold": "10000.00",
}
RESOLUTION_POLICY_OUT = {
    "materiality_threshold": "10000.00",
    "updated_at": "2026-12-04T06:10:00+00:00",
    "updated_by": "ada",
    "base_currency": "USD",
}

FX_RATE = {
    "currency": "EUR",
    "rate": "1.0850",
    "set_by": "treasury-feed",
    "set_at": "2026-12-05T16:00:00+00:00",
}

LEASE_IN = {"batch_size": 5, "ledger_entity": "ACME-CORP"}
LEASE_OUT = {"items": [ITEM_ASSIGNED]}
COMPLETE_IN = {
    "resolution": "APPROVED",
    "note": "FX rounding",
    "lease_token": LEASE_TOKEN,
    "source_hash": "sha256:9f2c",
}
COMPLETE_OUT = {"outcome": "resolved", "item": ITEM_RESOLVED}
COMPLETE_BATCH_IN = {
    "items": [
        {"id": ITEM_ID, "resolution": "APPROVED", "note": "FX rounding", "lease_token": LEASE_TOKEN},
        {"id": TRACE_ID, "resolution": "APPROVED"},
    ]
}
COMPLETE_BATCH_OUT = {
    "results": [
        {"id": ITEM_ID, "outcome": "resolved", "item": ITEM_RESOLVED, "problem": None},
        {
            "id": TRACE_ID,
            "outcome": "refused",
            "item": None,
            "problem": {
                "type": "/problems/not-found",
                "title": "Not found",
                "status": 404,
                "detail": f"no item {TRACE_ID}",
                "code": "NOT_FOUND",
            },
        },
    ]
}
RENEW_IN = {"lease_token": LEASE_TOKEN}
RELEASE_IN = {"reason": "needs the FX desk", "lease_token": LEASE_TOKEN}
BATCH_IN = {"items": [ITEM_IN]}
BATCH_OUT = {"results": [{"outcome": "created", "item": ITEM_PENDING, "problem": None}]}
ITEM_PAGE = {"items": [ITEM_ASSIGNED], "next_cursor": None}
EVENTS_OUT = {
    "events": [
        {
            "id": 1,
            "item_id": ITEM_ID,
            "event": "ENQUEUED",
            "actor": "ingest-bot",
            "at": "2026-12-03T09:00:00+00:00",
            "lease_epoch": 0,
            "trace_id": TRACE_ID,
            "details": {},
        },
        {
            "id": 2,
            "item_id": ITEM_ID,
            "event": "LEASED",
            "actor": "alice",
            "at": "2026-12-03T09:05:00+00:00",
            "lease_epoch": 1,
            "trace_id": TRACE_ID,
            "details": {"lease_expires_at": "2026-12-03T09:05:30+00:00"},
        },
    ],
    "next_cursor": None,
}
COMMENT_IN = {"text": "INV-77412 was paid twice; the credit note is on its way."}
COMMENT_OUT = {
    "id": 3,
    "item_id": ITEM_ID,
    "event": "COMMENTED",
    "actor": "april",
    "at": "2026-12-03T09:20:00+00:00",
    "lease_epoch": 1,
    "trace_id": TRACE_ID,
    "details": COMMENT_IN,
}
RECLAIM_IN = {"reclaim_batch": 100}
REQUEUE_IN = {"reason": "the FX rates feed is fixed; try again"}
RECLAIM_OUT = {
    "reclaimed": 1,
    "items": [
        {
            "id": ITEM_ID,
            "trace_id": TRACE_ID,
            "source_hash": "sha256:9f2c",
            "match_decision": "PARTIAL",
            "state": "PENDING",
        }
    ],
}
STATS_OUT = {
    "counts": {"PENDING": 120, "ASSIGNED": 14, "RESOLVED": 90210, "QUARANTINED": 0, "AWAITING_APPROVAL": 3},
    "oldest_pending_age_s": 42.5,
    "assigned": 14,
    "max_inflight": 1000,
    "inflight_ratio": 0.014,
    "expired_unreclaimed": 0,
    "reclaimable": 0,
    "open_leases_by_reviewer": {"alice": 5, "bob": 9},
    "next_lease_expires_in_s": 12.5,
    "approval_leases": 1,
    "overdue": 3,
    "oldest_overdue_s": 5400.0,
    "aging": {"0-1d": 98, "1-3d": 30, "3-7d": 4, "7-30d": 2, "30d+": 0},
    "overdue_by_ledger_entity": {"ACME-CORP": 2, "GLOBEX": 1},
    "open_by_currency": {"USD": 120, "EUR": 11, "JPY": 3},
    "open_without_rate": 3,
    "currencies_without_rate": ["JPY"],
}
SESSION_IN = {"token": "rq_" + "x" * 43}
SESSION_OUT = {
    "subject": "alice",
    "role": "reviewer",
    "csrf_token": "Yq3hK1m0p9Zt4sLx8cVb2nQw",
    "lease_s": 30.0,
    "idle_release_s": 600,
    "max_wait_s": 20,
    "release_cooldown_s": 900,
}
OIDC_PROVIDER_OUT = {"enabled": True, "provider_name": "Keycloak", "login_url": "/auth/oidc/login"}
SIGN_OUT_OUT = {
    "end_session_url": "https://sso.example.com/realms/finance/protocol/openid-connect/logout"
    "?id_token_hint=eyJhbGciOiJSUzI1NiJ9.e30.c2ln"
    "&post_logout_redirect_uri=https%3A%2F%2Freview.example.com%2Fdesk%2F&client_id=review-queue"
}
HEALTH = {"status": "ok"}
PROBLEM = {
    "type": "/problems/resolution-conflict",
    "title": "Already resolved with a different resolution",
    "status": 409,
    "detail": "you already resolved this item as APPROVED, not REJECTED",
    "code": "RESOLUTION_CONFLICT",
    "instance": f"/items/{ITEM_ID}/complete",
}

LEASE_RECLAIMED = {
    "type": "/problems/lease-not-held",
    "title": "Lease not held",
    "status": 409,
    "detail": f"your lease on item {ITEM_ID} expired at 2026-12-04T09:31:00+00:00 and was reclaimed at"
    " 2026-12-04T09:31:58.412907+00:00, back to its queue; nothing was changed",
    "code": "LEASE_NOT_HELD",
    "instance": f"/items/{ITEM_ID}/complete",
    "lease_expired_at": "2026-12-04T09:31:00+00:00",
    "reclaimed_at": "2026-12-04T09:31:58.412907+00:00",
}

REVISION_IN = {"variance_amount": "14.75", "source_hash": "sha256:a41d", "match_decision": "UNMATCHED"}
REVISION_OUT = {
    "outcome": "revised",
    "item": {
        **ITEM_PENDING,
        "variance_amount": "14.75",
        "source_hash": "sha256:a41d",
        "match_decision": "UNMATCHED",
    },
}
ADMIN_RELEASE_IN = {"reason": "alice is on leave until the 14th"}
REASSIGN_IN = {"reviewer": "bob", "reason": "alice is on leave; bob covers ACME"}
RELEASED_OUT = {"released": 1, "items": [ITEM_PENDING]}
DECISIONS_OUT = {
    "decisions": [
        {
            "event": {
                "id": 7,
                "item_id": ITEM_ID,
                "event": "SUBMITTED_FOR_APPROVAL",
                "actor": "alice",
                "at": "2026-12-03T09:12:00+00:00",
                "lease_epoch": 1,
                "trace_id": TRACE_ID,
                "details": {
                    "resolution": "ADJUSTMENT_POSTED",
                    "note": "JE-2026-1187",
                    "approval_threshold": "10000.00",
                    "variance_amount": "-25000.00",
                },
            },
            "item": ITEM_AWAITING_APPROVAL,
            "rejection": None,
        },
        {
            "event": {
                "id": 5,
                "item_id": "7d4c9e21-6a0b-4f3e-8c5d-2e1f0a9b8c7d",
                "event": "SUBMITTED_FOR_APPROVAL",
                "actor": "alice",
                "at": "2026-12-03T08:40:00+00:00",
                "lease_epoch": 1,
                "trace_id": TRACE_ID,
                "details": {
                    "resolution": "WRITE_OFF",
                    "note": "bank charges",
                    "approval_threshold": "1000.00",
                },
            },
            "item": {**ITEM_PENDING, "id": "7d4c9e21-6a0b-4f3e-8c5d-2e1f0a9b8c7d"},
            "rejection": {"by": "april", "reason": "attach the statement", "at": "2026-12-03T08:55:00+00:00"},
        },
    ],
    "next_cursor": "5",
}

FEED_CURSOR = "00000000000002e1000000000000a3f0"
FEED_EVENT = {
    "id": 41968,
    "item_id": ITEM_ID,
    "event": "RESOLVED",
    "actor": "alice",
    "at": "2026-12-03T09:05:12+00:00",
    "lease_epoch": 1,
    "trace_id": TRACE_ID,
    "details": {"resolution": "APPROVED", "note": "FX rounding"},
    "item": {**ITEM_RESOLVED, "lease_token": None},
    "item_as_of": "event",
    "cursor": FEED_CURSOR,
}
FEED_OUT = {"events": [FEED_EVENT], "next_cursor": FEED_CURSOR}
WEBHOOK_IN = {
    "url": "https://ledger.example.com/hooks/review-queue",
    "events": ["item.resolved", "item.approved", "item.reopened"],
    "active": True,
}
WEBHOOK_OUT = {
    "name": "ledger",
    "url": "https://ledger.example.com/hooks/review-queue",
    "events": ["item.resolved", "item.approved", "item.reopened"],
    "active": True,
    "status": "ok",
    "disabled_reason": None,
    "cursor": FEED_CURSOR,
    "attempts": 0,
    "failing_since": None,
    "held_items": 0,
    "next_attempt_at": "2026-12-03T09:05:13+00:00",
    "last_error": None,
    "created_at": "2026-12-01T08:00:00+00:00",
    "updated_at": "2026-12-01T08:00:00+00:00",
}
WEBHOOK_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"  # noqa: S105 - an example, not a secret
DELIVERY_OUT = {
    "id": 9,
    "event_id": 41968,
    "webhook_id": "evt_41968",
    "type": "item.resolved",
    "attempt": 2,
    "attempted_at": "2026-12-03T09:05:21+00:00",
    "outcome": "delivered",
    "status_code": 200,
    "latency_ms": 84.2,
    "error": None,
}

# Component schema name -> its examples.
BY_SCHEMA: dict[str, list[dict[str, Any]]] = {
    "ItemIn": [
        ITEM_IN,
        {**ITEM_IN, "idempotency_key": "ACME-2026-11-30-0043", "due_at": "2026-12-04T17:00:00Z"},
    ],
    "ItemOut": [ITEM_ASSIGNED, ITEM_PENDING, ITEM_AWAITING_APPROVAL],
    "LeaseIn": [
        LEASE_IN,
        {"batch_size": 1, "queue": "approval", "wait_s": 20},
        {"item_id": ITEM_ID},
    ],
    "LeaseOut": [LEASE_OUT],
    "CompleteIn": [COMPLETE_IN],
    "CompleteOut": [COMPLETE_OUT, {"outcome": "submitted_for_approval", "item": ITEM_AWAITING_APPROVAL}],
    "ApproveIn": [{"lease_token": LEASE_TOKEN}],
    "ApproveOut": [{"outcome": "approved", "item": ITEM_APPROVED}],
    "RejectIn": [{"reason": "the journal entry is posted to the wrong entity", "lease_token": LEASE_TOKEN}],
    "ResolutionCodeIn": [RESOLUTION_CODE_IN],
    "ResolutionCodeOut": [RESOLUTION_CODE_OUT],
    "ResolutionsOut": [{"resolutions": [RESOLUTION_CODE_OUT]}],
    "ResolutionPolicyIn": [{"materiality_threshold": "10000.00"}],
    "ResolutionPolicyOut": [RESOLUTION_POLICY_OUT, {**RESOLUTION_POLICY_OUT, "updated_by": None}],
    "RateIn": [{"rate": "1.0850"}],
    "RateOut": [FX_RATE],
    "RatesOut": [
        {"base_currency": "USD", "rates": [FX_RATE, {**FX_RATE, "currency": "JPY", "rate": "0.0067"}]}
    ],
    "RateHistoryOut": [
        {
            "currency": "EUR",
            "rates": [FX_RATE, {**FX_RATE, "rate": "1.0790", "set_at": "2026-12-04T16:00:00+00:00"}],
        }
    ],
    "CompleteBatchIn": [COMPLETE_BATCH_IN],
    "CompleteBatchOut": [COMPLETE_BATCH_OUT],
    "RenewIn": [RENEW_IN],
    "ReleaseIn": [RELEASE_IN],
    "RequeueIn": [REQUEUE_IN],
    "ReopenIn": [{"reason": "the bank statement was re-issued; the write-off no longer holds"}],
    "BatchIn": [BATCH_IN],
    "BatchOut": [BATCH_OUT],
    "ItemPage": [ITEM_PAGE],
    "EventsOut": [EVENTS_OUT],
    "CommentIn": [COMMENT_IN],
    "EventOut": [COMMENT_OUT],
    "ReclaimIn": [RECLAIM_IN],
    "ReclaimOut": [RECLAIM_OUT],
    "StatsOut": [STATS_OUT],
    "Health": [HEALTH],
    "Problem": [PROBLEM, LEASE_RECLAIMED],
    "SessionIn": [SESSION_IN],
    "SessionOut": [SESSION_OUT],
    "OidcProviderOut": [OIDC_PROVIDER_OUT, {"enabled": False, "provider_name": None, "login_url": None}],
    "SignOutOut": [SIGN_OUT_OUT],
    "RevisionIn": [REVISION_IN],
    "RevisionOut": [REVISION_OUT],
    "AdminReleaseIn": [ADMIN_RELEASE_IN],
    "ReassignIn": [REASSIGN_IN],
    "ReleasedOut": [RELEASED_OUT],
    "DecisionsPage": [DECISIONS_OUT],
    "FeedEventOut": [FEED_EVENT],
    "FeedOut": [FEED_OUT],
    "WebhookIn": [WEBHOOK_IN, {"url": "https://chat.example.com/rq", "secret": WEBHOOK_SECRET}],
    "WebhookOut": [WEBHOOK_OUT],
    "WebhookPutOut": [{**WEBHOOK_OUT, "secret": WEBHOOK_SECRET}, {**WEBHOOK_OUT, "secret": None}],
    "WebhooksOut": [{"webhooks": [WEBHOOK_OUT]}],
    "DeliveryOut": [DELIVERY_OUT],
    "DeliveriesOut": [
        {
            "deliveries": [
                DELIVERY_OUT,
                {
                    **DELIVERY_OUT,
                    "id": 8,
                    "attempt": 1,
                    "attempted_at": "2026-12-03T09:05:13+00:00",
                    "outcome": "failed",
                    "status_code": 503,
                    "latency_ms": 12.0,
                    "error": "HTTP 503",
                },
            ]
        }
    ],
    "RedeliverIn": [{"from_cursor": FEED_CURSOR}, {}],
    "SlaOut": [SLA_OUT],
    "ThroughputOut": [THROUGHPUT_OUT, {**THROUGHPUT_OUT, "reviewer": "alice"}],
    "BacklogOut": [BACKLOG_OUT],
}


def with_examples(document: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with each known component schema's examples, in place."""
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        if name in BY_SCHEMA:
            schema["examples"] = BY_SCHEMA[name]
    return document
