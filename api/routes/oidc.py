"""Sign-in with the company's identity provider (OpenID Connect, authorization code with PKCE).

GET /auth/oidc/login keeps a new sign-in (state, nonce, PKCE verifier) in an HttpOnly cookie of this
browser, encrypted and authenticated with the service's key (Fernet), and sends the browser to the
provider: it stores nothing, so no number of strangers' starts can crowd out a real one. The callback
takes the sign-in back from the cookie (only one this service sealed in the last 10 minutes, whose
state is the answer's), records the state as used (once: a replay is refused), exchanges the code,
checks the ID token (api/oidc.py), and opens the same HttpOnly desk session a token sign-in opens,
ending when the ID token does. Every outcome sends the browser back
to the desk: refusals as `/desk/?sign_in_error=CODE`, which the desk words as a sentence (no text
from the URL is ever shown, so a crafted link cannot put words in the page).

The redirect URI is REVIEW_QUEUE_PUBLIC_URL's, never built from the request's Host header, and every
redirect to the desk is a relative path, so no header can send a browser elsewhere.
"""

import logging
import re
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from api import session
from api.deps import request_transaction
from api.errors import ProblemError, problem_responses
from api.metrics import OIDC_SIGN_INS
from api.oidc import OidcProvider, ProviderUnavailable
from api.oidc_claims import Refused
from api.oidc_login import new_login, open_login, seal_login
from api.schemas import OidcProviderOut
from db import oidc as oidc_db

log = logging.getLogger("review_queue.oidc")
router = APIRouter(tags=["session"])

LOGIN_COOKIE = "rq_oidc_login"
LOGIN_PATH = "/auth/oidc/"
LOGIN_TTL = timedelta(minutes=10)
# RFC 6749 4.1.2.1: error codes are printable ASCII without quotes or backslash; only plain ones are
# passed on to the desk (which words the ones it knows).
_PROVIDER_ERROR = re.compile(r"[a-z_]{1,64}")


def _provider(request: Request) -> OidcProvider:
    oidc: OidcProvider | None = request.app.state.oidc
    if oidc is None or not oidc.settings.oidc_login_enabled:
        raise ProblemError(
            "OIDC_NOT_CONFIGURED",
            "sign-in with an identity provider is not set up here (REVIEW_QUEUE_OIDC_ISSUER and"
            " REVIEW_QUEUE_OIDC_CLIENT_ID); sign in with a token",
        )
    return oidc


def _uncached(response: Response) -> Response:
    # The code and state are in these URLs: never cached, never sent on as a Referer.
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _login_cookie(response: Response, oidc: OidcProvider, value: str | None) -> None:
    # SameSite=Lax, not Strict: the callback is a top-level navigation from the provider's site,
    # on which a Strict cookie would not be sent.
    secure = (oidc.settings.public_url or "").startswith("https://")
    if value is None:
        response.delete_cookie(LOGIN_COOKIE, path=LOGIN_PATH, httponly=True, samesite="lax", secure=secure)
    else:
        response.set_cookie(
            LOGIN_COOKIE,
            value,
            max_age=int(LOGIN_TTL.total_seconds()),
            path=LOGIN_PATH,
            httponly=True,
            samesite="lax",
            secure=secure,
        )


def _to_desk(oidc: OidcProvider, code: str, detail: str, provider_error: str | None = None) -> Response:
    """Back to the desk's sign-in page, which says in a sentence why the sign-in did not happen."""
    OIDC_SIGN_INS.labels(code).inc()
    log.warning("oidc_sign_in_refused", extra={"code": code, "detail": detail})
    query = f"sign_in_error={code}" + (f"&provider_error={provider_error}" if provider_error else "")
    response = RedirectResponse(f"/desk/?{query}", status_code=303)
    _login_cookie(response, oidc, None)
    return _uncached(response)


REDIRECT: dict[str, Any] = {
    "headers": {"Location": {"description": "Where the browser goes next.", "schema": {"type": "string"}}}
}


@router.get(
    "/auth/oidc", operation_id="getOidcProvider", summary="Sign-in with an identity provider: on or off"
)
async def provider(request: Request) -> OidcProviderOut:
    """Whether the desk offers "Sign in with <provider>" (OpenID Connect), and where it starts. Public."""
    oidc: OidcProvider | None = request.app.state.oidc
    if oidc is None or not oidc.settings.oidc_login_enabled:
        return OidcProviderOut(enabled=False, provider_name=None, login_url=None)
    return OidcProviderOut(
        enabled=True, provider_name=oidc.settings.oidc_display_name, login_url="/auth/oidc/login"
    )


