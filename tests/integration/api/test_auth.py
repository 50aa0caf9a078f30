"""Who may call what: 401 without a valid token, 403 for the wrong role."""

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.support.api import Auth, assert_problem, item_body

UNKNOWN = "00000000-0000-0000-0000-000000000000"

# (method, path, body, roles allowed)
ENDPOINTS = [
    ("POST", "/items", item_body, {"ingest", "admin"}),
    ("GET", f"/items/{UNKNOWN}", None, {"reviewer", "ingest", "auditor", "admin"}),
    ("POST", "/leases", lambda: {"batch_size": 1}, {"reviewer", "admin"}),
    ("POST", f"/items/{UNKNOWN}/complete", lambda: {"resolution": "APPROVED"}, {"reviewer", "admin"}),
    ("POST", "/admin/reclaim", lambda: {}, {"admin"}),
    ("GET", "/audit/export", None, {"auditor", "admin"}),
]


def call(client: TestClient, method: str, path: str, body: Callable | None, headers: dict) -> object:
    return client.request(method, path, json=body() if body else None, headers=headers)


@pytest.mark.parametrize(("method", "path", "body", "allowed"), ENDPOINTS)
def test_role_matrix(client: TestClient, auth: Auth, method: str, path: str, body, allowed: set) -> None:
    for role in ("reviewer", "ingest", "auditor", "admin"):
        response = call(client, method, path, body, auth(f"someone-{role}", role))
        if role in allowed:
            assert response.status_code not in (401, 403), (
                f"{role} refused on {method} {path}: {response.text}"
            )
        else:
            assert_problem(response, 403, "FORBIDDEN")


@pytest.mark.parametrize(("method", "path", "body", "allowed"), ENDPOINTS)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer rq_unknown"},
        {"Authorization": "Basic YWxpY2U6cHc="},
        {"Authorization": "Bearer"},
    ],
)
def test_missing_or_unknown_token_is_401(
    client: TestClient, method, path, body, allowed, headers: dict
) -> None:
    response = call(client, method, path, body, headers)
    assert_problem(response, 401, "UNAUTHENTICATED")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/docs", "/openapi.json"])
def test_open_endpoints_need_no_token(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 200


def test_requests_that_miss_the_token_cache_at_once_share_one_lookup(
    db_url: str, make_token: Callable[[str, str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 feed long-pollers with one token all missed the cache when its entry expired (every
    REVIEW_QUEUE_TOKEN_CACHE_S) and each took a pooled connection to look it up: 503s on the
    other routes. Now the requests that miss at once wait for one lookup."""
    import asyncio
    import threading
    from typing import Any

    from api import deps
    from api.app import create_app
    from tests.support.postgres import make_settings

    lookups = [0]
    original = deps.find_principal

    async def slow(*args: Any, **kw: Any) -> Any:
        lookups[0] += 1
        await asyncio.sleep(0.5)  # every request below arrives while the first lookup runs
        return await original(*args, **kw)

    monkeypatch.setattr(deps, "find_principal", slow)
    reader = {"Authorization": f"Bearer {make_token('ledger', 'integration')}"}
    with TestClient(
        create_app(make_settings(db_url, token_cache_s=5)), raise_server_exceptions=False
    ) as client:
        statuses: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: statuses.append(client.get("/events", headers=reader).status_code)
            )
            for _ in range(20)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert statuses == [200] * 20, statuses
        assert lookups[0] == 1, f"{lookups[0]} lookups of one token for 20 requests at once"
        assert client.get("/events", headers=reader).status_code == 200 and lookups[0] == 1  # cached
