"""The webhooks (docs/integrations.md): the subscriptions, their delivery attempts, and the events
held behind a failed one."""

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
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from db.tables.base import Xid8, metadata

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
