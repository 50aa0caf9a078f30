"""API calls with the provider's opaque access tokens: RFC 7662 introspection, its answers cached.

A bearer that is neither the project's token (`rq_...`) nor a JWT is, when introspection is on
(REVIEW_QUEUE_OIDC_INTROSPECTION; unset: when the discovery document names an
introspection_endpoint and a client secret is set), sent to the provider's introspection endpoint as
the desk's client (Authlib makes the form and the client authentication; httpx sends it: Authlib's
own httpx client wants httpx2). The answer must say `active: true`, be for this API (`aud` includes
REVIEW_QUEUE_OIDC_API_AUDIENCE), come from this issuer, and be a plain bearer token (not bound to a
key, not a refresh token). Who the caller is and their role follow a JWT's rules (api.oidc: the
subject claim, or a client listed in REVIEW_QUEUE_OIDC_API_CLIENTS; the groups through the role
map); the provider account (db.oidc.bind_identity) is `sub`, else the client.

Answers, refusals included, are cached in an LRU of at most MAX_ENTRIES, keyed by the token's
SHA-256 (the token itself is neither kept nor logged), for REVIEW_QUEUE_OIDC_INTROSPECTION_CACHE_S
(at most 60 s) and never past the token's `exp`: a revoked token keeps working that long at most.
Requests carrying a token not in the cache share one call to the provider. A provider that cannot be
reached, answers nonsense, or refuses this service's own client is ProviderUnavailable (a 503), not
cached: neither the caller's fault nor a verdict on the token.
"""

import asyncio
import hashlib
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc7009 import prepare_revoke_token_request
from cachetools import TLRUCache

from api.metrics import OIDC_INTROSPECTIONS
from api.oidc import OidcProvider, ProviderUnavailable
from api.oidc_claims import Refused, role_of
from db.tokens import Principal

log = logging.getLogger("review_queue.oidc")

MAX_ENTRIES = 10_000
# Asked while an API call waits: shorter than the discovery document's fetch.
TIMEOUT = httpx.Timeout(5.0, connect=3.0)
# RFC 6750's b64token, at most 4 KiB: anything else is not a bearer token worth asking about.
_OPAQUE_SHAPE = re.compile(r"[A-Za-z0-9._~+/-]+=*")
MAX_OPAQUE_LENGTH = 4_096
REFUSED = "the provider's token was refused"


def looks_opaque(token: str) -> bool:
    """Shaped like a bearer token, and not the project's own (`rq_`: malformed, never the provider's)."""
    return (
        len(token) <= MAX_OPAQUE_LENGTH
        and not token.startswith("rq_")
        and _OPAQUE_SHAPE.fullmatch(token) is not None
    )


