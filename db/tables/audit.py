"""The audit trail's hash chain over the events, and the record of each archive that moved its
oldest part to files (docs/audit.md)."""

from sqlalchemy import BigInteger, CheckConstraint, Column, DateTime, Identity, LargeBinary, Table, Text, func

from db.tables.base import Xid8, metadata

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
