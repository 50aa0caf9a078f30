"""API fuzzing with schemathesis: every documented operation, with a real token of each role.

The schema is the document the app serves at /openapi.json. For every operation schemathesis
sends valid and invalid requests (examples, coverage and fuzzing phases) in-process (ASGI) to an
app built on the test's own database, with a real token of the role under test, and checks each
answer: never a 5xx, only documented status codes, content types and headers, bodies that match
the documented schema, and invalid input refused with a 4xx.
"""

from collections.abc import Callable, Iterator
from typing import Any

import hypothesis
import psycopg
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.python.asgi import shutdown_lifespans

from api.app import create_app
from api.settings import Settings
from tests.support import LONG, backdate_lease, seed_items
from tests.support.api import assert_problem
from tests.support.openapi import OPENAPI
from tests.support.shared_db import SharedDatabase

ROLES = ("reviewer", "approver", "ingest", "auditor", "admin", "integration")
MAX_EXAMPLES = 1000 if LONG else 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    # The input schema admits exactly what the API accepts (money as the pattern or a number of
    # cents, strict integers, lease tokens by their alphabet): schema-valid data is never a 422.
    # 409 is the domain's answer to a valid request (not your lease, key reused, not quarantined).
    positive_data_acceptance,
]


# Loaded once at import, not with schemathesis.pytest.from_fixture: that loader (schemathesis
# 4.32) sets pytest's Function._nodeid, which pytest 9.2 no longer has. The app under test is
# built per test, on the test's database, and passed to each call as `app=`.
schema = schemathesis.openapi.from_dict(
    OPENAPI,
    config=schemathesis.Config.from_dict(
        {
            # Reproducible in CI; the long run explores instead.
            **({} if LONG else {"seed": 20260101}),
            "generation": {
                "mode": "all",  # valid and invalid requests
                "max-examples": MAX_EXAMPLES,
                "deterministic": not LONG,
                # The bearer token is the test's, not fuzzed input: a generated (or deliberately
                # broken) Authorization header replaced by a valid token would turn a negative
                # case into a valid one. No token, bad tokens and roles are test_authz_matrix's.
                "with-security-parameters": False,
            },
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409"]}
            },
            # A report's period has rules across parameters that JSON Schema cannot state (`to` after
            # `from`, at most 366 days, Mondays for weeks, a date that exists: 2026-02-30 passes the
            # pattern; the operation's `x-period` states them): schema-valid parameters may be a 422
            # there, still a problem, never a 5xx.
            "operations": [
                # An item's amount has at most its currency's decimals, and without a currency those
                # of the base currency (enqueue) or of the item's own (revision): a rule across two
                # fields and the deployment or the stored item, which this schema does not state, so
                # "1.234" without a currency is schema-valid and a 422
                # (tests/integration/api/test_currency.py).
                {
                    "include-operation-id": ["enqueueItem", "enqueueItems", "reviseItem"],
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                },
                {
                    "include-path-regex": "^/reports/",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                },
            ],
        }
    ),
)


