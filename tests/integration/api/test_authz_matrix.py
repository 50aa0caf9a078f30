"""The authorization matrix: every route x every kind of caller x whose item, with the exact answer.

Callers: no token, a revoked token, and a valid token of each role. For the item routes the target
is the caller's own item (leased by the caller), another reviewer's item, or an unknown id. Every
refused call is checked in the database to have changed nothing, and so is every call that only
reads. The calls that are allowed to write run on a fresh world each and must change exactly
what they say, for the token's subject.

Then: fields a client must not set (leased_by, resolved_by, state, ...) sent in a body are refused
with 422 and nothing is applied, and identity headers (X-Forwarded-User, X-Remote-User,
X-Forwarded-For) change nothing: the identity is the token's subject.
"""

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from api.app import create_app
from tests.support import seed_items
from tests.support.api import assert_problem, item_body
from tests.support.postgres import admin_sql, create_token, libpq, make_settings, revoke_tokens, with_database

# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------

PUBLIC = None  # no token needed
MATCH_CONFIRMED_DESCRIPTION = "The two sides agree; the matcher was too strict."  # as seeded
ANY_ROLE = frozenset({"reviewer", "approver", "ingest", "auditor", "admin"})
REVIEWERS = frozenset({"reviewer", "approver", "admin"})
APPROVERS = frozenset({"approver", "admin"})
STATS_READERS = frozenset({"reviewer", "approver", "auditor", "admin"})
AUDITORS = frozenset({"auditor", "admin"})
INGEST = frozenset({"ingest", "admin"})
ADMIN = frozenset({"admin"})
# The integration role reads the change feed, and may ask who it is; nothing else.
EVERYONE = ANY_ROLE | {"integration"}
FEED_READERS = frozenset({"auditor", "admin", "integration"})


REPORT_PERIOD = {"from": "2026-11-02", "to": "2026-12-07"}


@dataclass(frozen=True)
class Route:
    roles: frozenset[str] | None
    ok: int = 200
    item: bool = False  # has {item_id}
    holder_only: bool = False  # only the lease holder may call it: anyone else is 409 LEASE_NOT_HELD
    writes: bool = False  # an allowed call changes the queue
    # Allowed callers get this 409 code on every existing item of the world (none is in the state
    # the route needs); the route's success path is tested on its own.
    conflict: str | None = None
    body: Callable[..., Any] | None = None
    code: str | None = None  # the problem code of a public route whose answer is a refusal
    # The item goes in the body (`body(item_id)`), as one entry of a batch: a refused entry is
    # answered 200 with the problem the single route gives (checked per entry), and changes nothing.
    body_item: bool = False
    params: dict[str, str] | None = None  # query parameters of a call that succeeds


