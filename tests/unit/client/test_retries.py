"""Which problems the client retries (client/errors.py: retryable): docs/client.md promises a few
retries on 503, and an identity provider's token that cannot be checked for a moment (its keys, or
its introspection endpoint, out of reach) is such a 503. The server here is httpx's MockTransport
answering as api/errors.py would; the real server's 503s are tested on the server's side."""

import asyncio

import httpx
import pytest

from api.errors import PROBLEMS
from client import AsyncReviewQueueClient, IdentityProviderUnavailable, ReviewQueueClient, ReviewQueueError
from client.errors import problem_error, retryable

# 503s that say the server is set up without something: asking again cannot help.
NOT_TRANSIENT = {"NOT_CONFIGURED"}


class Server:
    """Answers `code` (a problem) `failures` times, then the empty resolution catalogue."""

    def __init__(self, code: str, failures: int) -> None:
        self.code, self.failures, self.calls = code, failures, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.failures:
            status = PROBLEMS[self.code][0]
            problem = {"type": "about:blank", "status": status, "code": self.code, "detail": "a moment"}
            return httpx.Response(
                status, json=problem, headers={"Content-Type": "application/problem+json", "Retry-After": "5"}
            )
        return httpx.Response(200, json={"resolutions": []})


def test_every_transient_503_is_retried() -> None:
    for code, (status, _title) in PROBLEMS.items():
        if status == 503:
            error = problem_error(status, {"code": code, "detail": ""})
            assert retryable(error) is (code not in NOT_TRANSIENT), code


def test_a_provider_that_cannot_check_a_token_for_a_moment_is_retried() -> None:
    server = Server("IDENTITY_PROVIDER_UNAVAILABLE", failures=2)
    http = httpx.Client(base_url="http://rq.test", transport=httpx.MockTransport(server))
    with ReviewQueueClient("http://rq.test", "opaque-token", http=http) as rq:
        assert rq.resolutions() == []
    assert server.calls == 3


def test_the_async_client_retries_it_too() -> None:
    server = Server("IDENTITY_PROVIDER_UNAVAILABLE", failures=1)

    async def call() -> None:
        http = httpx.AsyncClient(base_url="http://rq.test", transport=httpx.MockTransport(server))
        async with AsyncReviewQueueClient("http://rq.test", "opaque-token", http=http) as rq:
            assert await rq.resolutions() == []

    asyncio.run(call())
    assert server.calls == 2


def test_retries_end_and_the_typed_error_is_raised() -> None:
    server = Server("IDENTITY_PROVIDER_UNAVAILABLE", failures=10)
    http = httpx.Client(base_url="http://rq.test", transport=httpx.MockTransport(server))
    with (
        ReviewQueueClient("http://rq.test", "opaque-token", retries=1, http=http) as rq,
        pytest.raises(IdentityProviderUnavailable),
    ):
        rq.resolutions()
    assert server.calls == 2
    server = Server("NOT_CONFIGURED", failures=10)
    http = httpx.Client(base_url="http://rq.test", transport=httpx.MockTransport(server))
    with ReviewQueueClient("http://rq.test", "token", http=http) as rq, pytest.raises(ReviewQueueError):
        rq.resolutions()
    assert server.calls == 1
