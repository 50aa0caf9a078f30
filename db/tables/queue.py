"""The queue: its items, their append-only event trail, and the rollup /stats counts from."""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Numeric,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from db.tables.base import PgSnapshot, Xid8, metadata
from db.vocabulary import FALLBACK_DUE

review_queue_item = Table(
    "review_queue_item",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=func.gen_random_uuid()),
    Column("idempotency_key", Text, nullable=False, unique=True),
    Column("ledger_entity", Text, nullable=False),
    # Unconstrained NUMERIC, bounded by ck_review_queue_item_amount_bounds: up to three decimals (KWD,
    # BHD ...), as many as the item's currency has (checked by the API against the ISO 4217 list).
    Column("variance_amount", Numeric(asdecimal=True), nullable=False),
    # ISO 4217 code; the items from before currencies took the base currency (2026_12_06_1910, whose
    # catalogue default, that base currency, stays for the writers of an older release).
    Column("currency", Text, nullable=False),
    Column("match_decision", Text, nullable=False),
    Column("state", Text, nullable=False, server_default="PENDING"),
    Column("leased_by", Text),
    Column("leased_at", DateTime(timezone=True)),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("trace_id", UUID(as_uuid=True), nullable=False, server_default=func.gen_random_uuid()),
    Column("source_hash", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("resolution", Text),
    Column("resolution_note", Text),
    Column("resolved_by", Text),
    Column("resolved_at", DateTime(timezone=True)),
    # Fencing: +1 on every lease, in the lease statement; never decreases.
    Column("lease_epoch", BigInteger, nullable=False, server_default="0"),
    # Random per lease, set by the lease statement: the lease_token carries it, so a token
    # cannot be computed from the public id and attempts.
    Column("lease_nonce", UUID(as_uuid=True)),
    # Leases since enqueue or the last requeue; at REVIEW_QUEUE_MAX_ATTEMPTS a release or
    # reclaim quarantines the item instead of queueing it again.
    Column("attempts", Integer, nullable=False, server_default="0"),
    # Free-form facts for the reviewer, set at enqueue; part of the idempotency comparison.
    Column("context", JSONB),
    # The deadline: given at enqueue, or created_at + the SLA tier of the amount. Leases go
    # earliest due_at first; never changed after enqueue, so a released item keeps its place.
    Column("due_at", DateTime(timezone=True), nullable=False, server_default=text(FALLBACK_DUE)),
    # The lease_epoch a source revision moved a leased item to (db.queue.revise_item): while it
    # equals lease_epoch, the current lease has seen new figures.
    Column("revised_epoch", BigInteger),
    # Maker-checker: the preparer's proposal (a completion at or above its code's approval
    # threshold), kept after approval or rejection; approve copies it into the resolution.
    Column("prepared_by", Text),
    Column("proposed_resolution", Text),
    Column("proposed_note", Text),
    Column("approved_by", Text),
    Column("prepared_at", DateTime(timezone=True)),
    Column("approved_at", DateTime(timezone=True)),
    # The release cool-off: who last released the item as its holder, and until when the lease
    # statement does not hand it back to them (REVIEW_QUEUE_RELEASE_COOLDOWN_S).
    Column("released_by", Text),
    Column("released_until", DateTime(timezone=True)),
    # A rejected proposal goes back to its preparer first: until then (REVIEW_QUEUE_REJECTED_RETURN_S
    # after the rejection) only the preparer's unnamed lease takes it, ahead of due order. The next
    # lease clears it.
    Column("returned_until", DateTime(timezone=True)),
    # Reopened once at least: set by the trigger that records a REOPENED event, and by nothing else
    # (a guard refuses other changes; 2026_12_05_1500).
    Column("reopened", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint(
        "state IN ('PENDING', 'ASSIGNED', 'RESOLVED', 'QUARANTINED', 'AWAITING_APPROVAL')", name="valid_state"
    ),
    CheckConstraint("match_decision IN ('MATCHED', 'PARTIAL', 'UNMATCHED')", name="valid_match_decision"),
    CheckConstraint(
        "variance_amount = round(variance_amount, 3) AND abs(variance_amount) < 1e16", name="amount_bounds"
    ),
    CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_code"),
    # At most 16 KiB of compact JSON (api.schemas); this is the database's looser backstop.
    CheckConstraint(
        "context IS NULL OR (jsonb_typeof(context) = 'object' AND octet_length(context::text) <= 32768)",
        name="context_object",
    ),
    # The lease columns are the guard once the lease transaction commits, so the database
    # itself refuses a row that claims to be leased without a holder and an expiry.
    CheckConstraint(
        "state <> 'ASSIGNED' OR (leased_by IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="assigned_has_lease",
    ),
    CheckConstraint(
        "state <> 'RESOLVED' OR (resolution IS NOT NULL AND resolved_by IS NOT NULL)",
        name="resolved_has_resolution",
    ),
    CheckConstraint(
        "state <> 'AWAITING_APPROVAL' OR (prepared_by IS NOT NULL AND proposed_resolution IS NOT NULL)",
        name="awaiting_has_proposal",
    ),
    # Segregation of duties, the database's backstop: nobody holds the approval lease of their
    # own proposal, and nobody approves what they resolved. Identities compare case-folded.
    CheckConstraint(
        "state <> 'AWAITING_APPROVAL' OR leased_by IS NULL OR lower(leased_by) <> lower(prepared_by)",
        name="approval_lease_not_preparer",
    ),
    CheckConstraint(
        "approved_by IS NULL OR (lower(approved_by) <> lower(resolved_by) AND approved_at IS NOT NULL)",
        name="four_eyes",
    ),
    # The lease scans only PENDING rows, in lease order (earliest due_at, then oldest): neither
    # resolved history nor open leases at the head of the queue are in its way. (The seed's single
    # index over PENDING and ASSIGNED made every lease walk past all open leases.)
    Index(
        "ix_review_queue_item_pending_due", "due_at", "created_at", postgresql_where=text("state = 'PENDING'")
    ),
    # The lease of a reviewer who handles one ledger entity: that entity's PENDING rows, in order.
    Index(
        "ix_review_queue_item_pending_entity_due",
        "ledger_entity",
        "due_at",
        "created_at",
        postgresql_where=text("state = 'PENDING'"),
    ),
    # The preparer's half of the lease: the PENDING rows a rejection returned to them, in lease order.
    Index(
        "ix_review_queue_item_pending_returned",
        func.lower(text("prepared_by")),
        "due_at",
        "created_at",
        postgresql_where=text("state = 'PENDING' AND returned_until IS NOT NULL"),
    ),
    # The other open items (leased, quarantined, ...) by deadline: with the PENDING index, the
    # overdue gauges read the head of it, the aging figures all of it, never the resolved history.
    # No PENDING rows, so the lease cannot choose it over its own index.
    Index(
        "ix_review_queue_item_open_due",
        "due_at",
        postgresql_where=text("state NOT IN ('PENDING', 'RESOLVED')"),
    ),
    # Reclaim scans only ASSIGNED rows, by expiry.
    Index(
        "ix_review_queue_item_lease_expiry", "lease_expires_at", postgresql_where=text("state = 'ASSIGNED'")
    ),
    # A reviewer's open work, and the per-reviewer cap, read exactly these rows.
    Index(
        "ix_review_queue_item_assigned_by_reviewer",
        "leased_by",
        "created_at",
        "id",
        postgresql_where=text("state = 'ASSIGNED'"),
    ),
    # Quarantined items are few and counted on every scrape.
    Index("ix_review_queue_item_quarantined", "created_at", postgresql_where=text("state = 'QUARANTINED'")),
    # The approval queue (AWAITING_APPROVAL, nobody holds it) in lease order, and its leases by expiry.
    Index(
        "ix_review_queue_item_awaiting_approval",
        "due_at",
        "created_at",
        postgresql_where=text("state = 'AWAITING_APPROVAL' AND leased_by IS NULL"),
    ),
    Index(
        "ix_review_queue_item_approval_lease_expiry",
        "lease_expires_at",
        postgresql_where=text("state = 'AWAITING_APPROVAL' AND leased_by IS NOT NULL"),
    ),
    # Keyset pagination of GET /items: by enqueue time, by deadline (the desk's work list), and one
    # ledger entity's items by deadline (the list's entity filter and its search).
    Index("ix_review_queue_item_created_at_id", "created_at", "id"),
    Index("ix_review_queue_item_due_at_id", "due_at", "id"),
    Index("ix_review_queue_item_entity_due_id", "ledger_entity", "due_at", "id"),
    # ... and its search (q): every prefix (up to 32 characters) of the key, the entity and each
    # value in the context, lower-cased (2026_12_07_0120; db/queue/reads.py). Written at enqueue
    # only: none of the three columns changes afterwards.
    Index(
        "ix_review_queue_item_search",
        func.review_queue_item_search_prefixes(
            text("idempotency_key"), text("ledger_entity"), text("context")
        ),
        postgresql_using="gin",
    ),
    # ... and, in the resolved history, a rare match decision or amount range (2026_12_04_2230):
    # read by these, then sorted (a common one walks the list order). Partial, so written once.
    Index(
        "ix_review_queue_item_resolved_match",
        "match_decision",
        "created_at",
        "id",
        postgresql_where=text("state = 'RESOLVED'"),
    ),
    Index(
        "ix_review_queue_item_resolved_abs_amount",
        func.abs(text("variance_amount")),
        postgresql_where=text("state = 'RESOLVED'"),
    ),
    # ... and the open items' amounts, one index per open part of the list (2026_12_07_0610): a rare
    # amount range with no state reads the open rows it finds, not every PENDING row in list order
    # (issue 44). The amount in each predicate keeps every statement that does not compare it (the
    # leases, the gauges) from reading these instead of their own (the migration says why). A lease
    # writes to the second only, a completion to neither.
    Index(
        "ix_review_queue_item_pending_abs_amount",
        func.abs(text("variance_amount")),
        postgresql_where=text("state = 'PENDING' AND abs(variance_amount) IS NOT NULL"),
    ),
    Index(
        "ix_review_queue_item_open_abs_amount",
        func.abs(text("variance_amount")),
        postgresql_where=text("state NOT IN ('PENDING', 'RESOLVED') AND abs(variance_amount) IS NOT NULL"),
    ),
    # ... and, so that a list costs a page and not the history before it (2026_12_04_1530): the
    # PENDING rows by enqueue time (the newest rows, behind all the resolved ones), and one
    # reviewer's decisions in either order. All partial: a lease or a renewal writes to none of them.
    Index(
        "ix_review_queue_item_pending_created", "created_at", "id", postgresql_where=text("state = 'PENDING'")
    ),
    Index(
        "ix_review_queue_item_resolved_by_created",
        "resolved_by",
        "created_at",
        "id",
        postgresql_where=text("resolved_by IS NOT NULL"),
    ),
    Index(
        "ix_review_queue_item_resolved_by_due",
        "resolved_by",
        "due_at",
        "id",
        postgresql_where=text("resolved_by IS NOT NULL"),
    ),
    # The reports (db/reports/) read resolved history through these two; an item enters them once,
    # when it is resolved, so no lease, renewal or release writes to them.
    Index(
        "ix_review_queue_item_resolved_due",
        "due_at",
        postgresql_include=["created_at", "resolved_at", "ledger_entity"],
        postgresql_where=text("state = 'RESOLVED'"),
    ),
    Index(
        "ix_review_queue_item_resolved_at",
        "resolved_at",
        postgresql_include=["created_at", "leased_at", "resolved_by", "approved_by"],
        postgresql_where=text("state = 'RESOLVED'"),
    ),
    # ... and the backlog follows the reopened items still open, or decided in its period, by these
    # (reopened items alone enter them; 2026_12_05_1510).
    Index(
        "ix_review_queue_item_reopened_open", "id", postgresql_where=text("reopened AND state <> 'RESOLVED'")
    ),
    Index(
        "ix_review_queue_item_reopened_resolved",
        "resolved_at",
        postgresql_where=text("reopened AND state = 'RESOLVED'"),
    ),
)


# Append-only: a trigger (see the migration) refuses UPDATE, DELETE and TRUNCATE. Each row
# is written by the same statement as the state change it records. Partitioned by month of `at`
# (alembic/versions/2026_12_05_0200_event_trail_by_month.py): the key holds the partition column.
review_queue_event = Table(
    "review_queue_event",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("item_id", UUID(as_uuid=True), ForeignKey("review_queue_item.id"), nullable=False),
    Column("event", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now(), primary_key=True),
    Column("lease_epoch", BigInteger, nullable=False),
    Column("trace_id", UUID(as_uuid=True), nullable=False),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # The inserting transaction: the sealer chains only events of transactions that have ended.
    Column("xid", Xid8(), nullable=False, server_default=func.pg_current_xact_id()),
    # Of a submission, rejection or release: when the lease it ended began (of a reopening: the
    # lease of the decision it reopened), set by the database
    # (a trigger, alembic/versions/2026_12_04_0900_event_lease_start.py) for the throughput report.
    Column("leased_at", DateTime(timezone=True), nullable=True),
    # The item's changeable columns right after the statement that wrote the event (db/queue/rows.py,
    # AFTER_FIELDS), for the feed and the webhooks; null for events written before issue 42 (the
    # feed shows their item as it is now). Not in the hash chain.
    Column("item_after", JSONB, nullable=True),
    CheckConstraint(
        "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
        " 'QUARANTINED', 'REQUEUED', 'REOPENED', 'REVISED', 'REASSIGNED', 'SUBMITTED_FOR_APPROVAL',"
        " 'APPROVED', 'REJECTED', 'COMMENTED')",
        name="valid_event",
    ),
    Index("ix_review_queue_event_item_id_id", "item_id", "id"),
    Index("ix_review_queue_event_xid_id", "xid", "id"),
    # GET /decisions: one reviewer's decisions, newest first; no other event is in this index.
    Index(
        "ix_review_queue_event_decisions_by_actor",
        "actor",
        "id",
        postgresql_where=text("event IN ('RESOLVED', 'SUBMITTED_FOR_APPROVAL', 'APPROVED', 'REJECTED')"),
    ),
    # The reports (db/reports/): items ever reopened, decisions by time, the holders' other
    # decisions by time, and lease starts (the time from lease to decision). Partial: a RENEWED event
    # enters none of them.
    Index("ix_review_queue_event_reopened", "item_id", postgresql_where=text("event = 'REOPENED'")),
    # /stats: the reopenings committed since the resolved rollup was counted (db/stats.py).
    Index("ix_review_queue_event_reopened_xid", "xid", postgresql_where=text("event = 'REOPENED'")),
    # The throughput report: the reopenings at or after its period's start (2026_12_05_1300).
    Index("ix_review_queue_event_reopened_at", "at", postgresql_where=text("event = 'REOPENED'")),
    # The backlog split by currency: the revisions that changed an item's currency, by time
    # (2026_12_07_0110; db/reports/aging.py's CURRENCY_REVISED).
    Index(
        "ix_review_queue_event_currency_revised",
        "at",
        postgresql_include=["item_id"],
        postgresql_where=text(
            "event = 'REVISED' AND (details -> 'previous' ->> 'currency')"
            " IS DISTINCT FROM (details -> 'current' ->> 'currency')"
        ),
    ),
    Index(
        "ix_review_queue_event_decision_at",
        "at",
        "id",
        postgresql_where=text("event IN ('RESOLVED', 'APPROVED')"),
    ),
    Index(
        "ix_review_queue_event_lease_start",
        "item_id",
        "id",
        postgresql_include=["at"],
        postgresql_where=text("event IN ('LEASED', 'REASSIGNED')"),
    ),
    Index(
        "ix_review_queue_event_other_work",
        "at",
        "id",
        postgresql_include=["item_id", "actor", "event", "leased_at"],
        postgresql_where=text(
            "event IN ('SUBMITTED_FOR_APPROVAL', 'REJECTED')"
            " OR (event = 'RELEASED' AND NOT details ? 'override')"
        ),
    ),
    postgresql_partition_by="RANGE (at)",
)

# /stats' RESOLVED count without counting history (db/stats.py): one row, the items that were
# RESOLVED with resolved_at before `edge` as of the snapshot `counted_in`. Moved forward by the
# reclaimer's schedule; the application role may read and update it, never add or delete a row.
review_queue_resolved_rollup = Table(
    "review_queue_resolved_rollup",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("edge", DateTime(timezone=True), nullable=False),
    Column("resolved", BigInteger, nullable=False),
    Column("counted_in", PgSnapshot(), nullable=False),
    Column("rolled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("one", name="one_row"),
    CheckConstraint("resolved >= 0", name="not_negative"),
)
