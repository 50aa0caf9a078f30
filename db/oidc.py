"""Sign-in with an OpenID Connect provider: the states used, the names bound, and the desk sessions.

Apart from db/sessions.py (the token sessions): an OIDC session belongs to the provider's identity
(subject and role as mapped at sign-in), not to a token row. Its cookie value starts with
SESSION_PREFIX, which a token session's never does, so a cookie names its table by itself.
"""

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import DateTime, Interval, bindparam, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from db.sessions import DeskSession
from db.tables import oidc_identity, oidc_session, oidc_used_state

SESSION_PREFIX = "oidc."  # secrets.token_urlsafe never makes a "."


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


async def use_state(conn: AsyncConnection, *, state: str, keep: timedelta) -> bool:
    """Record a sign-in's state as used, for `keep`; False when it was already (a replay). Only a
    callback with a cookie the service sealed gets here, and nothing caps this table, so no number
    of strangers' sign-ins can refuse anyone else's (as the capped oidc_login once did)."""
    await conn.execute(oidc_used_state.delete().where(oidc_used_state.c.expires_at < func.now()))
    recorded = await conn.scalar(
        insert(oidc_used_state)
        .values(state_hash=_hash(state), expires_at=func.now() + bindparam("keep", keep, type_=Interval))
        .on_conflict_do_nothing(index_elements=[oidc_used_state.c.state_hash])
        .returning(oidc_used_state.c.state_hash)
    )
    return recorded is not None


async def bind_identity(conn: AsyncConnection, *, subject: str, issuer: str, provider_subject: str) -> bool:
    """True when subject belongs to this account of the provider: bound to it now (the first use of
    the name) or before; False when another account holds the name."""
    await conn.execute(
        insert(oidc_identity)
        .values(subject=subject, issuer=issuer, provider_subject=provider_subject)
        .on_conflict_do_nothing(index_elements=[oidc_identity.c.subject])
    )
    owner = (
        await conn.execute(
            select(oidc_identity.c.issuer, oidc_identity.c.provider_subject).where(
                oidc_identity.c.subject == subject
            )
        )
    ).one()
    return (owner.issuer, owner.provider_subject) == (issuer, provider_subject)


async def create_session(
    conn: AsyncConnection, *, subject: str, role: str, id_token: str, ends_by: datetime, ttl: timedelta
) -> tuple[str, DeskSession, int]:
    """A desk session for the provider's identity, ending at ends_by (the ID token's expiry) or ttl
    from now (the database clock), whichever is first: (the cookie value, the session, its seconds)."""
    await conn.execute(oidc_session.delete().where(oidc_session.c.expires_at < func.now()))
    session_id, csrf = SESSION_PREFIX + secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    expires_at = func.least(
        bindparam("ends_by", ends_by, type_=DateTime(timezone=True)),
        func.now() + bindparam("ttl", ttl, type_=Interval),
    )
    left = func.floor(func.extract("epoch", oidc_session.c.expires_at - func.now()))
    seconds = await conn.scalar(
        oidc_session.insert()
        .values(
            id_hash=_hash(session_id), subject=subject, role=role, csrf_token=csrf, id_token=id_token,
            expires_at=expires_at,
        )
        .returning(func.greatest(0, left))
    )  # fmt: skip
    return session_id, DeskSession(subject, role, csrf), int(seconds or 0)


_FIND = select(oidc_session.c.subject, oidc_session.c.role, oidc_session.c.csrf_token).where(
    oidc_session.c.id_hash == bindparam("id_hash"), oidc_session.c.expires_at > func.now()
)


async def find_session(conn: AsyncConnection, *, session_id: str) -> DeskSession | None:
    row = (await conn.execute(_FIND, {"id_hash": _hash(session_id)})).first()
    return DeskSession(row.subject, row.role, row.csrf_token) if row is not None else None


async def delete_session(conn: AsyncConnection, *, session_id: str) -> str | None:
    """End the session; its ID token (for the provider's sign-out), None when there was none."""
    id_token: str | None = await conn.scalar(
        oidc_session.delete()
        .where(oidc_session.c.id_hash == _hash(session_id))
        .returning(oidc_session.c.id_token)
    )
    return id_token
