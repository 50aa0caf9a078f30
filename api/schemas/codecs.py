"""Codecs of the opaque strings the API hands out: lease tokens and list cursors."""

import base64
import binascii
from datetime import UTC, datetime, timedelta
from typing import Annotated
from uuid import UUID

from pydantic import Field, StringConstraints

from db.vocabulary import NO_LEASE


def encode_lease_token(item_id: UUID, lease_nonce: UUID) -> str:
    """The fencing token of one lease of one item: its id and the lease's random nonce.

    Unforgeable without reading the database: the nonce is 122 random bits drawn by the lease
    statement (gen_random_uuid), stored with the lease and never shown to anyone but the holder.
    """
    return base64.urlsafe_b64encode(item_id.bytes + lease_nonce.bytes).decode().rstrip("=")


def lease_nonce_for(item_id: UUID, token: str) -> UUID:
    """The nonce a token claims for item_id; NO_LEASE for a token that cannot be one of its leases
    (malformed, another item's, or the old epoch form), so the guard refuses it with 409."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return NO_LEASE
    if len(raw) != 32 or raw[:16] != item_id.bytes:
        return NO_LEASE
    return UUID(bytes=raw[16:])


LeaseToken = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]{1,64}$"),
    Field(description="The `lease_token` of your lease; refused (409) once the item has been leased again."),
]


# A keyset position: microseconds since the Unix epoch of the order's timestamp (created_at, or
# due_at for sort=due_at: years up to 2999, hence 17 digits), and the id. Every string of this
# form is a valid position (the items after it) in either order, so the pattern is the whole
# contract.
CURSOR_PATTERN = r"^[0-9]{1,17}-[0-9a-f]{32}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode_cursor(created_at: datetime, item_id: UUID) -> str:
    return f"{(created_at - _EPOCH) // _MICROSECOND}-{item_id.hex}"


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The position of a cursor that matches CURSOR_PATTERN (the request model checks it)."""
    micros, item_id = cursor.split("-")
    return _EPOCH + int(micros) * _MICROSECOND, UUID(hex=item_id)


# An events cursor is the id of the last event of the page (an identity column: it only grows).
EVENT_CURSOR_PATTERN = r"^[1-9][0-9]{0,17}$"


def encode_event_cursor(event_id: int) -> str:
    return str(event_id)


def decode_event_cursor(cursor: str) -> int:
    """The position of a cursor that matches EVENT_CURSOR_PATTERN (the request model checks it)."""
    return int(cursor)