@pytest.fixture(params=ROLES)
def role(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def bearer(role: str, make_token: Callable[[str, str], str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_token(f'fuzz-{role}', role)}"}


@pytest.fixture(scope="module")
def fuzzed_apps() -> Iterator[dict[tuple[str, int], FastAPI]]:
    """The apps schemathesis calls, one per database (the worker's shared one, unless it was made
    anew): an app's start (its pool, its LISTEN connection) per test was a quarter of its setup."""
    made: dict[tuple[str, int], FastAPI] = {}
    yield made
    # schemathesis ran these apps' lifespans (their engines) on its own event loop: closed before
    # the databases go.
    shutdown_lifespans()


@pytest.fixture
def app(
    settings: Settings,
    sql: psycopg.Connection,
    client: TestClient,
    shared_db: SharedDatabase,
    fuzzed_apps: dict[tuple[str, int], FastAPI],
    make_token: Callable[[str, str], str],
    role: str,
    bearer: dict[str, str],
) -> FastAPI:
    """The app on this test's database, with items in every state so that the success paths and
    their response schemas are exercised too, not only 404 and 422: pending, leased by the caller
    (lease_token shown) and by someone else, resolved, released, renewed, and reclaimable. The
    database is reset after each test; the app that serves it is kept."""
    seed_items(sql, 40)
    other = {"Authorization": f"Bearer {make_token('fuzz-other', 'reviewer')}"}
    held = client.post("/leases", json={"batch_size": 6}, headers=other).json()["items"]
    for item, action, body in (
        (held[0], "complete", {"resolution": "APPROVED", "note": "fuzz"}),
        (held[1], "complete", {"resolution": "WRITE_OFF", "note": "fuzz"}),
        (held[2], "release", {"reason": "fuzz"}),
        (held[3], "renew", {"lease_token": held[3]["lease_token"]}),
    ):
        assert client.post(f"/items/{item['id']}/{action}", json=body, headers=other).status_code == 200
    backdate_lease(sql, held[4]["id"])  # past its reclaim grace
    # Two proposals awaiting approval (issue 12), one of them leased by an approver caller.
    sql.execute(
        "UPDATE review_queue_item SET state = 'AWAITING_APPROVAL', prepared_by = 'fuzz-other',"
        " proposed_resolution = 'ADJUSTMENT_POSTED', proposed_note = 'JE-1', prepared_at = now()"
        " WHERE id IN (SELECT id FROM review_queue_item WHERE state = 'PENDING'"
        " ORDER BY created_at DESC LIMIT 2)"
    )
    if role in ("approver", "admin"):
        approval = client.post("/leases", json={"queue": "approval", "batch_size": 1}, headers=bearer)
        assert len(approval.json()["items"]) == 1, approval.text
    if role in ("reviewer", "approver", "admin"):
        assert len(client.post("/leases", json={"batch_size": 3}, headers=bearer).json()["items"]) == 3
    key = (settings.database_url, shared_db.generation)
    if key not in fuzzed_apps:
        # Plain http receivers, so that every URL the schema admits is taken (https-only is tested
        # in tests/system/test_deliverer.py).
        fuzzed_apps[key] = create_app(settings.model_copy(update={"webhook_allow_http": True}))
    return fuzzed_apps[key]


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=not LONG,
    deadline=None,
    database=None,
    # One database per operation and role, shared by its examples; each example is a real
    # request and transaction.
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.filter_too_much,
        hypothesis.HealthCheck.data_too_large,
    ],
)
def test_api_conforms_to_its_schema(
    case: schemathesis.Case[Any], app: FastAPI, bearer: dict[str, str]
) -> None:
    wait_s = case.body.get("wait_s") if isinstance(case.body, dict) else None
    whole = isinstance(wait_s, int | float) and not isinstance(wait_s, bool) and wait_s == int(wait_s)
    if whole and 0 < wait_s <= 20:  # type: ignore[operator]
        # A valid long poll on an empty queue would sit out its wait in every example; its waiting is
        # tested in test_long_poll.py. 0 keeps a valid body valid and an invalid one invalid.
        case.body["wait_s"] = 0
    query_wait = str(case.query.get("wait_s", "")) if isinstance(case.query, dict) else ""
    if query_wait.isascii() and query_wait.isdigit() and 0 < int(query_wait) <= 20:
        case.query["wait_s"] = 0  # the same for the change feed's long poll (tests/system/api/test_feed.py)
    case.call_and_validate(app=app, headers=bearer, checks=CHECKS)


def test_fuzzed_schema_is_the_one_served(client: TestClient) -> None:
    assert client.get("/openapi.json").json() == OPENAPI


# Found by the fuzzer, pinned here so that each is reported on its own, with a readable request.


def _rows(sql: psycopg.Connection) -> list[tuple[str]]:
    return sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i ORDER BY id").fetchall()


