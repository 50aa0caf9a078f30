"""The route class every router uses: exact decimals from JSON, bounded retries, 503 on database trouble."""

import asyncio
import json
import logging
import random
from collections.abc import Callable, Coroutine
from decimal import Decimal
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from api.metrics import DB_UNAVAILABLE, LOCK_TIMEOUTS
from db.errors import DatabaseUnavailable, classify, is_lock_timeout, is_retryable

log = logging.getLogger("review_queue.api")

MAX_ATTEMPTS = 3


class DecimalJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # A JSON number becomes a Decimal, never a float: 1234567890123456.78 must not
            # arrive as 1234567890123456.8. NaN/Infinity become Decimals the models refuse.
            body = await self.body()
            try:
                self._json = json.loads(body, parse_float=Decimal, parse_constant=Decimal)
            except (ValueError, RecursionError) as error:
                if isinstance(error, json.JSONDecodeError):
                    raise
                # A 5000-digit integer or 5000-deep nesting: still just invalid JSON (422).
                raise json.JSONDecodeError(str(error) or type(error).__name__, "", 0) from None
        return self._json


class QueueRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            request = DecimalJSONRequest(request.scope, request.receive)
            for attempt in range(1, MAX_ATTEMPTS + 1):
                try:
                    return await handler(request)
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