MATRIX: dict[tuple[str, str], Route] = {
    ("GET", "/healthz"): Route(PUBLIC),
    ("GET", "/readyz"): Route(PUBLIC),
    ("POST", "/items"): Route(INGEST, ok=201, writes=True, body=item_body),
    ("POST", "/items/batch"): Route(INGEST, writes=True, body=lambda: {"items": [item_body()]}),
    ("GET", "/items"): Route(ANY_ROLE),
    ("GET", "/items/{item_id}"): Route(ANY_ROLE, item=True),
    ("GET", "/items/{item_id}/events"): Route(ANY_ROLE, item=True),
    ("GET", "/decisions"): Route(ANY_ROLE),
    ("POST", "/leases"): Route(REVIEWERS, writes=True, body=lambda: {"batch_size": 1}),
    ("POST", "/items/{item_id}/complete"): Route(
        REVIEWERS, item=True, holder_only=True, writes=True, body=lambda: {"resolution": "APPROVED"}
    ),
    ("POST", "/items/complete"): Route(
        REVIEWERS,
        item=True,
        holder_only=True,
        writes=True,
        body_item=True,
        body=lambda item_id: {"items": [{"id": item_id, "resolution": "APPROVED"}]},
    ),
    ("POST", "/items/{item_id}/renew"): Route(
        REVIEWERS, item=True, holder_only=True, writes=True, body=lambda: {}
    ),
    ("POST", "/items/{item_id}/release"): Route(
        REVIEWERS, item=True, holder_only=True, writes=True, body=lambda: {"reason": "authz matrix"}
    ),
    ("POST", "/items/{item_id}/requeue"): Route(
        ADMIN, item=True, conflict="NOT_QUARANTINED", body=lambda: {"reason": "authz matrix"}
    ),
    # Every item of this world is ASSIGNED: an admin's reopen is refused and changes nothing
    # (reopening a RESOLVED item is tests/system/api/test_reopen.py's and the model test's).
    ("POST", "/items/{item_id}/reopen"): Route(
        ADMIN, item=True, conflict="NOT_RESOLVED", body=lambda: {"reason": "authz matrix"}
    ),
    # Every item of this world is ASSIGNED (none awaits approval): an approver's approve or reject
    # holds no approval lease, so it is refused and changes nothing (the success paths are
    # tests/integration/api/test_approval.py's and the model test's).
    ("POST", "/items/{item_id}/approve"): Route(
        APPROVERS, item=True, conflict="LEASE_NOT_HELD", body=lambda: {}
    ),
    ("POST", "/items/{item_id}/reject"): Route(
        APPROVERS, item=True, conflict="LEASE_NOT_HELD", body=lambda: {"reason": "authz matrix"}
    ),
    # A comment writes one COMMENTED event on any existing item, whoever holds it, and no item row.
    ("POST", "/items/{item_id}/comments"): Route(
        ANY_ROLE, ok=201, item=True, writes=True, body=lambda: {"text": "authz matrix"}
    ),
    ("GET", "/resolutions"): Route(ANY_ROLE),
    # The admin's PUT writes the seeded values again: the catalogue, not the queue, and the same.
    ("PUT", "/resolutions/{code}"): Route(
        ADMIN, body=lambda: {"label": "Match confirmed", "description": MATCH_CONFIRMED_DESCRIPTION}
    ),
    # Materiality: anyone reads it; the admin's PUT writes the seeded value again (not the queue).
    ("GET", "/resolutions/policy"): Route(ANY_ROLE),
    ("PUT", "/resolutions/policy"): Route(ADMIN, body=lambda: {"materiality_threshold": "10000.00"}),
    # Rates: a treasury feed (ingest) or an admin sets one (not the queue); anyone reads them.
    ("PUT", "/fx-rates/{currency}"): Route(INGEST, body=lambda: {"rate": "1.0850"}),
    ("GET", "/fx-rates"): Route(ANY_ROLE),
    ("GET", "/fx-rates/{currency}/history"): Route(ANY_ROLE),
    # A revision changes any item, leased by anyone (its holder keeps it under a new lease).
    ("POST", "/items/{item_id}/revisions"): Route(
        INGEST,
        item=True,
        writes=True,
        body=lambda: {"variance_amount": "1.00", "source_hash": f"authz-{uuid.uuid4()}"},
    ),
    # The admin's override: any holder's lease (own is the admin's, other is bob's).
    ("POST", "/admin/items/{item_id}/release"): Route(
        ADMIN, item=True, writes=True, body=lambda: {"reason": "authz matrix"}
    ),
    ("POST", "/admin/items/{item_id}/reassign"): Route(
        ADMIN,
        item=True,
        writes=True,
        body=lambda: {"reviewer": SUBJECT["reviewer"], "reason": "authz matrix"},
    ),
    # Releases every lease of bob (OTHER), who holds one item in this world.
    ("POST", "/admin/reviewers/{reviewer}/release"): Route(
        ADMIN, writes=True, body=lambda: {"reason": "authz"}
    ),
    # An allowed reclaim writes only when a lease is past its grace; none is in this world.
    ("POST", "/admin/reclaim"): Route(ADMIN, body=lambda: {}),
    ("GET", "/stats"): Route(STATS_READERS),
    ("GET", "/metrics"): Route(ADMIN),
    # The desk's sign-in reads the token from its body, never from the header: an unknown one
    # is refused whoever calls. Signing out needs no token (it ends the cookie's session, if any).
    ("POST", "/session"): Route(PUBLIC, ok=401, code="UNAUTHENTICATED", body=lambda: {"token": "rq_unknown"}),
    ("GET", "/session"): Route(EVERYONE),
    ("DELETE", "/session"): Route(PUBLIC, ok=204),
    # Sign-in with an identity provider: browser navigations, public. This app has no provider
    # configured, so the two that would redirect say so (tests/system/api/test_oidc.py has them configured).
    ("GET", "/auth/oidc"): Route(PUBLIC),
    ("GET", "/auth/oidc/login"): Route(PUBLIC, ok=404, code="OIDC_NOT_CONFIGURED"),
    ("GET", "/auth/oidc/callback"): Route(PUBLIC, ok=404, code="OIDC_NOT_CONFIGURED"),
    ("GET", "/audit/export"): Route(AUDITORS),
    ("GET", "/events"): Route(FEED_READERS),
    # The admin's PUT writes the world's subscription again: a webhook row, not the queue.
    ("PUT", "/webhooks/{name}"): Route(ADMIN, body=lambda: {"url": WEBHOOK_URL}),
    ("GET", "/webhooks"): Route(ADMIN),
    ("GET", "/webhooks/{name}/deliveries"): Route(ADMIN),
    ("POST", "/webhooks/{name}/redeliver"): Route(ADMIN, body=lambda: {}),
    # The reports: the controller's and the auditor's; every reviewer and approver sees their own
    # throughput (tests/integration/api/test_reports.py checks that the rows are theirs only).
    ("GET", "/reports/sla"): Route(AUDITORS, params=REPORT_PERIOD),
    ("GET", "/reports/throughput"): Route(STATS_READERS, params=REPORT_PERIOD),
    ("GET", "/reports/backlog"): Route(AUDITORS, params=REPORT_PERIOD),
    ("GET", "/reports/decisions.csv"): Route(AUDITORS, params=REPORT_PERIOD),
    ("GET", "/reports/decisions.ndjson"): Route(AUDITORS, params=REPORT_PERIOD),
}
WEBHOOK = "matrix"  # the world's one subscription
WEBHOOK_URL = "https://hooks.example.com/matrix"