@pytest.mark.parametrize(
    "path",
    [
        "/items",
        "/items/batch",
        "/leases",
        "/items/{held}/complete",
        "/items/complete",
        "/items/{held}/renew",
        "/items/{held}/release",
        "/admin/reclaim",
        "/items/{held}/revisions",
        "/admin/items/{held}/release",
        "/admin/items/{held}/reassign",
        "/admin/reviewers/root/release",
    ],
)
@pytest.mark.parametrize("number", ["1.5", "-4.889890540256846e+16", "1e400"])
def test_a_json_number_is_no_body(
    client: TestClient,
    sql: psycopg.Connection,
    auth: Callable[[str, str], dict[str, str]],
    path: str,
    number: str,
) -> None:
    """A body that is a JSON number with a fraction or an exponent is a 422, like `5` or `"x"`,
    and does nothing; it must not pass for an empty body (which would lease a default batch)."""
    seed_items(sql, 3)
    admin = auth("root", "admin")
    (held,) = client.post("/leases", json={"batch_size": 1}, headers=admin).json()["items"]
    before = _rows(sql)
    response = client.post(
        path.format(held=held["id"]), content=number, headers={**admin, "content-type": "application/json"}
    )
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert _rows(sql) == before


@pytest.mark.parametrize("parameter", ["created_after", "created_before"])
@pytest.mark.parametrize("value", ["0.5", "1700000000", "20260101"])
def test_created_bounds_are_rfc3339_not_unix_seconds(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], parameter: str, value: str
) -> None:
    """`created_after=20260101` must not silently mean 1970-08-23T11:48:21Z (Unix seconds)."""
    response = client.get("/items", params={parameter: value}, headers=auth("root", "admin"))
    assert_problem(response, 422, "VALIDATION_ERROR")


@pytest.mark.parametrize(
    ("path", "body"),
    [("/leases", {"batch_size": True}), ("/admin/reclaim", {"reclaim_batch": True})],
    ids=["batch_size", "reclaim_batch"],
)
def test_a_boolean_is_no_count(
    client: TestClient,
    sql: psycopg.Connection,
    auth: Callable[[str, str], dict[str, str]],
    path: str,
    body: dict[str, Any],
) -> None:
    """`true` is not the integer 1: documented as an integer, refused like any other non-number."""
    seed_items(sql, 3)
    admin = auth("root", "admin")
    assert client.post("/leases", json={"batch_size": 1}, headers=admin).status_code == 200
    backdate_lease(sql)  # something to reclaim, too
    before = _rows(sql)
    response = client.post(path, json=body, headers=admin)
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert _rows(sql) == before


@pytest.mark.parametrize(
    "cursor",
    [
        "9" * 19,  # beyond bigint: must not reach PostgreSQL as a 500
        "0",
        "01",
        "-1",
        "1.5",
        "1e3",
        "1700000000000000-" + "0" * 32,  # an items cursor
        "é",
        "",
    ],
)
def test_a_forged_events_cursor_is_a_422(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], cursor: str
) -> None:
    admin = auth("root", "admin")
    created = client.post(
        "/items",
        json={"idempotency_key": "k", "ledger_entity": "E", "variance_amount": "1.00",
              "match_decision": "PARTIAL", "source_hash": "h"},
        headers=admin,
    )  # fmt: skip
    response = client.get(f"/items/{created.json()['id']}/events", params={"cursor": cursor}, headers=admin)
    assert_problem(response, 422, "VALIDATION_ERROR")


@pytest.mark.parametrize(
    "body",
    [
        "1.5",
        "null",
        "[]",
        '{"reason": 5}',
        '{"reason": null}',
        '{"reason": "\\u0000"}',
        '{"reason": "x", "x": 1}',
    ],
)
def test_garbage_reopen_bodies_are_422_and_change_nothing(
    client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], dict[str, str]], body: str
) -> None:
    seed_items(sql, 1)
    admin = auth("root", "admin")
    (held,) = client.post("/leases", json={"batch_size": 1}, headers=admin).json()["items"]
    assert (
        client.post(
            f"/items/{held['id']}/complete", json={"resolution": "APPROVED"}, headers=admin
        ).status_code
        == 200
    )
    before = _rows(sql)
    response = client.post(
        f"/items/{held['id']}/reopen", content=body, headers={**admin, "content-type": "application/json"}
    )
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert _rows(sql) == before
