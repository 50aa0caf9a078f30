"""Sign-in with the company's OpenID Connect provider, and API calls with its JWTs.

The protocol is Authlib's (the authorization URL, PKCE, the code exchange, the ID token's claims)
and joserfc's (signatures; Authlib's own JOSE layer): nothing here signs or checks a JWT by hand.

The provider's discovery document and keys (JWKS) are fetched when first needed and cached in the
process. A token signed with a key id not in the cache refetches the keys, at most once every
KEYS_MIN_REFRESH_S (a flood of made-up key ids cannot make the service hammer the provider); cached
keys are refetched KEYS_MAX_AGE_S after they were fetched, when next needed. An API call with a JWT
does no network I/O beyond that.

Who someone is: the subject claim (REVIEW_QUEUE_OIDC_SUBJECT_CLAIM), obeying the rule of a token's
subject as sent, then lower-cased; an API token without it (client credentials) is refused unless
its client (`client_id`, RFC 9068, else `azp`) is listed in REVIEW_QUEUE_OIDC_API_CLIENTS with the
subject it acts as. Their role: the groups (a JSON list) in REVIEW_QUEUE_OIDC_ROLES_CLAIM through
REVIEW_QUEUE_OIDC_ROLE_MAP. Several mapped roles give the one that includes all the others (admin
includes every role, approver includes reviewer); when none does (reviewer and auditor, say), the
sign-in is refused rather than guessed: either choice would silently drop a duty, and both at once
would undo the segregation the roles exist for.
"""

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import httpx
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.claims import JWTClaims
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from authlib.oidc.core import CodeIDToken
from cachetools import LRUCache
from joserfc import jws, jwt
from joserfc.errors import JoseError, UnsupportedAlgorithmError
from joserfc.jwk import KeySet

from api.oidc_claims import Refused, check_lifetime, jose_reason, role_of, subject_of
from api.oidc_login import login_sealer
from api.settings import Settings
from db.tokens import Principal

log = logging.getLogger("review_queue.oidc")

# Signatures with a public key only: never "none", never an HMAC keyed with something public.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
KEYS_MIN_REFRESH_S = 15.0
KEYS_MAX_AGE_S = 3600.0
METADATA_MAX_AGE_S = 86400.0
TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# Where an API token names the client it was issued to: RFC 9068's claim, then OIDC's (Entra's).
CLIENT_CLAIMS = ("client_id", "azp")
# JWT types (the header's `typ`, RFC 8725 3.11) an API bearer may declare: RFC 9068's access token,
# or the generic one many providers (Entra, Keycloak) put on access and ID tokens alike.
ACCESS_TOKEN_TYPES = ("at+jwt", "application/at+jwt", "jwt")


class ProviderUnavailable(Exception):
    """The provider could not be reached, or answered with something that is not what OIDC says."""


# The codes the callback sends the desk (`/desk/?sign_in_error=CODE`); web/oidc.js has their sentences.
SIGN_IN_ERRORS = (
    "OIDC_PROVIDER_ERROR",
    "OIDC_STATE_INVALID",
    "OIDC_NO_ROLE",
    "OIDC_AMBIGUOUS_ROLE",
    "OIDC_BAD_SUBJECT",
    "OIDC_ID_TOKEN_INVALID",
    "OIDC_EXCHANGE_FAILED",
    "OIDC_SUBJECT_TAKEN",
    "IDENTITY_PROVIDER_UNAVAILABLE",
)


@dataclass(frozen=True, slots=True)
class Metadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    end_session_endpoint: str | None
    introspection_endpoint: str | None  # RFC 7662 (api/introspection.py)
    algorithms: tuple[str, ...]
    # RFC 9207: the provider names itself in the authorization response (mix-up defence).
    iss_parameter_supported: bool


@dataclass(frozen=True, slots=True)
class Identity:
    subject: str
    role: str
    expires_at: datetime
    id_token: str
    account: str  # the provider's `sub`: whose the subject is (db.oidc.bind_identity)


