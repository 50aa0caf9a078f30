"""The contract's vocabulary and the defaults the schema and the settings share, in one place
that imports nothing: the API's schemas, the settings, the queue and the migrations' CHECK
constraints all read it."""

from typing import Literal, get_args
from uuid import UUID

# REVIEW_QUEUE_MAX_ATTEMPTS' default. Here, not in db/queue/, so that api/settings.py can read it
# without importing the metrics (prometheus_client picks its single- or multi-process mode when
# first imported, and `serve` sets PROMETHEUS_MULTIPROC_DIR only after the settings are loaded).
DEFAULT_MAX_ATTEMPTS = 10
# The currency of the thresholds and of an item enqueued without one (REVIEW_QUEUE_BASE_CURRENCY).
DEFAULT_BASE_CURRENCY = "USD"

# REVIEW_QUEUE_SLA_TIERS' default (api/settings.py): an item whose abs(variance_amount) is at least
# the amount is due that many hours after its enqueue, the first matching tier from the top.
DEFAULT_SLA_TIERS = "100000:24h,10000:72h,1000:120h,0:168h"
# The due_at of a row inserted without one (by SQL, not the API): the lowest default tier.
FALLBACK_DUE = "now() + interval '168 hours'"

# The contract's vocabulary, written once: the API's schemas type their fields with these Literals
# (and so the OpenAPI enums), the queue and the CLI use the tuples, and
# tests/integration/db/test_vocabulary.py holds each tuple equal to the CHECK constraint the
# migrations wrote.
State = Literal["PENDING", "ASSIGNED", "RESOLVED", "QUARANTINED", "AWAITING_APPROVAL"]
MatchDecision = Literal["MATCHED", "PARTIAL", "UNMATCHED"]
Role = Literal["reviewer", "approver", "ingest", "auditor", "admin", "integration"]
EventName = Literal[
    "ENQUEUED",
    "LEASED",
    "RENEWED",
    "RELEASED",
    "RECLAIMED",
    "RESOLVED",
    "QUARANTINED",
    "REQUEUED",
    "REOPENED",
    "SUBMITTED_FOR_APPROVAL",
    "APPROVED",
    "REJECTED",
    "REVISED",
    "REASSIGNED",
    "COMMENTED",
]
STATES: tuple[str, ...] = get_args(State)
MATCH_DECISIONS: tuple[str, ...] = get_args(MatchDecision)
ROLES: tuple[str, ...] = get_args(Role)
EVENTS: tuple[str, ...] = get_args(EventName)

# Token subjects (see db.tokens.check_subject, which says the same in Python): 1-128 characters,
# letters, digits and . _ @ + -, starting with a letter or digit, stored case-folded (lower case:
# `caseyX` and `CaseyX` are one identity, so only one spelling can exist); `me` (the caller, in
# `leased_by=me`) and `reclaimer`, `reclaimer@...` (the reclaimer's actor) are reserved.
SUBJECT_CHECK = (
    "subject ~ '^[a-z0-9][a-z0-9._@+-]{0,127}$'"
    " AND subject NOT IN ('me', 'reclaimer')"
    " AND subject NOT LIKE 'reclaimer@%'"
)

# The lease nonce a lease token that cannot be one of the item's leases stands for (malformed,
# another item's): gen_random_uuid() is version 4, never all zeros, so it matches no lease. Here
# so that the API's token codec and the queue's guard share it without the codec importing the
# queue (and with it the metrics, before serve picks their mode).
NO_LEASE = UUID(int=0)