CALLERS = ("none", "revoked", "reviewer", "approver", "ingest", "auditor", "admin", "integration")
# The subject of each caller's token; "revoked" is a reviewer whose tokens were revoked after they
# leased an item. OTHER is the reviewer holding "another reviewer's item".
SUBJECT = {
    "revoked": "carol",
    "reviewer": "alice",
    "approver": "april",
    "ingest": "ivan",
    "auditor": "audrey",
    "admin": "ada",
    "integration": "ingrid",
}
OTHER = "bob"
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"


def targets(route: Route, caller: str) -> tuple[str | None, ...]:
    if not route.item:
        return (None,)
    if caller == "none":
        return ("other", "unknown")  # nobody's own item
    return ("own", "other", "unknown")


def expected(route: Route, caller: str, target: str | None) -> tuple[int, str | None]:
    if route.roles is PUBLIC:
        return route.ok, route.code
    if caller in ("none", "revoked"):
        return 401, "UNAUTHENTICATED"
    if caller not in route.roles:
        return 403, "FORBIDDEN"
    if route.body_item:
        return route.ok, None  # the entry's own answer: expected_entry
    if target == "unknown":
        return 404, "NOT_FOUND"
    if route.holder_only and target == "other":
        return 409, "LEASE_NOT_HELD"
    if route.conflict is not None:
        return 409, route.conflict
    return route.ok, None


def expected_entry(route: Route, target: str | None) -> str | None:
    """The problem code of the one entry of a body_item route called by an allowed caller."""
    if target == "unknown":
        return "NOT_FOUND"
    if route.holder_only and target == "other":
        return "LEASE_NOT_HELD"
    return None


def _cases(*, writing: bool) -> Iterator[Any]:
    for (method, path), route in MATRIX.items():
        for caller in CALLERS:
            for target in targets(route, caller):
                status, code = expected(route, caller, target)
                writes = route.writes and status < 300
                if route.body_item:
                    writes = writes and expected_entry(route, target) is None
                if writes == writing:
                    yield pytest.param(
                        method, path, caller, target, status, code, id=f"{method} {path} {caller} {target}"
                    )


NON_WRITING_CASES = list(_cases(writing=False))
WRITING_CASES = list(_cases(writing=True))


def test_every_route_has_a_row_in_the_matrix() -> None:
    app = create_app(make_settings("postgresql+psycopg://matrix@127.0.0.1:1/unused"))
    # Included routers are flattened by FastAPI; the framework's own /docs and /openapi.json are
    # plain Starlette routes and need no token.
    routes = {
        (method, str(context.path))
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, APIRoute)
        for method in context.methods or ()
    }
    assert routes == set(MATRIX), (
        f"routes without a row: {sorted(routes - set(MATRIX))}; rows without a route: "
        f"{sorted(set(MATRIX) - routes)}"
    )


# ---------------------------------------------------------------------------------------------
# The world: items leased by bob, by each caller, and a revoked reviewer
# ---------------------------------------------------------------------------------------------