def _url(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        raise ProviderUnavailable(f"the discovery document's {name} is not a URL: {value!r}")
    return value


class OidcProvider:
    """The provider as this process knows it: settings, cached discovery and keys, one HTTP client."""

    def __init__(self, settings: Settings) -> None:
        assert settings.oidc_issuer is not None
        self.settings = settings
        self.issuer = settings.oidc_issuer
        self._http: httpx.AsyncClient | None = None
        self._metadata: Metadata | None = None
        self._metadata_at = self._metadata_tried = 0.0  # monotonic: fetched, and last tried
        self._keys: KeySet | None = None
        self._keys_at = self._keys_tried = 0.0
        # One fetch at a time of each document; two locks, as fetching the keys reads the metadata.
        self._locks: dict[str, asyncio.Lock] = {}
        # Subjects known to belong to an account (subject -> its `sub`), so an API call checks the
        # binding in the database once per name and process, not on every request.
        self.bound: LRUCache[str, str] = LRUCache(maxsize=10_000)
        self.login_sealer = login_sealer(settings)

    @property
    def redirect_uri(self) -> str:
        return f"{self.settings.public_url}/auth/oidc/callback"

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)
        return self._http

    def _locked(self, document: str) -> asyncio.Lock:
        return self._locks.setdefault(document, asyncio.Lock())

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = await self._client().get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as error:
            raise ProviderUnavailable(f"{what} ({url}): {error}") from None
        if not isinstance(document, dict):
            raise ProviderUnavailable(f"{what} ({url}) is not a JSON object")
        return document

    # --- the provider's documents, cached --------------------------------------------------------

    async def metadata(self) -> Metadata:
        if self._metadata is not None and time.monotonic() - self._metadata_at < METADATA_MAX_AGE_S:
            return self._metadata
        async with self._locked("metadata"):
            cached = self._metadata
            if cached is not None and time.monotonic() - self._metadata_at < METADATA_MAX_AGE_S:
                return cached
            if time.monotonic() - self._metadata_tried < KEYS_MIN_REFRESH_S:
                if cached is not None:
                    return cached
                raise ProviderUnavailable("the provider was not reached a moment ago; not retried yet")
            self._metadata_tried = time.monotonic()
            try:
                self._metadata = await self._discover()
            except ProviderUnavailable as error:
                if cached is None:
                    raise
                log.warning("oidc_discovery_refresh_failed", extra={"reason": str(error)})
                return cached
            self._metadata_at = time.monotonic()
            return self._metadata

    async def _discover(self) -> Metadata:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        document = await self._get_json(url, "the discovery document")
        if document.get("issuer") != self.issuer:
            # OpenID Connect Discovery 4.3: anything else may be an impostor's document.
            raise ProviderUnavailable(
                f"the discovery document names issuer {document.get('issuer')!r}, not {self.issuer!r}"
            )
        offered = document.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = tuple(a for a in ASYMMETRIC if isinstance(offered, list) and a in offered)
        if not algorithms:
            raise ProviderUnavailable(f"the provider signs ID tokens with none of {', '.join(ASYMMETRIC)}")
        userinfo, end_session = document.get("userinfo_endpoint"), document.get("end_session_endpoint")
        introspection = document.get("introspection_endpoint")
        return Metadata(
            issuer=self.issuer,
            authorization_endpoint=_url(document.get("authorization_endpoint"), "authorization_endpoint"),
            token_endpoint=_url(document.get("token_endpoint"), "token_endpoint"),
            jwks_uri=_url(document.get("jwks_uri"), "jwks_uri"),
            userinfo_endpoint=_url(userinfo, "userinfo_endpoint") if userinfo else None,
            end_session_endpoint=_url(end_session, "end_session_endpoint") if end_session else None,
            introspection_endpoint=_url(introspection, "introspection_endpoint") if introspection else None,
            algorithms=algorithms,
            iss_parameter_supported=document.get("authorization_response_iss_parameter_supported") is True,
        )

    async def _key_set(self, kid: str | None) -> KeySet:
        """The provider's keys, refetched when stale or when `kid` is unknown (rate-limited)."""

        def usable(keys: KeySet | None) -> bool:
            if keys is None or time.monotonic() - self._keys_at >= KEYS_MAX_AGE_S:
                return False
            return kid is None or any(key.kid == kid for key in keys)

        if self._keys is not None and usable(self._keys):
            return self._keys
        async with self._locked("keys"):
            cached = self._keys
            if cached is not None and usable(cached):
                return cached
            if time.monotonic() - self._keys_tried < KEYS_MIN_REFRESH_S:
                # Fetched (or tried) a moment ago: the kid is not there, or the provider is away.
                if cached is not None:
                    return cached
                raise ProviderUnavailable(
                    "the provider's keys were not reached a moment ago; not retried yet"
                )
            self._keys_tried = time.monotonic()
            try:
                self._keys = await self._fetch_keys()
            except ProviderUnavailable as error:
                if cached is None:
                    raise
                log.warning("oidc_keys_refresh_failed", extra={"reason": str(error)})
                return cached
            self._keys_at = time.monotonic()
            return self._keys

    async def _fetch_keys(self) -> KeySet:
        metadata = await self.metadata()
        document = await self._get_json(metadata.jwks_uri, "the provider's keys (jwks_uri)")
        try:
            keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
        except (JoseError, ValueError, KeyError, TypeError) as error:
            raise ProviderUnavailable(f"the provider's keys cannot be read: {error}") from None
        # Public keys only: a symmetric key in a JWKS would let anyone who can read it sign.
        return KeySet([key for key in keys if key.key_type in ("RSA", "EC", "OKP")])

    async def _verified(self, token: str, algorithms: Sequence[str]) -> jwt.Token:
        """The token's header and claims once its signature verifies against the provider's keys;
        joserfc's errors otherwise (the claims are the caller's to check)."""
        header = jws.extract_compact(token.encode()).headers()
        if header.get("alg") not in algorithms:
            raise UnsupportedAlgorithmError(f"{header.get('alg')!r}")
        kid = header.get("kid")
        keys = await self._key_set(kid if isinstance(kid, str) else None)
        return jwt.decode(token, keys, algorithms=list(algorithms))

    # --- the desk's sign-in (authorization code with PKCE) ---------------------------------------

    def authorization_url(self, metadata: Metadata, *, state: str, nonce: str, code_verifier: str) -> str:
        url: str = prepare_grant_uri(
            metadata.authorization_endpoint,
            client_id=self.settings.oidc_client_id or "",
            response_type="code",
            redirect_uri=self.redirect_uri,
            scope=self.settings.oidc_scopes,
            state=state,
            nonce=nonce,
            code_challenge=create_s256_code_challenge(code_verifier),  # type: ignore[no-untyped-call]
            code_challenge_method="S256",
        )
        return url

    async def sign_in(self, *, code: str, nonce: str, code_verifier: str) -> Identity:
        """Exchange the code, check the ID token, and decide who this is; Refused or
        ProviderUnavailable otherwise."""
        metadata = await self.metadata()
        tokens = await self._exchange(metadata, code=code, code_verifier=code_verifier)
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise Refused("OIDC_ID_TOKEN_INVALID", "the token endpoint sent no ID token")
        claims = await self.id_token_claims(id_token, nonce=nonce, access_token=tokens.get("access_token"))
        claims = await self._with_userinfo(metadata, claims, tokens.get("access_token"))
        subject = subject_of(claims, [self.settings.oidc_subject_claim])
        role = role_of(claims.get(self.settings.oidc_roles_claim), self.settings.oidc_role_map)
        # The session ends no later than the provider's word on it, the ID token's expiry.
        expires_at = datetime.fromtimestamp(int(claims["exp"]), UTC)
        return Identity(subject, role, expires_at, id_token, str(claims["sub"]))

    async def _exchange(self, metadata: Metadata, *, code: str, code_verifier: str) -> dict[str, Any]:
        """The token endpoint's answer to the code (RFC 6749 4.1.3, RFC 7636 4.5), the client
        authenticated by its secret (client_secret_basic) or, for a public client, by its id alone."""
        body = prepare_token_request(
            "authorization_code", code=code, redirect_uri=self.redirect_uri, code_verifier=code_verifier
        )
        secret = self.settings.oidc_client_secret
        auth = ClientAuth(
            self.settings.oidc_client_id,
            secret.get_secret_value() if secret else None,
            "client_secret_basic" if secret else "none",
        )
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        url, headers, body = auth.prepare("POST", metadata.token_endpoint, headers, body)  # type: ignore[no-untyped-call]
        try:
            response = await self._client().post(url, content=body, headers=headers)
            answer = response.json()
        except (httpx.HTTPError, ValueError) as error:
            raise ProviderUnavailable(f"the token endpoint ({metadata.token_endpoint}): {error}") from None
        if not isinstance(answer, dict) or response.is_server_error:
            raise ProviderUnavailable(f"the token endpoint answered {response.status_code}")
        if "error" in answer or not response.is_success:
            refusal = f"{answer.get('error')!r}: {str(answer.get('error_description'))[:300]!r}"
            raise Refused("OIDC_EXCHANGE_FAILED", f"the token endpoint refused the code: {refusal}")
        return answer

    async def id_token_claims(self, id_token: str, *, nonce: str, access_token: object) -> dict[str, Any]:
        """The ID token's claims once signature, issuer, audience, nonce, expiry (with the clock
        skew) and at_hash hold (OpenID Connect Core 3.1.3.7); Refused saying which did not."""
        metadata = await self.metadata()
        try:
            token = await self._verified(id_token, metadata.algorithms)
            claims = CodeIDToken(
                token.claims,
                token.header,
                {
                    "iss": {"essential": True, "value": self.issuer},
                    "aud": {"essential": True, "value": self.settings.oidc_client_id or ""},
                },
                {"nonce": nonce, "client_id": self.settings.oidc_client_id, "access_token": access_token},
            )
            claims.validate(leeway=self.settings.oidc_clock_skew_s)
            check_lifetime(claims, self.settings.oidc_max_token_lifetime_s, "OIDC_ID_TOKEN_INVALID")
        except JoseError as error:
            raise Refused(
                "OIDC_ID_TOKEN_INVALID", f"the ID token was refused: {jose_reason(error)}"
            ) from None
        except ValueError as error:
            raise Refused("OIDC_ID_TOKEN_INVALID", f"the ID token was refused: {error}") from None
        except Refused as refused:
            raise Refused(refused.code, f"the ID token was refused: {refused.detail}") from None
        return dict(claims)

    async def _with_userinfo(
        self, metadata: Metadata, claims: dict[str, Any], access_token: object
    ) -> dict[str, Any]:
        # Many providers put profile claims and groups in the UserInfo answer only (oidc-provider
        # does for the code flow). The ID token's claims win; its `sub` must match (Core 5.3.2).
        wanted = (self.settings.oidc_subject_claim, self.settings.oidc_roles_claim)
        if all(name in claims for name in wanted) or not metadata.userinfo_endpoint:
            return claims
        if not isinstance(access_token, str):
            return claims
        try:
            response = await self._client().get(
                metadata.userinfo_endpoint,
                headers={"Authorization": f"Bearer {access_token}", "Accept": "application/json"},
            )
            response.raise_for_status()
            info = response.json()
        except (httpx.HTTPError, ValueError) as error:
            raise ProviderUnavailable(f"the userinfo endpoint: {error}") from None
        if not isinstance(info, dict) or info.get("sub") != claims.get("sub"):
            raise Refused("OIDC_ID_TOKEN_INVALID", "the userinfo answer is about someone else (sub)")
        return {**info, **claims}

    async def sign_out_url(self, id_token: str) -> str | None:
        """Where the browser goes to end the provider's session too (RP-Initiated Logout 1.0):
        the end-session endpoint with id_token_hint and post_logout_redirect_uri (the desk); None
        when the provider offers none, or cannot be reached (the desk session has ended anyway)."""
        try:
            endpoint = (await self.metadata()).end_session_endpoint
        except ProviderUnavailable as error:
            log.warning("oidc_sign_out_without_provider", extra={"reason": str(error)})
            return None
        if endpoint is None:
            return None
        query = urlencode(
            {
                "id_token_hint": id_token,
                "post_logout_redirect_uri": f"{self.settings.public_url}/desk/",
                "client_id": self.settings.oidc_client_id,
            }
        )
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"

    # --- API calls with the provider's JWTs --------------------------------------------------------

    async def api_principal(self, token: str) -> tuple[Principal, str]:
        """Who an API call with the provider's access token is, and the provider's `sub` for it
        (whose the subject is: db.oidc.bind_identity); Refused saying why not."""
        audience = self.settings.oidc_api_audience
        assert audience is not None
        try:
            verified = await self._verified(token, ASYMMETRIC)
            claims = JWTClaims(
                verified.claims,
                verified.header,
                {
                    "iss": {"essential": True, "value": self.issuer},
                    "aud": {"essential": True, "value": audience},
                    "exp": {"essential": True},
                    "iat": {"essential": True},
                    "sub": {"essential": True},
                },
            )
            claims.validate(leeway=self.settings.oidc_clock_skew_s)
            check_lifetime(claims, self.settings.oidc_max_token_lifetime_s, "UNAUTHENTICATED")
            self._access_token_only(verified.header, claims)
        except JoseError as error:
            raise Refused(
                "UNAUTHENTICATED", f"the provider's token was refused: {jose_reason(error)}"
            ) from None
        except ValueError as error:
            raise Refused("UNAUTHENTICATED", f"the provider's token was refused: {error}") from None
        except Refused as refused:
            raise Refused(refused.code, f"the provider's token was refused: {refused.detail}") from None
        principal = Principal(
            self.api_subject(claims),
            role_of(claims.get(self.settings.oidc_roles_claim), self.settings.oidc_role_map),
        )
        return principal, str(claims["sub"])

    def _access_token_only(self, header: Mapping[str, Any], claims: Mapping[str, Any]) -> None:
        """Refused when the token is, or may be, an ID token: an ID token proves a sign-in to the
        client it names, and is never the key to an API (its audience may list the API too)."""
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES):
            raise Refused("UNAUTHENTICATED", f"it is not an access token (typ {str(typ)[:40]!r})")
        audience = claims.get("aud")
        audiences = [audience] if isinstance(audience, str) else audience or []
        clients = {claims.get(name) for name in CLIENT_CLAIMS} - {None}
        # An ID token is addressed to the client that asked for it (the desk's, or its own azp) and
        # answers a sign-in (nonce); an access token is addressed to the API, whoever asked for it.
        if (
            "nonce" in claims
            or self.settings.oidc_client_id in audiences
            or any(client in audiences for client in clients)
        ):
            raise Refused("UNAUTHENTICATED", "it is an ID token (addressed to a client), not an access token")

    def api_subject(self, claims: Mapping[str, Any]) -> str:
        """The person the token names, or the subject REVIEW_QUEUE_OIDC_API_CLIENTS gives its client."""
        if claims.get(self.settings.oidc_subject_claim) is not None:
            return subject_of(claims, [self.settings.oidc_subject_claim])
        client = next((claims[name] for name in CLIENT_CLAIMS if isinstance(claims.get(name), str)), None)
        mapped = dict(self.settings.oidc_api_clients).get(client) if client is not None else None
        if mapped is None:
            raise Refused(
                "OIDC_BAD_SUBJECT",
                f"the provider's token was refused: it has no {self.settings.oidc_subject_claim} claim,"
                f" and its client {str(client)[:100]!r} is not in REVIEW_QUEUE_OIDC_API_CLIENTS",
            )
        return mapped
