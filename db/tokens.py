"""Bearer tokens: only their sha256 is stored; the subject is the reviewer identity."""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, exists, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

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


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(conn: AsyncConnection, *, subject: str, role: str) -> str:
    """Store a new token for subject and return it; this is the only time it exists in clear."""
    token = "rq_" + secrets.token_urlsafe(32)
    await conn.execute(api_token.insert().values(subject=subject, role=role, token_hash=hash_token(token)))
    return token


async def revoke_tokens(conn: AsyncConnection, *, subject: str) -> int:
    result = await conn.execute(
        api_token.update()
        .where(api_token.c.subject == subject, api_token.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    return result.rowcount


async def list_tokens(conn: AsyncConnection) -> list[TokenInfo]:
    result = await conn.execute(
        select(
            api_token.c.id,
            api_token.c.subject,
            api_token.c.role,
            api_token.c.created_at,
            api_token.c.revoked_at,
        ).order_by(api_token.c.id)
    )
    return [TokenInfo(*r) for r in result]


async def any_token_exists(conn: AsyncConnection) -> bool:
    return bool(await conn.scalar(select(exists().select_from(api_token))))


_FIND = select(api_token.c.subject, api_token.c.role).where(
    api_token.c.token_hash == bindparam("token_hash"), api_token.c.revoked_at.is_(None)
)


async def find_principal(conn: AsyncConnection, *, token: str) -> Principal | None:
    row = (await conn.execute(_FIND, {"token_hash": hash_token(token)})).first()
    return Principal(row.subject, row.role) if row is not None else None
