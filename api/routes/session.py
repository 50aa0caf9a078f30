"""The reviewer desk's session: sign in with a token, read the session, sign out."""

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import JSONResponse

from api import session
from api.deps import Anyone, SettingsDep, request_transaction
from api.errors import ProblemError, problem_responses
from api.oidc import OidcProvider
from api.routing import QueueRoute
from api.schemas import MAX_WAIT_S, SessionIn, SessionOut, SignOutOut
from api.settings import Settings
from db import sessions

router = APIRouter(route_class=QueueRoute, tags=["session"])


def _out(subject: str, role: str, csrf_token: str | None, settings: Settings) -> SessionOut:
    return SessionOut(
        subject=subject,
        role=role,
        csrf_token=csrf_token,
        lease_s=settings.lock_timeout_ms / 1000,
        idle_release_s=settings.idle_release_s,
        max_wait_s=MAX_WAIT_S,
        release_cooldown_s=settings.release_cooldown_s,
    )


# Not the Conn dependency: that one authenticates first, and these two routes are how a browser
# without a bearer token gets (or drops) its identity. They open their own transaction.


@router.post(
    "/session",
    operation_id="signIn",
    summary="Sign in to the desk (session cookie)",
    responses=problem_responses("UNAUTHENTICATED", "CSRF_REJECTED"),
)
async def sign_in(body: SessionIn, request: Request, response: Response, settings: SettingsDep) -> SessionOut:
    """Exchange a bearer token for an HttpOnly, SameSite=Strict session cookie (the reviewer desk).

    The token itself is not kept anywhere the page can read it; send `csrf_token` back as
    `X-CSRF-Token` on every write made with the cookie.
    """
    session.check_origin(request)
    async with request_transaction(request) as conn:
        created = await sessions.create_session(conn, token=body.token, ttl=session.TTL)
    if created is None:
        raise ProblemError(
            "UNAUTHENTICATED",
            "the token is unknown, revoked or expired",
            headers={"WWW-Authenticate": "Bearer"},
        )
    session_id, desk = created
    session.set_cookie(response, request, session_id)
    return _out(desk.subject, desk.role, desk.csrf_token, settings)


@router.get("/session", operation_id="getSession", summary="Who is signed in")
async def who_am_i(request: Request, principal: Anyone, settings: SettingsDep) -> SessionOut:
    """Who is signed in, the CSRF token of the cookie session, and the desk's settings."""
    desk: sessions.DeskSession | None = getattr(request.state, "desk_session", None)
    return _out(principal.subject, principal.role, desk.csrf_token if desk else None, settings)


@router.delete(
    "/session",
    operation_id="signOut",
    summary="Sign out of the desk",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={
        200: {
            "model": SignOutOut,
            "description": "Signed out of a session the identity provider opened, whose provider"
            " offers an end-session endpoint: send the browser to `end_session_url` to sign out"
            " there too.",
        },
        **problem_responses("CSRF_REJECTED"),
    },
)
async def sign_out(request: Request, settings: SettingsDep) -> Response:
    """Sign out: the session ends on the server and the cookie is cleared. Needs no token; with a
    live session cookie it needs the session's X-CSRF-Token, so no other site can sign you out."""
    id_token = None
    async with request_transaction(request) as conn:
        desk = await session.session_of(request, lambda _request, read: read(conn))
        if desk is not None:
            session.check_csrf(request, desk)
            id_token = await session.end_session(conn, request.cookies[session.COOKIE])
    oidc: OidcProvider | None = request.app.state.oidc
    end_session_url = await oidc.sign_out_url(id_token) if oidc is not None and id_token else None
    response: Response
    if end_session_url is not None:
        response = JSONResponse(SignOutOut(end_session_url=end_session_url).model_dump())
    else:
        response = Response(status_code=status.HTTP_204_NO_CONTENT)
    session.clear_cookie(response, request)
    return response
