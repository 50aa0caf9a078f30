"""Dependencies: the one transaction per request, and who is calling."""

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated, TypeVar

from cachetools import TTLCache
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncConnection

from api import session
from api.errors import ProblemError
from api.introspection import Introspection, looks_opaque
from api.metrics import AUTH_FAILURES
from api.oidc import OidcProvider, ProviderUnavailable
from api.oidc_claims import Refused
from api.settings import Settings
from db.engine import OneRoundTrip, transaction, unit_of_work
from db.oidc import bind_identity
from db.tokens import Principal, find_principal, hash_token
from db.unit import Transaction


async def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def _limits(request: Request) -> dict[str, int]:
    settings: Settings = request.app.state.settings
    return {
        "lock_timeout_ms": settings.pg_lock_timeout_ms,
        "statement_timeout_ms": settings.statement_timeout_ms,
    }


def request_transaction(request: Request) -> AbstractAsyncContextManager[AsyncConnection]:
    """A transaction on the app's engine with the configured lock and statement timeouts: what
    `Conn` holds for a request, and what a route that needs its own transactions opens."""
    return transaction(request.app.state.engine, **_limits(request))


def request_read_transaction(request: Request) -> AbstractAsyncContextManager[AsyncConnection]:
    """`request_transaction` on the read engine: REVIEW_QUEUE_READ_DATABASE_URL (a standby, up to its
    replication lag behind) when set, else the app's engine. For lag-tolerant reads only."""
    return transaction(request.app.state.read_engine, **_limits(request))


def request_unit(request: Request) -> AbstractAsyncContextManager[Transaction]:
    """`request_transaction` as a unit of work (db/unit.py), for the queue's functions: what `Work`
    holds for a request. The reports of its changes are emitted after its COMMIT, never without it."""
    return unit_of_work(request.app.state.engine, **_limits(request))


_bearer = HTTPBearer(
    auto_error=False,
    description=(
        "A token from `review-queue token create`; with OpenID Connect set up (docs/security.md),"
        " also the identity provider's access token for this API: a JWT, or an opaque token checked"
        " by introspection."
    ),
)

# `review-queue token create` mints "rq_" + 43 URL-safe characters; anything else is refused
# without a database lookup.
_TOKEN_SHAPE = re.compile(r"rq_[A-Za-z0-9_-]{43}")
# The identity provider's access tokens (REVIEW_QUEUE_OIDC_API_AUDIENCE): a compact JWS, whose
# header is a JSON object ("eyJ"); 16 KiB leaves room for a token carrying many groups.
_JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
MAX_JWT_LENGTH = 16_384
SCRAPER = "scraper"  # the role of REVIEW_QUEUE_METRICS_TOKEN, which can read /metrics and nothing else


def _unauthenticated(reason: str, detail: str) -> ProblemError:
    AUTH_FAILURES.labels(reason).inc()
    return ProblemError("UNAUTHENTICATED", detail, headers={"WWW-Authenticate": "Bearer"})


T = TypeVar("T")
_UNCACHED = object()


