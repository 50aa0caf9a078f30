"""The route class every router uses: exact decimals from JSON, bounded retries, 503 on database trouble."""

import asyncio
import email.message
import functools
import json
import logging
import random
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from decimal import Decimal
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from api.errors import ProblemError
from api.metrics import DB_UNAVAILABLE, LOCK_TIMEOUTS
from db.errors import DatabaseUnavailable, classify, is_lock_timeout, is_retryable

log = logging.getLogger("review_queue.api")

MAX_ATTEMPTS = 3


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # JSON would keep the last of a key given twice: {"variance_amount": "1.00", ...,
    # "variance_amount": "99999.00"} would be read as 99999.00, and another reader of the same
    # body (a log, a proxy, an audit copy) might take the first. I-JSON (RFC 7493) forbids it.
    found = dict(pairs)
    if len(found) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} appears twice in one object")
            seen.add(key)
    return found


class DecimalJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # A JSON number becomes a Decimal, never a float: 1234567890123456.78 must not
            # arrive as 1234567890123456.8. NaN/Infinity become Decimals the models refuse.
            # Every body of every route is parsed here, and only here.
            body = await self.body()
            try:
                self._json = json.loads(
                    body, parse_float=Decimal, parse_constant=Decimal, object_pairs_hook=_unique_keys
                )
            except json.JSONDecodeError as error:
                # FastAPI reports only error.msg: put the position into it, in words.
                where = f"at line {error.lineno}, column {error.colno} (character {error.pos})"
                raise json.JSONDecodeError(f"{error.msg} {where}", error.doc, error.pos) from None
            except (ValueError, RecursionError) as error:
                # Invalid UTF-8, a 5000-digit integer, 5000-deep nesting or a key given twice:
                # still just invalid JSON (422).
                raise json.JSONDecodeError(str(error) or type(error).__name__, "", 0) from None
        return self._json


def _parses_as_json(content_type: str | None) -> bool:
    # As FastAPI decides whether to parse a body as JSON: application/json or application/*+json.
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


_cached_is_json = functools.lru_cache(maxsize=256)(_parses_as_json)


def _is_json(content_type: str | None) -> bool:
    # Clients send a handful of distinct values, on every request; only short ones are kept, or
    # unauthenticated requests with huge distinct headers could fill the cache with megabytes.
    if content_type is not None and len(content_type) > 100:
        return _parses_as_json(content_type)
    return _cached_is_json(content_type)


async def _committed(
    handler: Callable[[Request], Coroutine[Any, Any, Response]], request: Request
) -> Response:
    """The handler's response, with the request's transaction (api.deps.Conn, a dependency of scope
    "function") committed, or its error raised, here: inside the retries and the translation to 503
    of QueueRoute. FastAPI closes such dependencies in an exit stack of its own, after the handler
    and outside the route, where an error at COMMIT (a lock timeout on NOTIFY's queue lock) was a
    500 in the logs and metrics and an ASGI traceback; so the route provides the stack."""
    async with AsyncExitStack() as stack:
        request.scope["fastapi_function_astack"] = stack
        return await handler(request)


class QueueRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        takes_body = self.body_field is not None

        async def route(request: Request) -> Response:
            request = DecimalJSONRequest(request.scope, request.receive)
            if takes_body and not _is_json(request.headers.get("content-type")) and await request.body():
                # FastAPI would hand the raw bytes to the model, which then says "must be a JSON
                # object": true, but it hides what is wrong (curl -d sends a form content type).
                raise ProblemError(
                    "VALIDATION_ERROR",
                    "Content-Type: application/json is required for this body, got "
                    + (
                        repr(request.headers["content-type"]) if "content-type" in request.headers else "none"
                    ),
                    extra={
                        "errors": [
                            {
                                "loc": ["header", "content-type"],
                                "msg": "must be application/json",
                                "type": "content_type",
                            }
                        ]
                    },
                )
            for attempt in range(1, MAX_ATTEMPTS + 1):
                try:
                    return await _committed(handler, request)
                except Exception as error:
                    # The transaction was rolled back as the error left the dependency, so a
                    # deadlock or serialization failure can safely run the whole request again.
                    if is_retryable(error) and attempt < MAX_ATTEMPTS:
                        log.warning("transaction_retry", extra={"attempt": attempt, "path": request.url.path})
                        jitter = random.uniform(0.005, 0.05)  # noqa: S311 - jitter, not a secret
                        await asyncio.sleep(jitter * attempt)
                        continue
                    reason = classify(error)
                    if reason is None:
                        raise
                    if is_lock_timeout(error):
                        LOCK_TIMEOUTS.labels(self.path).inc()
                    DB_UNAVAILABLE.labels(self.path).inc()
                    raise DatabaseUnavailable(reason) from error
            raise AssertionError("unreachable")

        return route
