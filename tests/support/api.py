"""Small helpers shared by the API tests."""

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from fastapi.testclient import TestClient

from tests.support import seed_items

_keys = itertools.count(1)


# auth(subject, role) -> headers carrying a fresh real token (the `auth` fixture).
Auth = Callable[[str, str], dict[str, str]]


def item_body(**overrides: Any) -> dict[str, Any]:
    n = next(_keys)
    body: dict[str, Any] = {
        "idempotency_key": f"key-{n}",
        "ledger_entity": "ACME-CORP",
        "variance_amount": "12.50",
        "match_decision": "UNMATCHED",
        "source_hash": f"hash-{n}",
    }
    body.update(overrides)
    return body


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is RFC 9457 problem+json with this status and stable code."""
    assert response.status_code == status, (
        f"expected {status} {code}, got {response.status_code}: {response.text}"
    )
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    for field in ("type", "title", "detail"):
        assert isinstance(body[field], str) and body[field], f"problem field {field} missing: {body}"
    assert "Traceback" not in response.text
    return body


# The largest amount there is: a materiality threshold no item reaches (only the codes' own apply).
ABOVE_EVERY_AMOUNT = "9999999999999999.99"


def set_materiality(client: Any, admin_token: str, threshold: str) -> None:
    """PUT /resolutions/policy as an admin (client: a TestClient or an httpx.Client)."""
    answer = client.put(
        "/resolutions/policy",
        json={"materiality_threshold": threshold},
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    assert answer.status_code == 200, answer.text


# A 503 (the database cannot serve this request now) is asked again, as the client and the desk do,
# this many times, a second apart: on a 2-core machine running the rest of the suite a statement can
# pass its deadline. One that persists fails the test.
UNAVAILABLE_RETRIES = 5


def drain_concurrently(
    base: str, make_token: Callable[[str, str], str], sql: psycopg.Connection, *, total: int, clients: int
) -> None:
    """`clients` reviewers lease and complete `total` items at once; each is resolved exactly once."""
    seed_items(sql, total)
    leased: list[str] = []
    statuses: list[int] = []
    refused: list[str] = []  # what each answer but 200 said
    barrier = threading.Barrier(clients)

    def post(http: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, bool]:
        """The answer, and whether the request was asked again after a 503."""
        asked = 1
        while (response := http.post(path, json=body)).status_code == 503 and asked < UNAVAILABLE_RETRIES:
            statuses.append(503)
            print(f"{path}: 503, asked again: {response.text}")
            time.sleep(1)
            asked += 1
        statuses.append(response.status_code)
        if response.status_code != 200:
            refused.append(f"{path}: {response.status_code} {response.text}")
        return response, asked > 1

    def reviewer(n: int) -> None:
        headers = {"Authorization": f"Bearer {make_token(f'reviewer-{n}', 'reviewer')}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            barrier.wait()
            while True:
                response, _ = post(http, "/leases", {"batch_size": 1 + n % 5})
                if response.status_code != 200:
                    return
                items = response.json()["items"]
                if not items:
                    return
                for item in items:
                    leased.append(item["id"])
                    done, again = post(http, f"/items/{item['id']}/complete", {"resolution": "APPROVED"})
                    if done.status_code != 200:
                        return
                    # Asked again after a 503, it may have committed the first time.
                    expected = {"resolved", "already_resolved"} if again else {"resolved"}
                    assert done.json()["outcome"] in expected, done.text

    threads = [threading.Thread(target=reviewer, args=(n,), name=f"reviewer-{n}") for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"reviewers still running after the join timeout: {hung}"

    assert not refused, (Counter(statuses), refused[:5])
    twice = [i for i, n in Counter(leased).items() if n > 1]
    assert not twice, f"DOUBLE_LEASE over HTTP: {twice[:5]}"
    assert len(leased) == total, f"{total - len(leased)} items never handed out"
    rows = sql.execute(
        "SELECT state, count(*), count(DISTINCT resolved_by) > 1 FROM review_queue_item GROUP BY state"
    ).fetchall()
    assert rows == [("RESOLVED", total, True)], rows


def enqueue(client: TestClient, headers: dict[str, str], **fields: Any) -> dict[str, Any]:
    response = client.post("/items", json=item_body(**fields), headers=headers)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


# Crafted requests (tests/integration/api/test_crafted_input.py, and over a socket in tests/system/).
JSON = {"content-type": "application/json"}
# due_at offsets PostgreSQL's timestamptz input does not read the way ISO 8601 means them.
OFFSETS = ["2382-04-29T12:07:24-17:27", "2030-04-29T12:07:24+23:59", "2030-01-01T00:00:00-16:00"]


def raw_body(body: dict[str, Any], *, replace: dict[str, str]) -> bytes:
    """`body` as JSON text, with each placeholder string value replaced by raw JSON text."""
    text = json.dumps(body)
    for placeholder, raw in replace.items():
        text = text.replace(json.dumps(placeholder), raw)
    return text.encode()