async def _briefly(request: Request, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """`read` in a short transaction of its own, before (and apart from) the request's."""
    async with request_transaction(request) as conn:
        return await read(conn)


Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
_PRINCIPAL = "review_queue.principal"  # where a request keeps who it was decided to be


async def _authenticate(request: Request, credentials: Bearer) -> Principal:
    """Who is calling, decided once per request before it takes a database connection: a missing
    or malformed token never reaches the pool, and lookups (found or not) are cached briefly."""
    known: Principal | None = request.scope.get(_PRINCIPAL)
    if known is None:
        known = request.scope[_PRINCIPAL] = await _identify(request, credentials)
    return known


async def _identify(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    if credentials is None and session.COOKIE in request.cookies:
        # The reviewer desk: its session cookie instead of a bearer token (CSRF-checked there).
        from_cookie = await session.principal_from_cookie(request, _briefly)
        if from_cookie is None:
            raise _unauthenticated("unknown", "the desk session has ended; sign in again")
        return from_cookie
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthenticated("missing", "an Authorization: Bearer <token> header is required")
    token = credentials.credentials
    settings: Settings = request.app.state.settings
    scraper_token = settings.metrics_token
    if scraper_token is not None and secrets.compare_digest(token.encode(), scraper_token.encode()):
        return Principal(SCRAPER, SCRAPER)
    if not _TOKEN_SHAPE.fullmatch(token):
        oidc: OidcProvider | None = request.app.state.oidc
        if oidc is not None and settings.oidc_api_audience:
            introspection: Introspection = request.app.state.introspection
            if _looks_like_jwt(token):
                return await _from_provider(request, oidc, introspection, oidc.api_principal, token)
            if looks_opaque(token):
                return await _from_provider(request, oidc, introspection, introspection.principal, token)
        raise _unauthenticated("malformed", "the token is not a review-queue token")
    cache: TTLCache[str, Principal | None] | None = request.app.state.token_cache
    key = hash_token(token)
    # One lookup, not `in` then `[]`: an entry can expire between the two (a KeyError, a 500,
    # seen under `make bench` on a loaded machine).
    cached = cache.get(key, _UNCACHED) if cache is not None else _UNCACHED
    if cached is not _UNCACHED:
        principal = cached if isinstance(cached, Principal) else None
    elif cache is None:
        principal = await _lookup(request, token)
    else:
        # One lookup for all the requests that miss the cache at once: 500 feed long-pollers
        # sharing a token would otherwise each take a pooled connection whenever its entry expires.
        lookups: dict[str, asyncio.Future[Principal | None]] = request.app.state.token_lookups
        lookup = lookups.get(key)
        if lookup is None:
            lookup = lookups[key] = asyncio.ensure_future(_lookup(request, token))
            lookup.add_done_callback(lambda done: _cache_lookup(cache, lookups, key, done))
        principal = await asyncio.shield(lookup)
    if principal is None:
        raise _unauthenticated("unknown", "the token is unknown or revoked")
    return principal


async def _lookup(request: Request, token: str) -> Principal | None:
    async with request_transaction(request) as conn:
        return await find_principal(conn, token=token)


def _cache_lookup(
    cache: "TTLCache[str, Principal | None]",
    lookups: dict[str, "asyncio.Future[Principal | None]"],
    key: str,
    done: "asyncio.Future[Principal | None]",
) -> None:
    del lookups[key]
    if not done.cancelled() and done.exception() is None:
        cache[key] = done.result()


def _looks_like_jwt(token: str) -> bool:
    return len(token) <= MAX_JWT_LENGTH and _JWT_SHAPE.fullmatch(token) is not None


async def _from_provider(
    request: Request,
    oidc: OidcProvider,
    introspection: Introspection,
    check: Callable[[str], Awaitable[tuple[Principal, str]]],
    token: str,
) -> Principal:
    """The caller of an access token from the identity provider, a JWT checked against its cached
    keys (api/oidc.py) or an opaque one by introspection (api/introspection.py), whose name belongs
    to the account the token is about (once per name and process, in the database)."""
    try:
        principal, account = await check(token)
    except Refused as refused:
        if refused.code in ("OIDC_NO_ROLE", "OIDC_AMBIGUOUS_ROLE"):
            raise ProblemError(
                "FORBIDDEN", f"the provider's token gives no role here: {refused.detail}"
            ) from None
        # Said in full: a caller holding the wrong kind of token learns which kind works here.
        expected = await introspection.expected()
        raise _unauthenticated("provider_token", f"{refused.detail}; {expected}") from None
    except ProviderUnavailable as error:
        raise ProblemError(
            "IDENTITY_PROVIDER_UNAVAILABLE",
            f"the identity provider cannot be reached to check this token; retry shortly ({error})",
            headers={"Retry-After": "5"},
        ) from None
    if oidc.bound.get(principal.subject) != account:
        async with request_transaction(request) as conn:
            bound = await bind_identity(
                conn, subject=principal.subject, issuer=oidc.issuer, provider_subject=account
            )
        if not bound:
            raise _unauthenticated(
                "provider_token",
                f"the name {principal.subject!r} belongs to another account of the identity provider"
                " (OIDC_SUBJECT_TAKEN)",
            )
        oidc.bound[principal.subject] = account
    return principal


Caller = Annotated[Principal, Depends(_authenticate)]


async def _transaction(request: Request, _: Caller) -> AsyncIterator[AsyncConnection]:
    # Depends on the caller, so FastAPI authenticates before it opens the transaction, whatever
    # the order of a route's parameters.
    async with request_transaction(request) as conn:
        yield conn


async def _unit(request: Request, _: Caller) -> AsyncIterator[Transaction]:
    # As _transaction; the log lines and metrics of the queue's changes made in it are emitted
    # after its COMMIT (db.engine.unit_of_work), never without it.
    async with request_unit(request) as unit:
        yield unit


async def _read_transaction(request: Request, _: Caller) -> AsyncIterator[AsyncConnection]:
    async with request_read_transaction(request) as conn:
        yield conn


# scope="function": the transaction commits before the response is sent, so a client never
# sees a 200 for a change that then fails to commit. Routes and db/ never commit themselves.
Conn = Annotated[AsyncConnection, Depends(_transaction, scope="function")]
# The same for the queue's functions (db/queue/), which take a unit of work.
Work = Annotated[Transaction, Depends(_unit, scope="function")]
# Reads that may lag (reports, /stats, the decisions export): a standby when one is configured.
ReadConn = Annotated[AsyncConnection, Depends(_read_transaction, scope="function")]


def one_round_trip(request: Request) -> OneRoundTrip:
    """For the hot routes (lease, completion): a transaction of a few statements sent in one round
    trip (db.engine.OneRoundTrip), with `request_transaction`'s limits, committed before the
    response is built, like Conn's. A route calls it after its role check, so the caller is
    authenticated before anything reaches the pool. A unit of work (db/unit.py), as `Work` is."""
    return OneRoundTrip(request.app.state.engine, **_limits(request))


def _require(*roles: str) -> object:
    # The caller is decided here rather than by a dependency of this one: each level of
    # dependencies costs every request (docs/performance.md).
    async def check(request: Request, credentials: Bearer) -> Principal:
        principal = await _authenticate(request, credentials)
        if principal.role not in roles:
            raise ProblemError(
                "FORBIDDEN",
                f"role {principal.role!r} may not do this; needs one of {', '.join(roles)}",
                extra={"required_roles": list(roles)},
            )
        return principal

    return Depends(check)


async def _metrics_scraper(request: Request, principal: Caller) -> None:
    # A scraper gets its own token (REVIEW_QUEUE_METRICS_TOKEN) so Prometheus never needs an
    # API token; without one configured, an admin token is required.
    if request.app.state.settings.metrics_token is not None:
        if principal.role != SCRAPER:
            raise _unauthenticated(
                "unknown", "/metrics needs Authorization: Bearer <REVIEW_QUEUE_METRICS_TOKEN>"
            )
    elif principal.role != "admin":
        raise ProblemError("FORBIDDEN", "metrics need an admin token, or set REVIEW_QUEUE_METRICS_TOKEN")


MetricsScraper = Depends(_metrics_scraper)

AnyRole = Annotated[Principal, _require("reviewer", "approver", "ingest", "auditor", "admin")]
# Who a token is: every role, an integration's too (it reads the change feed and nothing else).
Anyone = Annotated[Principal, _require("reviewer", "approver", "ingest", "auditor", "admin", "integration")]
# The change feed (GET /events): the systems that act on decisions, and auditors.
FeedReader = Annotated[Principal, _require("auditor", "admin", "integration")]
# An approver can also do everything a reviewer does.
Reviewer = Annotated[Principal, _require("reviewer", "approver", "admin")]
# Maker-checker: approve or reject someone else's proposal.
Approver = Annotated[Principal, _require("approver", "admin")]
APPROVER_ROLES = ("approver", "admin")
# Queue statistics: the people who work the queue, and auditors (read-only).
StatsReader = Annotated[Principal, _require("reviewer", "approver", "auditor", "admin")]
# The hash chain's export (read-only, possibly large).
Auditor = Annotated[Principal, _require("auditor", "admin")]
Ingest = Annotated[Principal, _require("ingest", "admin")]
Admin = Annotated[Principal, _require("admin")]