@dataclass
class World:
    client: TestClient
    sql: psycopg.Connection
    headers: dict[str, dict[str, str]]  # caller -> headers
    own: dict[str, str]  # caller -> id of the item they hold
    other: str  # bob's item

    def item_id(self, caller: str, target: str | None) -> str | None:
        if target is None:
            return None
        return {"own": self.own.get(caller), "other": self.other, "unknown": UNKNOWN_ID}[target]

    def call(self, method: str, path: str, caller: str, target: str | None) -> httpx.Response:
        item_id = self.item_id(caller, target)
        url = path.replace("{item_id}", item_id) if item_id else path
        url = url.replace("{code}", "MATCH_CONFIRMED").replace("{currency}", "EUR")
        url = url.replace("{reviewer}", OTHER).replace("{name}", WEBHOOK)
        route = MATRIX[(method, path)]
        body = route.body
        sent = (body(item_id) if route.body_item else body()) if body else None
        response: httpx.Response = self.client.request(
            method, url, json=sent, params=route.params, headers=self.headers[caller]
        )
        return response


def build_world(
    client: TestClient, sql: psycopg.Connection, url: str, make_token: Callable[[str, str], str]
) -> World:
    seed_items(sql, 9)
    ids = [str(r[0]) for r in sql.execute("SELECT id FROM review_queue_item ORDER BY created_at")]
    bearer = {
        caller: {
            "Authorization": f"Bearer {make_token(subject, 'reviewer' if caller == 'revoked' else caller)}"
        }
        for caller, subject in SUBJECT.items()
    }
    bob = {"Authorization": f"Bearer {make_token(OTHER, 'reviewer')}"}
    # Oldest first: bob gets ids[0], then each reviewer-capable caller the next one.
    holders = [
        ("bob", bob),
        ("reviewer", bearer["reviewer"]),
        ("approver", bearer["approver"]),
        ("admin", bearer["admin"]),
    ]
    holders.append(("revoked", bearer["revoked"]))
    own: dict[str, str] = {}
    for n, (who, headers) in enumerate(holders):
        response = client.post("/leases", json={"batch_size": 1}, headers=headers)
        assert response.status_code == 200, response.text
        assert [i["id"] for i in response.json()["items"]] == [ids[n]]
        own[who] = ids[n]
    # ingest, auditor and integration cannot lease; a row that claims ivan (audrey, ingrid) holds it
    # shows that the role check is what refuses.
    for n, caller in enumerate(("ingest", "auditor", "integration"), start=len(holders)):
        own[caller] = ids[n]
        sql.execute(
            "UPDATE review_queue_item SET state = 'ASSIGNED', leased_by = %s, leased_at = now(),"
            " lease_expires_at = now() + interval '1 hour', lease_epoch = lease_epoch + 1 WHERE id = %s",
            (SUBJECT[caller], own[caller]),
        )
    # What `review-queue token revoke` runs (tests/system/test_cli.py runs the command itself).
    assert revoke_tokens(sql, SUBJECT["revoked"]) == 1
    subscribed = client.put(f"/webhooks/{WEBHOOK}", json={"url": WEBHOOK_URL}, headers=bearer["admin"])
    assert subscribed.status_code == 201, subscribed.text
    return World(client, sql, {"none": {}, **bearer}, own, other=own.pop("bob"))


def snapshot(sql: psycopg.Connection) -> tuple[dict[str, dict[str, Any]], list[tuple[Any, ...]]]:
    items = {
        str(row["id"]): row
        for (row,) in sql.execute("SELECT row_to_json(i) FROM review_queue_item i ORDER BY created_at, id")
    }
    events = sql.execute("SELECT id, item_id, event, actor FROM review_queue_event ORDER BY id").fetchall()
    return items, events


# A longer lease than the default, so that no lease in the shared world can lapse mid-module.
SETTINGS = {"lock_timeout_ms": 120_000}


@pytest.fixture(scope="module")
def shared_world(server_url: str, template_db: str) -> Iterator[World]:
    """One world for every call that must not change anything: each such call is checked to have
    left the database exactly as it was, so they can share it."""
    name = f"rq_authz_{uuid.uuid4().hex[:12]}"
    admin_sql(server_url, f"CREATE DATABASE {name} TEMPLATE {template_db}")
    url = with_database(server_url, name)
    try:
        with (
            TestClient(create_app(make_settings(url, **SETTINGS)), raise_server_exceptions=False) as client,
            psycopg.connect(libpq(url), autocommit=True) as sql,
        ):
            yield build_world(client, sql, url, lambda subject, role: create_token(url, subject, role))
    finally:
        admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def world(db_url: str, sql: psycopg.Connection, make_token: Callable[[str, str], str]) -> Iterator[World]:
    """A world of its own, for a call that is allowed to write."""
    with TestClient(create_app(make_settings(db_url, **SETTINGS)), raise_server_exceptions=False) as client:
        yield build_world(client, sql, db_url, make_token)


