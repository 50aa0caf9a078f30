"""The schema as SQLAlchemy Core tables. Alembic owns the real DDL; `alembic check` keeps the two equal.

The reports' kept figures are in db/reports/tables.py, on the same `metadata`; the words the
contract and the CHECK constraints share are in db/vocabulary.py."""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.dialects.postgresql.base import ischema_names
from sqlalchemy.types import UserDefinedType

from db.vocabulary import FALLBACK_DUE, SUBJECT_CHECK


class Xid8(UserDefinedType[str]):
    """PostgreSQL's 64-bit transaction id (`pg_current_xact_id()`), read and written as text."""

    cache_ok = True

    def get_col_spec(self, **_: object) -> str:
        return "xid8"


class PgSnapshot(UserDefinedType[str]):
    """PostgreSQL's `pg_snapshot` (`pg_current_snapshot()`): which transactions a count saw."""

    cache_ok = True

    def get_col_spec(self, **_: object) -> str:
        return "pg_snapshot"


# Reflection (alembic check) knows the types by name, instead of warning and skipping them.
ischema_names["xid8"] = Xid8
ischema_names["pg_snapshot"] = PgSnapshot


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

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

# The hash chain over the events (docs/audit.md): gapless seq, each hash over the previous one
# and the event's canonical encoding. Appended by the sealer only; append-only like the events.
review_queue_chain = Table(
    "review_queue_chain",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    # No foreign key (see the migration): `audit verify` reports a sealed event that is gone.
    Column("event_id", BigInteger, nullable=False, unique=True),
    Column("hash", LargeBinary, nullable=False),
    Column("sealed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("seq > 0", name="positive_seq"),
    CheckConstraint("length(hash) = 32", name="sha256"),
)

# Where the live chain starts: each archive (db/archive.py) moved seq first_seq..through_seq, with
# their events and the items left with none, to files; the live chain continues from through_hash.
# Appended by review_queue_archive_apply (the schema owner) only; append-only.
review_queue_archive = Table(
    "review_queue_archive",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("cutoff", DateTime(timezone=True), nullable=False),
    Column("first_seq", BigInteger, nullable=False),
    Column("through_seq", BigInteger, nullable=False, unique=True),
    Column("through_hash", LargeBinary, nullable=False),
    Column("through_xid", Xid8(), nullable=False),
    Column("through_event_id", BigInteger, nullable=False),
    Column("events", BigInteger, nullable=False),
    Column("items", BigInteger, nullable=False),
    Column("events_sha256", Text, nullable=False),
    Column("items_sha256", Text, nullable=False),
    Column("archived_by", Text, nullable=False),
    Column("archived_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("first_seq >= 1 AND through_seq >= first_seq", name="range"),
    CheckConstraint("length(through_hash) = 32", name="sha256"),
)

# The resolution catalogue, managed by admins (PUT /resolutions/{code}). Deactivated, never
# deleted: an old decision keeps its meaning. Items keep their resolution as text (no foreign
# key), so rows from before the catalogue stay as they are.
resolution_code = Table(
    "resolution_code",
    metadata,
    Column("code", Text, primary_key=True),
    Column("label", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("requires_note", Boolean, nullable=False, server_default=text("false")),
    # A completion with abs(variance_amount) at or above it needs an approver; NULL: never.
    Column("approval_threshold", Numeric(18, 2, asdecimal=True)),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("code ~ '^[A-Z][A-Z0-9_]{0,63}$'", name="valid_code"),
    CheckConstraint("approval_threshold IS NULL OR approval_threshold >= 0", name="threshold_not_negative"),
)

# The catalogue-wide approval threshold (materiality): one row. A completion at or above it by
# absolute amount needs an approver, whatever its code, unless the code's own threshold is lower.
approval_policy = Table(
    "approval_policy",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("materiality_threshold", Numeric(18, 2, asdecimal=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_by", Text),  # the admin who set it; NULL: the migration's default
    CheckConstraint("id", name="one_row"),
    CheckConstraint("materiality_threshold >= 0", name="threshold_not_negative"),
)

api_token = Table(
    "api_token",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("subject", Text, nullable=False),
    Column("role", Text, nullable=False),
    # sha256 of the bearer token; the token itself is shown once and never stored.
    Column("token_hash", Text, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True)),
    # NULL: never expires. The lookup (db.tokens.find_principal) refuses a token past it.
    Column("expires_at", DateTime(timezone=True)),
    CheckConstraint(
        "role IN ('reviewer', 'approver', 'ingest', 'auditor', 'admin', 'integration')", name="valid_role"
    ),
    CheckConstraint(SUBJECT_CHECK, name="valid_subject"),
    Index("ix_api_token_subject", "subject"),
)

# Reviewer-desk sign-ins: the browser holds a random session id in an HttpOnly cookie, the
# database only its sha256. A session lives no longer than its token: revoking the token (or
# signing out, which deletes the row) ends it.
desk_session = Table(
    "desk_session",
    metadata,
    Column("id_hash", Text, primary_key=True),
    Column("token_id", BigInteger, ForeignKey("api_token.id", ondelete="CASCADE"), nullable=False),
    # Sent back by the page in X-CSRF-Token on every write; a cross-site form cannot know it.
    Column("csrf_token", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_desk_session_expires_at", "expires_at"),
)


# Webhook subscriptions (docs/integrations.md): where each stands in the change feed, its retry
# state, and the claim one deliverer holds on it. Deactivated, never deleted.
webhook_subscription = Table(
    "webhook_subscription",
    metadata,
    Column("name", Text, primary_key=True),
    Column("url", Text, nullable=False),
    # Webhook types (item.resolved, ...), never empty.
    Column("event_types", ARRAY(Text), nullable=False),
    # Fernet-encrypted `whsec_...` (docs/security.md): the HMAC needs the secret itself.
    Column("secret", LargeBinary, nullable=False),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_reason", Text),
    # Every feed position up to (cursor_xid, cursor_id) has been delivered, matched no type, or
    # waits in webhook_held behind a failed event of its item.
    Column("cursor_xid", Xid8(), nullable=False),
    Column("cursor_id", BigInteger, nullable=False),
    # The retry state of its held events (webhook_held): the most attempts, the oldest failure.
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("failing_since", DateTime(timezone=True)),
    # Retrying stopped after REVIEW_QUEUE_WEBHOOK_GIVE_UP_H: failing until redeliver resumes it.
    Column("gave_up_at", DateTime(timezone=True)),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_error", Text),
    # One deliverer's claim, taken with FOR UPDATE SKIP LOCKED in a short transaction and fenced
    # by the nonce: no transaction (and no transaction id) stays open while a request is in flight.
    Column("claimed_by", Text),
    Column("claim_nonce", UUID(as_uuid=True)),
    Column("claim_expires_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'", name="valid_name"),
    CheckConstraint("url ~ '^https?://'", name="http_url"),
    CheckConstraint("attempts >= 0", name="attempts_not_negative"),
)

# Every attempt at a delivery, newest last; the deliverer keeps the last few per subscription.
webhook_delivery = Table(
    "webhook_delivery",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("subscription", Text, ForeignKey("webhook_subscription.name"), nullable=False),
    Column("event_id", BigInteger, nullable=False),
    Column("webhook_id", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("attempted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("outcome", Text, nullable=False),
    Column("status_code", Integer),
    Column("latency_ms", Float),
    Column("error", Text),
    CheckConstraint("outcome IN ('delivered', 'failed')", name="valid_outcome"),
    Index("ix_webhook_delivery_subscription_id", "subscription", "id"),
)

# The events a subscription's cursor has passed that are not delivered yet: per held item, the one
# that failed (with its retry state) and the item's later events behind it, in id order. Only that
# item waits; the subscription's other items flow on (docs/integrations.md).
webhook_held = Table(
    "webhook_held",
    metadata,
    Column("subscription", Text, ForeignKey("webhook_subscription.name"), primary_key=True),
    Column("event_id", BigInteger, primary_key=True),
    Column("item_id", UUID(as_uuid=True), nullable=False),
    # On the item's first held event only: its failed attempts, and when to try it again.
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("failing_since", DateTime(timezone=True)),
    Column("next_attempt_at", DateTime(timezone=True)),
    Column("last_error", Text),
    CheckConstraint("attempts >= 0", name="attempts_not_negative"),
    Index("ix_webhook_held_subscription_item_id_event_id", "subscription", "item_id", "event_id"),
)

# Sign-in with the company's OpenID Connect provider (api/oidc.py). A sign-in in progress lives in
# its browser's sealed cookie only; its `state` (the sha256) is recorded here when the callback uses
# it, so it is good once. Kept a while longer than the cookie lives, then swept.
oidc_used_state = Table(
    "oidc_used_state",
    metadata,
    Column("state_hash", Text, primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_oidc_used_state_expires_at", "expires_at"),
)

# Which account of the provider (issuer, its `sub`) a subject it signed in belongs to: the first one
# to use the name keeps it, so two accounts whose username claims fold to one name never act as one.
oidc_identity = Table(
    "oidc_identity",
    metadata,
    Column("subject", Text, primary_key=True),
    Column("issuer", Text, nullable=False),
    Column("provider_subject", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(SUBJECT_CHECK, name="valid_subject"),
)

# Desk sessions of people signed in by the provider: like desk_session, but the identity is the
# provider's (subject and role as mapped at sign-in), not a token's. It ends no later than the ID
# token it was made from; the ID token is kept for the provider's sign-out (id_token_hint). Apart
# from desk_session so that token sessions stay exactly as they are. No CHECK on role: it comes from
# REVIEW_QUEUE_OIDC_ROLE_MAP, which accepts only db.vocabulary.ROLES, so a new role needs no migration here.
oidc_session = Table(
    "oidc_session",
    metadata,
    Column("id_hash", Text, primary_key=True),
    Column("subject", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("csrf_token", Text, nullable=False),
    Column("id_token", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    CheckConstraint(SUBJECT_CHECK, name="valid_subject"),
    Index("ix_oidc_session_expires_at", "expires_at"),
)


# Exchange rates into the base currency (2026_12_06_1900): one row per rate set, never changed (the
# application role may only insert and read). The rate of a currency at an instant is the last one
# set before it; the base currency's is 1 by definition and never stored.
fx_rate = Table(
    "fx_rate",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("currency", Text, nullable=False),
    Column("rate", Numeric(asdecimal=True), nullable=False),  # one unit of `currency` in the base currency
    Column("set_by", Text, nullable=False),
    Column("set_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_code"),
    CheckConstraint("rate > 0 AND rate = round(rate, 10) AND rate < 1e12", name="rate_bounds"),
    Index("ix_fx_rate_currency_set_at", "currency", "set_at", "id"),
)
