"""Who may call: the API tokens, and the reviewer desk's sessions signed in with one."""

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Table,
    Text,
    func,
)

from db.tables.base import metadata
from db.vocabulary import SUBJECT_CHECK

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
