"""Sign-in with the company's OpenID Connect provider: the used states, whose account each subject
is, and the desk sessions it signed in."""

from sqlalchemy import CheckConstraint, Column, DateTime, Index, Table, Text, func

from db.tables.base import metadata
from db.vocabulary import SUBJECT_CHECK

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
