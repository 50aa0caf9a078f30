"""The reviewer desk's sign-in: a bearer token exchanged for an HttpOnly session cookie.

The page never keeps the token: `POST /session` turns it into a random session id in an
HttpOnly, SameSite=Strict cookie (Secure under HTTPS), so a script injected into the page cannot
read it. Only the id's sha256 is stored (table desk_session), and signing out deletes the row.

Cookie-authenticated writes are CSRF-proof twice over: SameSite=Strict keeps the cookie off
cross-site requests, and every unsafe method must carry `X-CSRF-Token` equal to the session's
own value (the page gets it from POST/GET /session; another site cannot read it), with an
`Origin`, when the browser sends one, equal to this service's.
"""

import secrets
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from fastapi import Request, Response
from sqlalchemy.ext.asyncio import AsyncConnection

from api.errors import ProblemError
from db import oidc as oidc_sessions
from db.sessions import DeskSession, delete_session, find_session
from db.tokens import Principal

COOKIE = "rq_session"
CSRF_HEADER = "X-CSRF-Token"
TTL = timedelta(hours=12)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

T = TypeVar("T")
Lookup = Callable[[Request, Callable[[AsyncConnection], Awaitable[T]]], Awaitable[T]]


def set_cookie(response: Response, request: Request, session_id: str, *, max_age: int | None = None) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(TTL.total_seconds()) if max_age is None else max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )


def check_origin(request: Request) -> None:
    """A browser names the page that sent a request in Origin; it must be this service."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise ProblemError("CSRF_REJECTED", f"requests from {origin[:100]!r} may not use the desk session")


def check_csrf(request: Request, session: DeskSession) -> None:
    if request.method in SAFE_METHODS:
        return
    check_origin(request)
    sent = request.headers.get(CSRF_HEADER, "")
    if not secrets.compare_digest(sent.encode(), session.csrf_token.encode()):
        raise ProblemError("CSRF_REJECTED", f"a write with the session cookie needs the {CSRF_HEADER} header")


async def session_of(request: Request, lookup: Lookup[DeskSession | None]) -> DeskSession | None:
    session_id = request.cookies.get(COOKIE)
    if not session_id or len(session_id) > 100:
        return None

    async def find(conn: AsyncConnection) -> DeskSession | None:
        # A session opened by the identity provider (api/routes/oidc.py) says so in its id.
        if session_id.startswith(oidc_sessions.SESSION_PREFIX):
            return await oidc_sessions.find_session(conn, session_id=session_id)
        return await find_session(conn, session_id=session_id)

    return await lookup(request, find)


async def end_session(conn: AsyncConnection, session_id: str) -> str | None:
    """Delete the session; the ID token of one the identity provider opened (for its sign-out)."""
    if session_id.startswith(oidc_sessions.SESSION_PREFIX):
        return await oidc_sessions.delete_session(conn, session_id=session_id)
    await delete_session(conn, session_id=session_id)
    return None


async def principal_from_cookie(request: Request, lookup: Lookup[DeskSession | None]) -> Principal | None:
    """The session's identity, CSRF-checked for writes; None when the cookie names no live session."""
    session = await session_of(request, lookup)
    if session is None:
        return None
    check_csrf(request, session)
    request.state.desk_session = session
    return Principal(session.subject, session.role)