# ---------------------------------------------------------------------------------------------
# The matrix, asserted
# ---------------------------------------------------------------------------------------------


def check_answer(response: httpx.Response, status: int, code: str | None) -> None:
    if code is None:
        assert response.status_code == status, (
            f"expected {status}, got {response.status_code}: {response.text}"
        )
        return
    assert_problem(response, status, code)
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path", "caller", "target", "status", "code"), NON_WRITING_CASES)
def test_refused_and_reading_calls_change_nothing(
    shared_world: World,
    method: str,
    path: str,
    caller: str,
    target: str | None,
    status: int,
    code: str | None,
) -> None:
    before = snapshot(shared_world.sql)
    response = shared_world.call(method, path, caller, target)
    check_answer(response, status, code)
    assert snapshot(shared_world.sql) == before, f"{method} {path} by {caller} changed the database"
    route = MATRIX[(method, path)]
    if route.body_item and status == 200:
        (entry,) = response.json()["results"]
        assert (entry["outcome"], entry["problem"]["code"]) == ("refused", expected_entry(route, target)), (
            entry
        )
    if status == 200 and response.headers["content-type"].startswith("application/json"):
        # A lease_token is shown to its holder only (bob's, for one, to nobody here).
        for item in _items_in(response.json()):
            if item["lease_token"] is not None:
                assert item["leased_by"] == SUBJECT[caller], f"{caller} was shown {item['leased_by']}'s token"
        # The feed shows items to systems and auditors: never with a lease token, even the reader's.
        for event in response.json()["events"] if path == "/events" else []:
            assert event["item"]["lease_token"] is None, event


def _items_in(body: Any) -> list[dict[str, Any]]:
    """The items of an item, a list of items or a reclaim answer."""
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        return [i for i in body["items"] if isinstance(i, dict) and "lease_token" in i]
    if isinstance(body, dict) and "lease_token" in body:
        return [body]
    return []


@pytest.mark.parametrize(("method", "path", "caller", "target", "status", "code"), WRITING_CASES)
def test_allowed_writes_change_exactly_their_item_as_the_caller(
    world: World, method: str, path: str, caller: str, target: str | None, status: int, code: str | None
) -> None:
    subject = SUBJECT[caller]
    items_before, events_before = snapshot(world.sql)
    response = world.call(method, path, caller, target)
    check_answer(response, status, code)
    items_after, events_after = snapshot(world.sql)

    changed = {i for i in items_after if items_after[i] != items_before.get(i)}
    new_events = events_after[len(events_before) :]
    assert events_after[: len(events_before)] == events_before
    if path.endswith("/comments"):
        assert not changed, f"a comment changed items {changed}"
        target_id = world.item_id(caller, target)
        assert [(str(e[1]), e[2], e[3]) for e in new_events] == [(target_id, "COMMENTED", subject)], (
            new_events
        )
        assert response.json()["id"] == new_events[0][0]
        return
    assert len(changed) == 1, f"expected exactly one item to change, got {changed}"
    (item_id,) = changed
    row = items_after[item_id]
    assert [(str(e[1]), e[3]) for e in new_events] == [(item_id, subject)], new_events
    event = new_events[0][2]

    if path in ("/items", "/items/batch"):
        assert item_id not in items_before
        assert (row["state"], row["leased_by"], event) == ("PENDING", None, "ENQUEUED")
    elif path == "/leases":
        assert [i["id"] for i in response.json()["items"]] == [item_id]
        assert (row["state"], row["leased_by"], event) == ("ASSIGNED", subject, "LEASED")
    elif path == "/admin/reviewers/{reviewer}/release":
        assert item_id == world.other
        assert (row["state"], row["leased_by"], event) == ("PENDING", None, "RELEASED")
    elif path.startswith("/admin/items/") or path.endswith("/revisions"):
        assert item_id == world.item_id(caller, target)
        before = items_before[item_id]
        if path.endswith("/revisions"):
            assert (row["state"], row["leased_by"], row["variance_amount"], event) == (
                "ASSIGNED", before["leased_by"], 1.0, "REVISED",
            )  # fmt: skip
            assert row["lease_epoch"] == before["lease_epoch"] + 1
        elif path.endswith("/reassign"):
            assert (row["state"], row["leased_by"], event) == ("ASSIGNED", SUBJECT["reviewer"], "REASSIGNED")
        else:
            assert (row["state"], row["leased_by"], event) == ("PENDING", None, "RELEASED")
    else:
        assert item_id == world.own[caller]
        before = items_before[item_id]
        if path.endswith("/complete"):
            answer = response.json()["results"][0] if path == "/items/complete" else response.json()
            assert answer["outcome"] == "resolved"
            assert (row["state"], row["resolved_by"], row["resolution"], event) == (
                "RESOLVED",
                subject,
                "APPROVED",
                "RESOLVED",
            )
        elif path.endswith("/renew"):
            assert (row["state"], row["leased_by"], event) == ("ASSIGNED", subject, "RENEWED")
            assert row["lease_expires_at"] >= before["lease_expires_at"]
        else:
            assert (row["state"], row["leased_by"], event) == ("PENDING", None, "RELEASED")


