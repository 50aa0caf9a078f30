"""Small helpers shared by the API tests."""

import itertools
from typing import Any

import httpx

_keys = itertools.count(1)


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
