"""Sign-in with an OpenID Connect provider: sign-ins in progress, and the desk sessions they open.

Apart from db/sessions.py (the token sessions): an OIDC session belongs to the provider's identity
(subject and role as mapped at sign-in), not to a token row. Its cookie value starts with
SESSION_PREFIX, which a token session's never does, so a cookie names its table by itself.
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import DateTime, Interval, bindparam, func, literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from db.sessions import DeskSession
from db.tables import oidc_identity, oidc_login, oidc_session

SESSION_PREFIX = "oidc."  # secrets.token_urlsafe never makes a "."
# Sign-ins in progress are written before anyone is authenticated: past this many, a new one is
# refused (None) rather than letting a flood of GET /auth/oidc/login grow the table without bound.
MAX_PENDING_LOGINS = 10_000


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class PendingLogin:
    nonce: str
    code_verifier: str


async def start_login(
    conn: AsyncConnection, *, state: str, browser: str, nonce: str, code_verifier: str, ttl: timedelta
) -> bool:
    """Keep a sign-in until its callback; False when too many are in progress."""
    await conn.execute(oidc_login.delete().where(oidc_login.c.expires_at < func.now()))
    pending = select(func.count()).select_from(oidc_login).scalar_subquery()
    values = select(
        literal(_hash(state)),
        literal(_hash(browser)),
        literal(nonce),
        literal(code_verifier),
        func.now() + bindparam("ttl", ttl, type_=Interval),
    ).where(pending < MAX_PENDING_LOGINS)
    inserted = await conn.scalar(
        oidc_login.insert()
        .from_select(["state_hash", "browser_hash", "nonce", "code_verifier", "expires_at"], values)
        .returning(oidc_login.c.state_hash)
    )
    return inserted is not None


async def take_login(conn: AsyncConnection, *, state: str, browser: str | None) -> PendingLogin | None:
    """The sign-in this state belongs to, deleted as it is read (a state is presented once); None
    when there is none, it expired, or another browser (or none) started it: deleted all the same."""
    row = (
        await conn.execute(
            oidc_login.delete()
            .where(oidc_login.c.state_hash == _hash(state))
            .returning(
                oidc_login.c.nonce,
                oidc_login.c.code_verifier,
                oidc_login.c.browser_hash,
                oidc_login.c.expires_at > func.now(),
            )
        )
    ).first()
    if row is None or not row[3]:
        return None
    if browser is None or not secrets.compare_digest(row.browser_hash, _hash(browser)):
        return None
    return PendingLogin(row.nonce, row.code_verifier)


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