# ---------------------------------------------------------------------------------------------
# Fields a client must not set, in a body
# ---------------------------------------------------------------------------------------------

SMUGGLED = {
    "leased_by": "mallory",
    "resolved_by": "mallory",
    "state": "RESOLVED",
    "lease_expires_at": "2099-01-01T00:00:00Z",
    "lease_epoch": 99,
    "attempts": 99,
}

# (route, caller whose call would otherwise succeed, target, where the field goes)
SMUGGLE_ROUTES = [
    (("POST", "/items"), "ingest", None, ()),
    (("POST", "/items/batch"), "ingest", None, ("items", 0)),
    (("POST", "/leases"), "reviewer", None, ()),
    (("POST", "/items/{item_id}/complete"), "reviewer", "own", ()),
    (("POST", "/items/complete"), "reviewer", "own", ("items", 0)),
    (("POST", "/items/{item_id}/renew"), "reviewer", "own", ()),
    (("POST", "/items/{item_id}/release"), "reviewer", "own", ()),
    (("POST", "/items/{item_id}/approve"), "approver", "own", ()),
    (("POST", "/items/{item_id}/reject"), "approver", "own", ()),
    (("POST", "/items/{item_id}/comments"), "auditor", "own", ()),
    (("POST", "/admin/reclaim"), "admin", None, ()),
    (("POST", "/items/{item_id}/revisions"), "ingest", "own", ()),
    (("POST", "/admin/items/{item_id}/reassign"), "admin", "own", ()),
    (("POST", "/admin/items/{item_id}/release"), "admin", "own", ()),
    (("PUT", "/webhooks/{name}"), "admin", None, ()),
    (("POST", "/webhooks/{name}/redeliver"), "admin", None, ()),
]


@pytest.mark.parametrize("field", list(SMUGGLED))
@pytest.mark.parametrize(
    ("route", "caller", "target", "where"), SMUGGLE_ROUTES, ids=[f"{m} {p}" for (m, p), *_ in SMUGGLE_ROUTES]
)
def test_a_body_cannot_set_server_owned_fields(
    shared_world: World,
    route: tuple[str, str],
    caller: str,
    target: str | None,
    where: tuple[str | int, ...],
    field: str,
) -> None:
    method, path = route
    body = MATRIX[route].body
    assert body is not None
    item_id = shared_world.item_id(caller, target)
    sent = body(item_id) if MATRIX[route].body_item else body()
    container = sent
    for step in where:
        container = container[step]
    container[field] = SMUGGLED[field]
    url = (path.replace("{item_id}", item_id) if item_id else path).replace("{name}", WEBHOOK)

    before = snapshot(shared_world.sql)
    response = shared_world.client.request(method, url, json=sent, headers=shared_world.headers[caller])
    problem = assert_problem(response, 422, "VALIDATION_ERROR")
    assert {
        "loc": ["body", *where, field],
        "msg": "Extra inputs are not permitted",
        "type": "extra_forbidden",
    } in (problem["errors"])
    assert snapshot(shared_world.sql) == before


# ---------------------------------------------------------------------------------------------
# Identity headers
# ---------------------------------------------------------------------------------------------

IDENTITY_HEADERS = ["X-Forwarded-User", "X-Remote-User", "X-Forwarded-For"]


def _as_bob(header: str) -> dict[str, str]:
    return {header: OTHER if header != "X-Forwarded-For" else f"10.0.0.1, {OTHER}"}


