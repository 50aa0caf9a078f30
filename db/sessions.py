"""Reviewer-desk sessions: made from a bearer token, found by the cookie's hash, deleted on sign-out."""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Interval, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from db.tables import api_token, desk_session
from db.tokens import LIVE, hash_token


@dataclass(frozen=True, slots=True)
class DeskSession:
    subject: str
    role: str
    csrf_token: str


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


async def create_session(
    conn: AsyncConnection, *, token: str, ttl: timedelta
) -> tuple[str, DeskSession] | None:
    """A new session for a live token (neither revoked nor expired): (the cookie value, the
    session); None otherwise. The session ends no later than the token does."""
    row = (
        await conn.execute(
            select(api_token.c.id, api_token.c.subject, api_token.c.role, api_token.c.expires_at).where(
                api_token.c.token_hash == hash_token(token), LIVE
            )
        )
    ).first()
    if row is None:
        return None
    # Sweep expired sessions here, where sessions are made, rather than in a job of its own.
    await conn.execute(desk_session.delete().where(desk_session.c.expires_at < func.now()))
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    await conn.execute(
        desk_session.insert().values(
            id_hash=_hash(session_id),
            token_id=row.id,
            csrf_token=csrf,
            # LEAST ignores a NULL expiry (a token that never expires).
            expires_at=func.least(func.now() + bindparam("ttl", ttl, type_=Interval), row.expires_at),
        )
    )
    return session_id, DeskSession(row.subject, row.role, csrf)


_FIND = (
    select(api_token.c.subject, api_token.c.role, desk_session.c.csrf_token)
    .join(api_token, api_token.c.id == desk_session.c.token_id)
    .where(
        desk_session.c.id_hash == bindparam("id_hash"),
        desk_session.c.expires_at > func.now(),
        # Revoking or expiring the token ends its sessions at once.
        LIVE,
    )
)


async def find_session(conn: AsyncConnection, *, session_id: str) -> DeskSession | None:
    row = (await conn.execute(_FIND, {"id_hash": _hash(session_id)})).first()
    return DeskSession(row.subject, row.role, row.csrf_token) if row is not None else None


async def delete_session(conn: AsyncConnection, *, session_id: str) -> None:
    await conn.execute(desk_session.delete().where(desk_session.c.id_hash == _hash(session_id)))
