"""Pure ASGI middleware that must run before any routing or body parsing."""

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import problem_response


class BodyLimit:
    """413 problem+json for a body over the limit, before it is parsed.

    A declared Content-Length over the limit is refused before a byte is read; a chunked
    body is cut off as soon as it passes the limit while streaming.
    (FastAPI's own max_body_size answers text/plain, so it is not used.)
    """

    def __init__(self, app: ASGIApp, max_body_size: int) -> None:
        self.app = app
        self.max_body_size = max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        detail = f"request bodies are limited to {self.max_body_size} bytes"
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_size:
            await problem_response(None, "PAYLOAD_TOO_LARGE", detail)(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_size:
                    # Raised inside the route's body read; the problem handler renders it.
                    raise HTTPException(413, detail)
            return message

        await self.app(scope, limited_receive, send)