@pytest.mark.parametrize("header", [*IDENTITY_HEADERS, "all"])
def test_identity_headers_change_nothing(world: World, header: str) -> None:
    spoof = (
        {k: v for h in IDENTITY_HEADERS for k, v in _as_bob(h).items()}
        if header == "all"
        else _as_bob(header)
    )
    alice = {**world.headers["reviewer"], **spoof}

    # Leasing: the lease is alice's, in the answer, the row and the audit trail.
    leased = world.client.post("/leases", json={"batch_size": 1}, headers=alice)
    assert leased.status_code == 200, leased.text
    (item,) = leased.json()["items"]
    assert item["leased_by"] == SUBJECT["reviewer"] and item["lease_token"] is not None
    row = world.sql.execute("SELECT leased_by FROM review_queue_item WHERE id = %s", (item["id"],)).fetchone()
    assert row == (SUBJECT["reviewer"],)

    # "My work" is alice's, not bob's.
    mine = world.client.get("/items", params={"state": "ASSIGNED", "leased_by": "me"}, headers=alice).json()
    assert {i["leased_by"] for i in mine["items"]} == {SUBJECT["reviewer"]}
    assert world.other not in {i["id"] for i in mine["items"]}

    # Claiming to be bob does not let alice act on bob's item.
    before = snapshot(world.sql)
    for action, body in (("complete", {"resolution": "APPROVED"}), ("renew", {}), ("release", {})):
        response = world.client.post(f"/items/{world.other}/{action}", json=body, headers=alice)
        assert_problem(response, 409, "LEASE_NOT_HELD")
    assert world.client.get(f"/items/{world.other}", headers=alice).json()["lease_token"] is None
    assert snapshot(world.sql) == before

    # Without a token, the headers are no identity at all.
    assert_problem(
        world.client.post("/leases", json={"batch_size": 1}, headers=spoof), 401, "UNAUTHENTICATED"
    )
    assert snapshot(world.sql) == before

    # Completing: resolved_by is alice.
    done = world.client.post(f"/items/{item['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)
    assert done.status_code == 200, done.text
    assert done.json()["item"]["resolved_by"] == SUBJECT["reviewer"]
    row = world.sql.execute(
        "SELECT resolved_by FROM review_queue_item WHERE id = %s", (item["id"],)
    ).fetchone()
    assert row == (SUBJECT["reviewer"],)

    # Enqueueing: the audit trail names the ingest token's subject.
    ivan = {**world.headers["ingest"], **spoof}
    created = world.client.post("/items", json=item_body(), headers=ivan)
    assert created.status_code == 201, created.text
    actors = world.sql.execute(
        "SELECT event, actor FROM review_queue_event WHERE item_id = %s", (created.json()["id"],)
    ).fetchall()
    assert actors == [("ENQUEUED", SUBJECT["ingest"])]

    # Every event written during this test is by alice or ivan, never bob.
    events = world.sql.execute(
        "SELECT DISTINCT actor FROM review_queue_event WHERE id > %s", (before[1][-1][0],)
    ).fetchall()
    assert {a for (a,) in events} <= {SUBJECT["reviewer"], SUBJECT["ingest"]}


def test_row_to_json_snapshot_sees_every_column(shared_world: World) -> None:
    # The "nothing changed" checks compare whole rows: make sure they include the lease columns.
    items, _ = snapshot(shared_world.sql)
    row = items[shared_world.other]
    assert {"state", "leased_by", "lease_expires_at", "lease_epoch", "resolved_by", "resolution"} <= set(row)
    assert json.dumps(row)  # plain JSON values, comparable with ==


# ---------------------------------------------------------------------------------------------
# Query parameters
# ---------------------------------------------------------------------------------------------

# Every route that takes query parameters refuses unknown ones (a typo is an answer, not a
# silently ignored filter); the allowed caller and target are the ones that would succeed.
QUERY_ROUTES = [
    ("/items", None),
    ("/items/{item_id}/events", "own"),
    ("/audit/export", None),
    ("/decisions", None),
    ("/events", None),
    ("/webhooks/{name}/deliveries", None),
    ("/fx-rates/{currency}/history", None),
    *((path, None) for (_, path), route in MATRIX.items() if route.params),
]
QUERY_CALLERS = {
    "/audit/export": ("auditor", "admin"),
    "/events": ("auditor", "admin", "integration"),
    "/webhooks/{name}/deliveries": ("admin",),
}


def _query_callers(path: str) -> tuple[str, ...]:
    route = MATRIX[("GET", path)]
    if route.roles == AUDITORS:
        return ("auditor", "admin")
    if route.params:  # the throughput
        return ("reviewer", "auditor", "admin")
    return ("reviewer", "ingest", "admin")


# (path, target, caller, parameters of a call that succeeds)
QUERY_CASES = [
    (
        path,
        target,
        caller,
        MATRIX[("GET", path)].params or ({"to": 1} if path == "/audit/export" else {"limit": 1}),
    )
    for path, target in QUERY_ROUTES
    for caller in QUERY_CALLERS.get(path) or _query_callers(path)
]


def test_every_query_route_is_listed() -> None:
    app = create_app(make_settings("postgresql+psycopg://matrix@127.0.0.1:1/unused"))
    with_query = {
        path
        for path, operations in app.openapi()["paths"].items()
        for operation in operations.values()
        if any(p["in"] == "query" for p in operation.get("parameters", []))
    }
    # The OIDC callback's parameters are the provider's, and a provider may add its own (RFC 6749
    # 4.1.2; session_state, say): unknown ones are ignored there (tests/system/api/test_oidc.py).
    assert with_query - {"/auth/oidc/callback"} == {p for p, _ in QUERY_ROUTES}


@pytest.mark.parametrize(("path", "target", "caller", "params"), QUERY_CASES)
def test_unknown_query_parameters_are_refused(
    shared_world: World, path: str, target: str | None, caller: str, params: dict[str, Any]
) -> None:
    item_id = shared_world.item_id(caller, target)
    url = (
        (path.replace("{item_id}", item_id) if item_id else path)
        .replace("{name}", WEBHOOK)
        .replace("{currency}", "EUR")
    )
    ok = shared_world.client.get(url, params=params, headers=shared_world.headers[caller])
    assert ok.status_code == 200, ok.text
    before = snapshot(shared_world.sql)
    response = shared_world.client.get(
        url, params={**params, "order_by": "id"}, headers=shared_world.headers[caller]
    )
    problem = assert_problem(response, 422, "VALIDATION_ERROR")
    assert any(
        e["loc"] == ["query", "order_by"] and e["type"] == "extra_forbidden" for e in problem["errors"]
    ), problem
    assert snapshot(shared_world.sql) == before


def _count_checkouts(app_client: TestClient) -> list[int]:
    from sqlalchemy import event

    count = [0]
    pool = app_client.app.state.engine.sync_engine.pool  # type: ignore[attr-defined]
    event.listen(pool, "checkout", lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def test_requests_without_a_usable_token_never_touch_the_pool(db_url: str) -> None:
    """A flood of missing or garbage tokens used to cost a transaction each; now none, on every
    authenticated route of the authorization matrix."""
    with TestClient(
        create_app(make_settings(db_url, token_cache_s=5)), raise_server_exceptions=False
    ) as client:
        checkouts = _count_checkouts(client)
        for (method, path), route in MATRIX.items():
            if route.roles is None:
                continue
            url = path.replace("{item_id}", UNKNOWN_ID)
            body = (route.body(UNKNOWN_ID) if route.body_item else route.body()) if route.body else None
            for headers in ({}, {"Authorization": "Bearer x"}, {"Authorization": "Basic YTpi"}):
                response = client.request(method, url, json=body, headers=headers)
                assert_problem(response, 401, "UNAUTHENTICATED")
        assert checkouts[0] == 0, f"{checkouts[0]} pool checkouts for unauthenticated requests"
        # A well-formed but unknown token costs one lookup, then the negative cache answers.
        unknown = {"Authorization": "Bearer rq_" + "A" * 43}
        for _ in range(5):
            assert_problem(client.post("/leases", json={}, headers=unknown), 401, "UNAUTHENTICATED")
        assert checkouts[0] == 1, checkouts[0]
        metrics = client.get("/metrics", headers=_admin_headers(db_url)).text
    failures = {
        line.split('"')[1]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("review_queue_auth_failures_total{")
    }
    assert failures["missing"] >= 2 * len([r for r in MATRIX.values() if r.roles is not None])
    assert failures["malformed"] >= len([r for r in MATRIX.values() if r.roles is not None])
    assert failures["unknown"] >= 5


def _admin_headers(db_url: str) -> dict[str, str]:
    from tests.support.postgres import create_token

    return {"Authorization": f"Bearer {create_token(db_url, 'metrics-reader', 'admin')}"}
