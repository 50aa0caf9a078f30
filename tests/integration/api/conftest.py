"""Fixtures of the API tests."""

from collections.abc import Iterator

import pytest

from tests.support.api import Auth
from tests.support.servers import start_server, stop_server


@pytest.fixture
def tight_server(db_url: str) -> Iterator[str]:
    """`review-queue serve` with a pool of ONE connection and no overflow."""
    process, base = start_server(
        {"DATABASE_URL": db_url, "REVIEW_QUEUE_POOL_SIZE": "1", "REVIEW_QUEUE_POOL_MAX_OVERFLOW": "0"}
    )
    yield base
    stop_server(process)


@pytest.fixture
def root(auth: Auth) -> dict[str, str]:
    return auth("root", "admin")


@pytest.fixture
def alice(auth: Auth) -> dict[str, str]:
    return auth("alice", "reviewer")


@pytest.fixture
def bob(auth: Auth) -> dict[str, str]:
    return auth("bob", "reviewer")


@pytest.fixture
def admin(auth: Auth) -> dict[str, str]:
    return auth("root", "admin")


@pytest.fixture
def ingest(auth: Auth) -> dict[str, str]:
    return auth("matcher", "ingest")