def cache_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Answer:
    """What an introspection decided: the caller and their provider account, or the refusal;
    reusable until `until` (on the cache's timer)."""

    caller: tuple[Principal, str] | None
    refused: Refused | None
    until: float


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class Introspection:
    """The provider's introspection endpoint as this process uses it: one client, one cache."""

    def __init__(
        self,
        provider: OidcProvider,
        *,
        max_entries: int = MAX_ENTRIES,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.provider = provider
        self.settings = provider.settings
        self._timer, self._clock = timer, clock
        self.cache: TLRUCache[str, Answer] = TLRUCache(
            maxsize=max_entries, ttu=lambda _key, answer, _now: answer.until, timer=timer
        )
        self._asking: dict[str, asyncio.Future[Answer]] = {}
        self._http: httpx.AsyncClient | None = None
        self._transport = transport

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, transport=self._transport)
        return self._http

    async def endpoint(self) -> str | None:
        """The introspection endpoint, or None when introspection is off."""
        wanted = self.settings.oidc_introspection
        if wanted is False or not (self.settings.oidc_client_id and self.settings.oidc_client_secret):
            return None
        endpoint = (await self.provider.metadata()).introspection_endpoint
        if endpoint is None and wanted:
            raise ProviderUnavailable(
                "REVIEW_QUEUE_OIDC_INTROSPECTION=1, but the provider's discovery document names no"
                " introspection_endpoint"
            )
        return endpoint

    async def expected(self) -> str:
        """What this service takes from the provider, for a 401's detail."""
        audience = self.settings.oidc_api_audience
        try:
            endpoint = await self.endpoint()
        except ProviderUnavailable:
            endpoint = None
        if endpoint is not None:
            return (
                f"expected a JWT access token for audience {audience!r}, or an opaque access token for it"
                " that the provider's introspection endpoint says is active"
            )
        return (
            f"expected a JWT access token for audience {audience!r}; opaque tokens are not checked"
            " here (introspection is off: REVIEW_QUEUE_OIDC_INTROSPECTION, a client secret, and the"
            " provider's introspection_endpoint turn it on)"
        )

    async def principal(self, token: str) -> tuple[Principal, str]:
        """Who an API call with this opaque token is, and their provider account; Refused saying
        why not, ProviderUnavailable when the provider cannot say."""
        endpoint = await self.endpoint()
        if endpoint is None:
            raise Refused("UNAUTHENTICATED", "the token is neither a review-queue token nor a JWT")
        key = cache_key(token)
        answer = self.cache.get(key)
        if answer is None:
            # One call for all the requests that miss the cache at once (a burst of one script's).
            asking = self._asking.get(key)
            if asking is None:
                asking = self._asking[key] = asyncio.ensure_future(self._ask(endpoint, token, key))
                asking.add_done_callback(lambda _done: self._asking.pop(key, None))
            answer = await asyncio.shield(asking)
        if answer.refused is not None:
            raise answer.refused
        assert answer.caller is not None
        return answer.caller

    async def _ask(self, endpoint: str, token: str, key: str) -> Answer:
        # RFC 7662 2.1: the same form as a revocation (RFC 7009), the client authenticated by its
        # secret (client_secret_basic), as at the token endpoint (api.oidc).
        form, headers = prepare_revoke_token_request(
            token, "access_token", headers={"Accept": "application/json"}
        )
        secret = self.settings.oidc_client_secret
        auth = ClientAuth(
            self.settings.oidc_client_id,
            secret.get_secret_value() if secret else None,
            "client_secret_basic",
        )
        url, headers, form = auth.prepare("POST", endpoint, headers, form)  # type: ignore[no-untyped-call]
        try:
            response = await self._client().post(url, content=form, headers=headers)
            body = response.json()
        except (httpx.HTTPError, ValueError) as error:
            OIDC_INTROSPECTIONS.labels("unavailable").inc()
            raise ProviderUnavailable(
                f"the introspection endpoint ({endpoint}): {type(error).__name__} {error}"
            ) from None
        if response.status_code in (400, 401, 403):
            # This service's own client refused (a wrong secret, introspection not granted to it).
            said = body.get("error") if isinstance(body, dict) else None
            log.error("oidc_introspection_refused_us", extra={"status": response.status_code, "error": said})
            OIDC_INTROSPECTIONS.labels("unavailable").inc()
            raise ProviderUnavailable(
                f"the introspection endpoint refused this service's client ({response.status_code}"
                f" {str(said)[:100]!r}): check REVIEW_QUEUE_OIDC_CLIENT_ID and _SECRET"
            )
        if not response.is_success or not isinstance(body, dict) or not isinstance(body.get("active"), bool):
            OIDC_INTROSPECTIONS.labels("unavailable").inc()
            raise ProviderUnavailable(
                f"the introspection endpoint answered {response.status_code} without an `active` boolean"
            )
        now = self._clock()
        life = float(self.settings.oidc_introspection_cache_s)
        exp = _number(body.get("exp"))
        if exp is not None:
            life = min(life, exp - now)
        until = self._timer() + life
        try:
            answer = Answer(self._caller(body, now), None, until)
            OIDC_INTROSPECTIONS.labels("active").inc()
        except Refused as refused:
            answer = Answer(None, refused, until)
            OIDC_INTROSPECTIONS.labels("refused").inc()
            log.info("oidc_introspection_refused", extra={"token_sha256": key[:16], "reason": refused.detail})
        if life > 0:
            self.cache[key] = answer
        return answer

    def _caller(self, claims: Mapping[str, Any], now: float) -> tuple[Principal, str]:
        """The caller the introspection's answer names (see the module's docstring); Refused if none."""
        if claims.get("active") is not True:
            raise Refused(
                "UNAUTHENTICATED",
                f"{REFUSED}: the provider's introspection endpoint says it is not active (expired,"
                " revoked, or never issued)",
            )
        if "iss" in claims and claims["iss"] != self.provider.issuer:
            raise Refused("UNAUTHENTICATED", f"{REFUSED}: it is from another issuer")
        audience = claims.get("aud")
        audiences = (
            [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
        )
        if self.settings.oidc_api_audience not in audiences:
            raise Refused("UNAUTHENTICATED", f"{REFUSED}: it is not for this audience")
        token_type = claims.get("token_type")
        if token_type is not None and str(token_type).lower() != "bearer":
            raise Refused(
                "UNAUTHENTICATED", f"{REFUSED}: it is not a bearer access token ({str(token_type)[:40]!r})"
            )
        if "cnf" in claims:
            # Sender-constrained (DPoP, mTLS): this service checks no proof of possession.
            raise Refused(
                "UNAUTHENTICATED", f"{REFUSED}: it is bound to a key (cnf), which is not checked here"
            )
        skew = self.settings.oidc_clock_skew_s
        exp, nbf = _number(claims.get("exp")), _number(claims.get("nbf"))
        if ("exp" in claims and exp is None) or ("nbf" in claims and nbf is None):
            raise Refused("UNAUTHENTICATED", f"{REFUSED}: its exp or nbf is not a number")
        if exp is not None and exp + skew < now:
            raise Refused("UNAUTHENTICATED", f"{REFUSED}: it has expired")
        if nbf is not None and nbf - skew > now:
            raise Refused("UNAUTHENTICATED", f"{REFUSED}: it is not valid yet")
        subject = self.provider.api_subject(claims)
        role = role_of(claims.get(self.settings.oidc_roles_claim), self.settings.oidc_role_map)
        # A script's token names no `sub` here (its JWT's sub is its client id): the same account.
        account = claims.get("sub") or claims.get("client_id")
        if not isinstance(account, str):
            raise Refused("UNAUTHENTICATED", f"{REFUSED}: it names neither a sub nor a client_id")
        return Principal(subject, role), account
