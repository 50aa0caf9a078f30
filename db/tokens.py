"""Bearer tokens: only their sha256 is stored; the subject is the reviewer identity."""

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Interval, and_, bindparam, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert, Update

from db.tables import api_token


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    role: str


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: int
    subject: str
    role: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None
    expired: bool


SUBJECT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
RESERVED_SUBJECTS = ("me", "reclaimer")


def fold_subject(subject: str) -> str:
    """An identity as it is stored and compared: case-folded, so `caseyX` and `CaseyX` are one.

    `str.lower()`, the same fold as PostgreSQL's `lower()` in the CHECKs and the segregation of
    duties guards: subjects are ASCII, where the two agree whatever the collation. (`casefold()`
    would differ from PostgreSQL on non-ASCII text, so neither side uses it.)"""
    return subject.lower()


def same_identity(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and fold_subject(a) == fold_subject(b)


def check_subject(subject: str) -> str:
    """The subject, folded, when it may name a token, else ValueError saying why
    (db.vocabulary.SUBJECT_CHECK)."""
    if not SUBJECT_PATTERN.fullmatch(subject):
        raise ValueError(
            f"subject {subject!r} must be 1-128 characters: letters, digits and . _ @ + -,"
            " starting with a letter or digit"
        )
    lowered = fold_subject(subject)
    if lowered in RESERVED_SUBJECTS or lowered.startswith("reclaimer@"):
        raise ValueError(
            f"subject {subject!r} is reserved: `me` means the caller in leased_by=me, and"
            " `reclaimer` / `reclaimer@<host>` is the reclaimer in the audit trail"
        )
    return lowered


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(
    conn: AsyncConnection, *, subject: str, role: str, expires_in: timedelta | None = None
) -> str:
    """Store a new token for subject (folded: see fold_subject) and return it; this is the only
    time it exists in clear.
    With expires_in, it stops working that long from now (the database clock)."""
    token, statement = new_token(subject=subject, role=role, expires_in=expires_in)
    await conn.execute(statement)
    return token


def new_token(*, subject: str, role: str, expires_in: timedelta | None = None) -> tuple[str, Insert]:
    """A new token and the INSERT that stores it (create_token runs it; the tests run it on a
    connection they already hold)."""
    subject = check_subject(subject)
    token = "rq_" + secrets.token_urlsafe(32)
    expires_at = func.now() + bindparam("expires_in", expires_in, Interval) if expires_in else None
    return token, api_token.insert().values(
        subject=subject, role=role, token_hash=hash_token(token), expires_at=expires_at
    )


async def revoke_tokens(
    conn: AsyncConnection, *, subject: str | None = None, token_id: int | None = None
) -> int:
    """Revoke the subject's active tokens, or the one token with this id; how many were revoked."""
    result = await conn.execute(revocation(subject=subject, token_id=token_id))
    return result.rowcount


def revocation(*, subject: str | None = None, token_id: int | None = None) -> Update:
    """The UPDATE revoke_tokens runs (the tests run it on a connection they already hold)."""
    if (subject is None) == (token_id is None):
        raise ValueError("revoke by subject or by id")
    which = (
        api_token.c.subject == fold_subject(subject) if subject is not None else api_token.c.id == token_id
    )
    return api_token.update().where(which, api_token.c.revoked_at.is_(None)).values(revoked_at=func.now())


async def list_tokens(conn: AsyncConnection) -> list[TokenInfo]:
    result = await conn.execute(
        select(
            api_token.c.id,
            api_token.c.subject,
            api_token.c.role,
            api_token.c.created_at,
            api_token.c.revoked_at,
            api_token.c.expires_at,
            func.coalesce(api_token.c.expires_at <= func.now(), False),
        ).order_by(api_token.c.id)
    )
    return [TokenInfo(*r) for r in result]


async def any_token_exists(conn: AsyncConnection) -> bool:
    return bool(await conn.scalar(select(exists().select_from(api_token))))


# A token that works now: not revoked, not expired (by the database clock). Bearer calls and the
# desk's sessions (db/sessions.py) both ask exactly this.
LIVE = and_(
    api_token.c.revoked_at.is_(None),
    or_(api_token.c.expires_at.is_(None), api_token.c.expires_at > func.now()),
)
_FIND = select(api_token.c.subject, api_token.c.role).where(
    api_token.c.token_hash == bindparam("token_hash"), LIVE
)


async def find_principal(conn: AsyncConnection, *, token: str) -> Principal | None:
    row = (await conn.execute(_FIND, {"token_hash": hash_token(token)})).first()
    return Principal(row.subject, row.role) if row is not None else None
