"""Dependencies: the one transaction per request, and who is calling."""

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, TypeVar

from cachetools import TTLCache
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api import session
from api.errors import ProblemError
from api.settings import Settings
from db.engine import transaction
from db.tokens import Principal, find_principal, hash_token


async def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def _transaction(request: Request) -> AsyncIterator[AsyncConnection]:
    engine: AsyncEngine = request.app.state.engine
    settings: Settings = request.app.state.settings
    async with transaction(
        engine,
        lock_timeout_ms=settings.pg_lock_timeout_ms,
        statement_timeout_ms=settings.statement_timeout_ms,
    ) as conn:
        request.state.conn = conn  # for the token lookup, see _find_principal
        try:
            yield conn
        finally:
            request.state.conn = None


# scope="function": the transaction commits before the response is sent, so a client never
# sees a 200 for a change that then fails to commit. Routes and db/ never commit themselves.
Conn = Annotated[AsyncConnection, Depends(_transaction, scope="function")]

_bearer = HTTPBearer(auto_error=False, description="A token from `review-queue token create`.")


def _unauthenticated(detail: str) -> ProblemError:
    return ProblemError("UNAUTHENTICATED", detail, headers={"WWW-Authenticate": "Bearer"})


T = TypeVar("T")


async def _lookup(request: Request, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    # The request's transaction when the route has already opened one (Conn); otherwise a short
    # transaction of its own: POST /leases holds no connection while it waits for work, and
    # must not hold one for its authentication either.
    opened: AsyncConnection | None = getattr(request.state, "conn", None)
    if opened is not None:
        return await read(opened)
    settings: Settings = request.app.state.settings
    async with transaction(
        request.app.state.engine,
        lock_timeout_ms=settings.pg_lock_timeout_ms,
        statement_timeout_ms=settings.statement_timeout_ms,
    ) as conn:
        return await read(conn)


async def _find_principal(request: Request, token: str) -> Principal | None:
    return await _lookup(request, lambda conn: find_principal(conn, token=token))


async def _principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None and session.COOKIE in request.cookies:
        # The reviewer desk: a session cookie instead of a bearer token (CSRF-checked there).
        from_cookie = await session.principal_from_cookie(request, _lookup)
        if from_cookie is None:
            raise _unauthenticated("the desk session has ended; sign in again")
        return from_cookie
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthenticated("an Authorization: Bearer <token> header is required")
    token = credentials.credentials
    cache: TTLCache[str, Principal] | None = request.app.state.token_cache
    key = hash_token(token)
    principal = cache.get(key) if cache is not None else None
    if principal is None:
        principal = await _find_principal(request, token)
        if principal is None:
            raise _unauthenticated("the token is unknown or revoked")
        if cache is not None:
            cache[key] = principal
    return principal


def _require(*roles: str) -> object:
    async def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if principal.role not in roles:
            raise ProblemError(
                "FORBIDDEN",
                f"role {principal.role!r} may not do this; needs one of {', '.join(roles)}",
                extra={"required_roles": list(roles)},
            )
        return principal

    return Depends(check)


async def _metrics_scraper(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    # A scraper gets its own token (REVIEW_QUEUE_METRICS_TOKEN) so Prometheus never needs an
    # API token; without one configured, an admin token is required.
    expected: str | None = request.app.state.settings.metrics_token
    if expected is None:
        principal = await _principal(request, credentials)
        if principal.role != "admin":
            raise ProblemError("FORBIDDEN", "metrics need an admin token, or set REVIEW_QUEUE_METRICS_TOKEN")
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise _unauthenticated("/metrics needs Authorization: Bearer <REVIEW_QUEUE_METRICS_TOKEN>")


MetricsScraper = Depends(_metrics_scraper)

AnyRole = Annotated[Principal, _require("reviewer", "ingest", "admin")]
Reviewer = Annotated[Principal, _require("reviewer", "admin")]
Ingest = Annotated[Principal, _require("ingest", "admin")]
Admin = Annotated[Principal, _require("admin")]