@router.get(
    "/auth/oidc/login",
    operation_id="startOidcSignIn",
    summary="Start signing in with the identity provider",
    status_code=302,
    response_class=RedirectResponse,
    responses={
        302: {"description": "To the provider's authorization endpoint.", **REDIRECT},
        303: {
            "description": "Back to the desk with `sign_in_error` (provider unreachable).",
            **REDIRECT,
        },
        **problem_responses("OIDC_NOT_CONFIGURED"),
    },
)
async def login(request: Request) -> Response:
    """A browser navigation, not an API call: 302 to the provider's authorization endpoint with
    `response_type=code`, the client id, `redirect_uri`, `scope`, `state`, `nonce` and an S256
    `code_challenge`, and an HttpOnly cookie that keeps the sign-in in this browser (10 minutes)."""
    oidc = _provider(request)
    try:
        metadata = await oidc.metadata()
    except ProviderUnavailable as error:
        return _to_desk(oidc, "IDENTITY_PROVIDER_UNAVAILABLE", str(error))
    pending = new_login()
    url = oidc.authorization_url(
        metadata, state=pending.state, nonce=pending.nonce, code_verifier=pending.code_verifier
    )
    response = RedirectResponse(url, status_code=302)
    _login_cookie(response, oidc, seal_login(oidc.login_sealer, pending))
    return _uncached(response)


Param = Annotated[str | None, Query(max_length=4096)]


@router.get(
    "/auth/oidc/callback",
    operation_id="finishOidcSignIn",
    summary="The identity provider's answer",
    status_code=303,
    response_class=RedirectResponse,
    responses={
        303: {
            "description": "To the desk: signed in (an HttpOnly session cookie is set), or"
            " `/desk/?sign_in_error=CODE` saying why not.",
            **REDIRECT,
        },
        **problem_responses("OIDC_NOT_CONFIGURED"),
    },
)
async def callback(
    request: Request,
    code: Param = None,
    state: Param = None,
    error: Param = None,
    error_description: Param = None,
    iss: Param = None,
) -> Response:
    """Where the provider sends the browser back (`redirect_uri`). The state must be one this
    browser started in the last 10 minutes and not yet used; the ID token must verify (signature,
    issuer, audience, nonce, expiry); the account must map to one role. Parameters the provider may
    add (`session_state`, ...) are ignored."""
    oidc = _provider(request)
    ttl_s = int(LOGIN_TTL.total_seconds())
    pending = (
        open_login(oidc.login_sealer, request.cookies.get(LOGIN_COOKIE), state, ttl_s) if state else None
    )
    if error is not None:
        plain = error if _PROVIDER_ERROR.fullmatch(error) else None
        return _to_desk(
            oidc, "OIDC_PROVIDER_ERROR", f"{error[:64]!r}: {(error_description or '')[:300]!r}", plain
        )
    if pending is None or not code:
        return _to_desk(
            oidc, "OIDC_STATE_INVALID", "no sign-in of this browser has that state (expired or foreign)"
        )
    async with request_transaction(request) as conn:
        # Outlives the cookie (whose age is on this host's clock): a replay meets the record.
        first = await oidc_db.use_state(conn, state=pending.state, keep=2 * LOGIN_TTL)
    if not first:
        return _to_desk(oidc, "OIDC_STATE_INVALID", "that sign-in's state was used already (a replay)")
    try:
        metadata = await oidc.metadata()
        if iss != metadata.issuer and (iss is not None or metadata.iss_parameter_supported):
            # RFC 9207: the answer names the provider that sent it; another one is a mix-up.
            raise Refused("OIDC_ID_TOKEN_INVALID", f"the answer names issuer {str(iss)[:200]!r}")
        identity = await oidc.sign_in(code=code, nonce=pending.nonce, code_verifier=pending.code_verifier)
    except Refused as refused:
        return _to_desk(oidc, refused.code, refused.detail)
    except ProviderUnavailable as unavailable:
        return _to_desk(oidc, "IDENTITY_PROVIDER_UNAVAILABLE", str(unavailable))
    async with request_transaction(request) as conn:
        bound = await oidc_db.bind_identity(
            conn, subject=identity.subject, issuer=oidc.issuer, provider_subject=identity.account
        )
        if bound:
            session_id, _, seconds = await oidc_db.create_session(
                conn,
                subject=identity.subject,
                role=identity.role,
                id_token=identity.id_token,
                ends_by=identity.expires_at,
                ttl=session.TTL,
            )
    if not bound:
        return _to_desk(
            oidc,
            "OIDC_SUBJECT_TAKEN",
            f"the name {identity.subject!r} belongs to another account of the provider"
            f" (this one's sub is {identity.account[:100]!r})",
        )
    OIDC_SIGN_INS.labels("signed_in").inc()
    log.info("oidc_signed_in", extra={"subject": identity.subject, "role": identity.role})
    response = RedirectResponse("/desk/", status_code=303)
    session.set_cookie(response, request, session_id, max_age=seconds)
    _login_cookie(response, oidc, None)
    return _uncached(response)
