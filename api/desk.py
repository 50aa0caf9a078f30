"""The reviewer desk: static files from web/, served with a strict Content-Security-Policy.

No build step and no third-party code: the page is a handful of dependency-free ES modules
that talk to the public REST API (see docs/desk.md).
"""

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.settings import REPO_ROOT

WEB_DIR = REPO_ROOT / "web"

# Everything from this origin only, no inline script or style, never inside a frame.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    # Not fingerprinted, so revalidated on every load (an ETag makes that a 304): a deploy is
    # seen at once and the page and the API it calls never disagree.
    (b"cache-control", b"no-cache"),
]


class _Secured:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                message["headers"] = [
                    *(h for h in message.get("headers", []) if h[0] not in names),
                    *HEADERS,
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _to_desk(_: Request) -> RedirectResponse:
    return RedirectResponse("/desk/", status_code=307)


def install(app: FastAPI) -> None:
    app.mount("/desk", _Secured(StaticFiles(directory=WEB_DIR, html=True)), name="desk")
    app.add_route("/", _to_desk, methods=["GET"], include_in_schema=False)
    app.add_route("/desk", _to_desk, methods=["GET"], include_in_schema=False)  # the slash forgotten
