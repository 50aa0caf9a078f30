"""Domain errors and their rendering as RFC 9457 problem+json with a stable `code`.

Every error a client can see leaves through `problem_response`; nothing else writes an
error body, and no stack trace ever reaches a client.
"""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas import Problem
from db.errors import DatabaseUnavailable, classify

log = logging.getLogger("review_queue.api")

PROBLEM_JSON = "application/problem+json"

# code -> (status, title); the type URI is derived from the code.
PROBLEMS: dict[str, tuple[int, str]] = {
    "BAD_REQUEST": (400, "Bad request"),
    "UNAUTHENTICATED": (401, "Authentication required"),
    "FORBIDDEN": (403, "Not allowed for this role"),
    "CSRF_REJECTED": (403, "Cross-site request refused"),
    "SEGREGATION_OF_DUTIES": (403, "You may not approve or reject your own proposal"),
    # Before NOT_FOUND and DATABASE_UNAVAILABLE: a bare 404 or 503 takes the last code of its status.
    "OIDC_NOT_CONFIGURED": (404, "Sign-in with an identity provider is not configured"),
    "NOT_FOUND": (404, "Not found"),
    "METHOD_NOT_ALLOWED": (405, "Method not allowed"),
    "LEASE_NOT_HELD": (409, "Lease not held"),
    "IDEMPOTENCY_CONFLICT": (409, "Idempotency key reused with a different payload"),
    "RESOLUTION_CONFLICT": (409, "Already resolved with a different resolution"),
    "NOT_QUARANTINED": (409, "Item is not quarantined"),
    "NOT_RESOLVED": (409, "Item is not resolved"),
    "NOT_ASSIGNED": (409, "Item is not assigned"),
    "ALREADY_HELD": (409, "Item already held by that reviewer"),
    "NOT_A_REVIEWER": (409, "No reviewer by that name"),
    "REVIEWER_AT_CAP": (409, "That reviewer holds as many items as anyone may"),
    "SOURCE_CHANGED": (409, "The figures changed under your lease"),
    "BASE_CURRENCY": (409, "The base currency's rate is 1 by definition"),
    "PAYLOAD_TOO_LARGE": (413, "Request body too large"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "Unsupported media type"),
    "VALIDATION_ERROR": (422, "Request validation failed"),
    "FEED_BUSY": (429, "Too many feed readers waiting"),
    "INTERNAL_ERROR": (500, "Internal error"),
    "IDENTITY_PROVIDER_UNAVAILABLE": (503, "Identity provider unavailable"),
    "DATABASE_UNAVAILABLE": (503, "Database unavailable"),
    "NOT_CONFIGURED": (503, "Not configured on this server"),
}

_HTTP_CODES = {status: code for code, (status, _) in PROBLEMS.items()}


def problem_responses(*codes: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` documenting these problem codes as application/problem+json."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(PROBLEMS[code][0], []).append(code)
    return {
        status: {
            "model": Problem,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
            "description": " or ".join(f"`{c}` ({PROBLEMS[c][1].lower()})" for c in names),
        }
        for status, names in by_status.items()
    }


# Every authenticated route can answer these.
COMMON_PROBLEMS = problem_responses(
    "UNAUTHENTICATED", "FORBIDDEN", "PAYLOAD_TOO_LARGE", "VALIDATION_ERROR", "DATABASE_UNAVAILABLE"
)


class ProblemError(Exception):
    def __init__(
        self,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.headers = headers
        self.extra = extra or {}


def problem_body(code: str, detail: str, *, instance: str | None = None, **extra: Any) -> dict[str, Any]:
    status, title = PROBLEMS[code]
    body: dict[str, Any] = {
        "type": f"/problems/{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(extra)
    return body


def problem_response(
    request: Request | None,
    code: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    instance = request.url.path if request is not None else None
    body = problem_body(code, detail, instance=instance, **extra)
    return JSONResponse(body, status_code=body["status"], headers=headers, media_type=PROBLEM_JSON)


def unavailable(request: Request | None, detail: str) -> JSONResponse:
    return problem_response(request, "DATABASE_UNAVAILABLE", detail, headers={"Retry-After": "1"})


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    # loc/msg/type only: echoing the input back could reflect a megabyte of garbage.
    return [
        {"loc": list(err.get("loc", ())), "msg": _message(err), "type": str(err.get("type", ""))}
        for err in exc.errors()
    ]


def _message(err: Any) -> str:
    if err.get("type") == "json_invalid":
        # FastAPI's own msg is only "JSON decode error"; api.routing put the problem and its
        # position in words into ctx.error.
        return f"the body is not valid JSON: {err.get('ctx', {}).get('error', 'unreadable')}"
    return str(err.get("msg", ""))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers on this path. Starlette's 405 names the methods of the first
    route whose path matched only (DELETE /items said `Allow: POST`, though GET /items exists)."""
    methods: set[str] = set()
    for context in iter_route_contexts(request.app.routes):
        regex = getattr(context, "path_regex", None)
        if regex is not None and regex.match(request.scope["path"]):
            methods |= context.methods or set()
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(request, exc.code, exc.detail, headers=exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _validation_errors(exc)
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"])
        if first.get("type") == "json_invalid":
            where = "body"
        return problem_response(
            request,
            "VALIDATION_ERROR",
            f"{where}: {first['msg']}" if where else str(first["msg"]),
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "BAD_REQUEST" if exc.status_code < 500 else "INTERNAL_ERROR")
        detail = exc.detail if isinstance(exc.detail, str) else PROBLEMS[code][1]
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            allow = ", ".join(allowed_methods(request))
            headers = {**(headers or {}), "Allow": allow}
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {allow}"
        return problem_response(request, code, detail, headers=headers)

    @app.exception_handler(DatabaseUnavailable)
    async def _db_unavailable(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        return unavailable(request, str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Database trouble is the one unexpected failure a client can act on (retry later).
        reason = classify(exc)
        if reason is not None:
            log.warning("database_unavailable", extra={"reason": reason, "path": request.url.path})
            return unavailable(request, reason)
        log.exception("unhandled_error", extra={"path": request.url.path})
        return problem_response(request, "INTERNAL_ERROR", "an unexpected error occurred; it has been logged")
