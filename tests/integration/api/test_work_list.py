"""The reviewer's workplace in the API (issue 24): the release cool-off, a lease that names its
item, the work list's order, filters and search (GET /items), and a reviewer's decisions."""

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.app import create_app
from tests.support.api import Auth, assert_problem, enqueue
from tests.support.postgres import make_settings


def lease(client: TestClient, headers: dict[str, str], **body: Any) -> list[str]:
    response = client.post("/leases", json={"batch_size": 1, **body}, headers=headers)
    assert response.status_code == 200, response.text
    return [i["id"] for i in response.json()["items"]]


def release(client: TestClient, headers: dict[str, str], item_id: str) -> dict[str, Any]:
    response = client.post(f"/items/{item_id}/release", json={"reason": "skip"}, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# --- the release cool-off -------------------------------------------------------------------


def test_a_released_item_goes_to_someone_else_in_its_old_place(
    client: TestClient, root: dict, alice: dict, bob: dict, sql: psycopg.Connection
) -> None:
    first, second = enqueue(client, root), enqueue(client, root)
    assert lease(client, alice) == [first["id"]]
    assert release(client, alice, first["id"])["state"] == "PENDING"
    # Release then Next used to hand the same item straight back (attempts 2).
    assert lease(client, alice) == [second["id"]], "alice was handed back the item she released"
    assert lease(client, bob) == [first["id"]], "bob should get it, first in line"
    row = sql.execute(
        "SELECT released_by, released_until > now() + interval '14 minutes' FROM review_queue_item"
        " WHERE id = %s",
        (first["id"],),
    ).fetchone()
    assert row == ("alice", True), row  # REVIEW_QUEUE_RELEASE_COOLDOWN_S: 900 by default


def test_the_cool_off_ends_and_the_item_comes_back(
    client: TestClient, root: dict, alice: dict, sql: psycopg.Connection
) -> None:
    item = enqueue(client, root)
    assert lease(client, alice) == [item["id"]]
    release(client, alice, item["id"])
    assert lease(client, alice) == []  # nothing else is pending: she waits rather than take it back
    sql.execute("UPDATE review_queue_item SET released_until = now() - interval '1 second'")
    assert lease(client, alice) == [item["id"]]


def test_naming_the_item_takes_it_back_within_the_cool_off(
    client: TestClient, root: dict, alice: dict
) -> None:
    item = enqueue(client, root)
    lease(client, alice)
    release(client, alice, item["id"])
    assert lease(client, alice) == []
    assert lease(client, alice, item_id=item["id"]) == [item["id"]]


def test_without_a_cool_off_release_then_lease_brings_it_back(
    db_url: str, make_token: Callable[[str, str], str]
) -> None:
    with TestClient(create_app(make_settings(db_url, release_cooldown_s=0))) as client:
        root = {"Authorization": f"Bearer {make_token('root', 'admin')}"}
        alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
        first, _ = enqueue(client, root), enqueue(client, root)
        lease(client, alice)
        release(client, alice, first["id"])
        assert lease(client, alice) == [first["id"]]
        assert client.get("/session", headers=alice).json()["release_cooldown_s"] == 0


def test_a_released_approval_lease_goes_to_another_approver(
    client: TestClient, root: dict, alice: dict, auth: Auth
) -> None:
    april, anna = auth("april", "approver"), auth("anna", "approver")
    item = enqueue(client, root, variance_amount="25000.00")
    (held,) = client.post("/leases", json={}, headers=alice).json()["items"]
    done = client.post(
        f"/items/{held['id']}/complete",
        json={"resolution": "WRITE_OFF", "note": "n", "lease_token": held["lease_token"]},
        headers=alice,
    )
    assert done.json()["outcome"] == "submitted_for_approval", done.text
    assert lease(client, april, queue="approval") == [item["id"]]
    release(client, april, item["id"])
    assert lease(client, april, queue="approval") == []
    assert lease(client, anna, queue="approval") == [item["id"]]


# --- a lease that names its item ------------------------------------------------------------


def test_a_lease_by_item_id_takes_exactly_that_pending_item(
    client: TestClient, root: dict, alice: dict, bob: dict, sql: psycopg.Connection
) -> None:
    first, second = enqueue(client, root), enqueue(client, root)
    assert lease(client, alice, item_id=second["id"]) == [second["id"]]  # not the first in line
    assert lease(client, bob, item_id=second["id"]) == []  # held by alice: nothing, not an error
    assert lease(client, bob, item_id="00000000-0000-4000-8000-000000000000") == []
    events = sql.execute(
        "SELECT event, actor FROM review_queue_event WHERE item_id = %s ORDER BY id", (second["id"],)
    ).fetchall()
    assert events == [("ENQUEUED", "root"), ("LEASED", "alice")]
    assert sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (first["id"],)).fetchone() == (
        "PENDING",
    )


def test_a_lease_by_item_id_keeps_the_cap_and_segregation_of_duties(
    db_url: str, make_token: Callable[[str, str], str]
) -> None:
    with TestClient(create_app(make_settings(db_url, max_leases_per_reviewer=1))) as client:
        root = {"Authorization": f"Bearer {make_token('root', 'admin')}"}
        april = {"Authorization": f"Bearer {make_token('april', 'approver')}"}
        items = [enqueue(client, root, variance_amount="25000.00") for _ in range(2)]
        assert lease(client, april, item_id=items[0]["id"]) == [items[0]["id"]]
        assert lease(client, april, item_id=items[1]["id"]) == []  # at the cap of 1
        held = client.get("/items?leased_by=me", headers=april).json()["items"][0]
        body = {"resolution": "WRITE_OFF", "note": "n", "lease_token": held["lease_token"]}
        assert client.post(f"/items/{held['id']}/complete", json=body, headers=april).status_code == 200
        # Her own proposal: never hers to approve, named or not.
        assert lease(client, april, queue="approval", item_id=items[0]["id"]) == []
        assert lease(client, april, queue="review", item_id=items[0]["id"]) == []  # not PENDING


def test_a_malformed_item_id_is_a_422(client: TestClient, alice: dict) -> None:
    assert_problem(client.post("/leases", json={"item_id": "nope"}, headers=alice), 422, "VALIDATION_ERROR")


# --- the work list: order, filters, search ----------------------------------------------------


def _ids(client: TestClient, headers: dict[str, str], query: str) -> list[str]:
    response = client.get(f"/items?{query}", headers=headers)
    assert response.status_code == 200, response.text
    return [i["id"] for i in response.json()["items"]]


def test_sorted_by_due_date_with_its_own_cursor(client: TestClient, root: dict, alice: dict) -> None:
    dues = ["2026-12-09T00:00:00Z", "2026-12-05T00:00:00Z", "2999-01-01T00:00:00Z", "2026-12-05T00:00:00Z"]
    items = [enqueue(client, root, due_at=d) for d in dues]
    expected = [i["id"] for i in sorted(items, key=lambda i: (i["due_at"], i["id"]))]
    seen, cursor = [], None
    while True:
        page = client.get(
            "/items?sort=due_at&limit=1" + (f"&cursor={cursor}" if cursor else ""), headers=alice
        ).json()
        seen += [i["id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    assert _ids(client, alice, "sort=due_at&state=PENDING&limit=2") == expected[:2]


def test_amount_range_on_the_absolute_amount(client: TestClient, root: dict, alice: dict) -> None:
    amounts = ["-2500.00", "999.99", "1000.00", "25000.00", "-0.10"]
    items = {a: enqueue(client, root, variance_amount=a)["id"] for a in amounts}
    found = _ids(client, alice, "min_amount=1000&max_amount=2500.00")
    assert sorted(found) == sorted([items["-2500.00"], items["1000.00"]])
    assert _ids(client, alice, "max_amount=0.10") == [items["-0.10"]]
    assert _ids(client, alice, "min_amount=5000&max_amount=10") == []
    assert_problem(client.get("/items?min_amount=-1", headers=alice), 422, "VALIDATION_ERROR")
    assert all(Decimal(i["variance_amount"]) for i in client.get("/items", headers=alice).json()["items"])


def test_amount_bounds_take_three_decimals_and_the_columns_whole_range(
    client: TestClient, root: dict, alice: dict
) -> None:
    """A KWD amount has three decimals, so a bound on it does too; the largest bound the column can
    hold is allowed; beyond either limit, a 422 that names it and the parameter."""
    ids = {
        a: enqueue(client, root, currency="KWD", variance_amount=a)["id"]
        for a in ("1.233", "-1.234", "1.235")
    }
    assert set(_ids(client, alice, "currency=KWD&min_amount=1.234&max_amount=1.234")) == {ids["-1.234"]}
    assert set(_ids(client, alice, "currency=KWD&min_amount=1.234")) == {ids["-1.234"], ids["1.235"]}
    largest = "9999999999999999.999"
    assert set(_ids(client, alice, f"currency=KWD&max_amount={largest}")) == set(ids.values())
    assert _ids(client, alice, f"min_amount={largest}") == []
    for name, value, says in (
        ("min_amount", "1.2345", "3 fraction digits"),
        ("max_amount", "10000000000000000", "below 1e16"),
        ("min_amount", "1e3", "no exponent"),
        ("max_amount", "-0.001", "must not be negative"),
    ):
        for currency in ("", "&currency=KWD"):
            response = client.get(f"/items?{name}={value}{currency}", headers=alice)
            (error,) = assert_problem(response, 422, "VALIDATION_ERROR")["errors"]
            assert error["loc"] == ["query", name] and says in error["msg"], error


_DIGITS = st.text("0123456789", min_size=1, max_size=18)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    whole=_DIGITS,
    fraction=st.none() | st.text("0123456789", min_size=1, max_size=5),
    name=st.sampled_from(["min_amount", "max_amount"]),
    currency=st.sampled_from([None, "KWD", "JPY", "USD"]),
)
def test_any_amount_bound_is_a_page_or_a_422_naming_its_limit(
    client: TestClient, alice: dict, whole: str, fraction: str | None, name: str, currency: str | None
) -> None:
    """Fuzzed: a bound of up to 16 integer and 3 fraction digits is read exactly (a page, whatever
    the currency), anything longer is a 422 naming the limit, never a 500."""
    value = whole if fraction is None else f"{whole}.{fraction}"
    query = f"{name}={value}" + (f"&currency={currency}" if currency else "")
    response = client.get(f"/items?{query}", headers=alice)
    if len(whole) <= 16 and len(fraction or "") <= 3:
        assert response.status_code == 200, response.text
    else:
        body = assert_problem(response, 422, "VALIDATION_ERROR")
        (error,) = body["errors"]
        assert error["loc"] == ["query", name], body
        assert "16 integer digits (below 1e16" in error["msg"] and "3 fraction digits" in error["msg"], body


def test_currency_filter_and_amounts_in_it_or_in_base_currency_equivalents(
    client: TestClient, root: dict, alice: dict
) -> None:
    """With `currency`, the bounds are amounts of it; without, every amount is compared as its
    base-currency (USD) equivalent at the latest rate, and an item whose currency has no rate yet
    matches no bound (it has no equivalent; `currency=` finds it by its own amount)."""
    sent = [
        ("USD", "-1000.00"),
        ("USD", "999.99"),
        ("EUR", "921.66"),  # 1,000.0011 USD at 1.0850 (999.98... at 1.0849)
        ("EUR", "-921.65"),  # 999.99025 USD
        ("JPY", "150000"),  # 1,005.00 USD at 0.0067
        ("KWD", "-1.234"),  # no rate: no USD equivalent
        ("KWD", "5000.000"),
    ]
    ids = {(c, a): enqueue(client, root, currency=c, variance_amount=a)["id"] for c, a in sent}
    for currency, rate in (("EUR", "1.0849"), ("EUR", "1.0850"), ("JPY", "0.0067")):  # the latest counts
        assert client.put(f"/fx-rates/{currency}", json={"rate": rate}, headers=root).status_code == 200

    def found(query: str) -> set[tuple[str, str]]:
        got = set(_ids(client, alice, query))
        return {key for key, item_id in ids.items() if item_id in got}

    assert found("currency=EUR") == {("EUR", "921.66"), ("EUR", "-921.65")}
    assert found("currency=KWD&max_amount=2") == {("KWD", "-1.234")}  # an amount of KWD, unconverted
    assert found("currency=EUR&min_amount=921.66") == {("EUR", "921.66")}
    # In USD: the boundary of 1,000.00 falls between the EUR amounts once converted.
    assert found("min_amount=1000") == {("USD", "-1000.00"), ("EUR", "921.66"), ("JPY", "150000")}
    assert found("max_amount=1000") == {("USD", "-1000.00"), ("USD", "999.99"), ("EUR", "-921.65")}
    assert found("max_amount=999.99") == {("USD", "999.99")}  # 999.99025 exactly: never rounded
    assert found("min_amount=1005&max_amount=1005") == {("JPY", "150000")}  # exactly 1,005.00
    # KWD has no rate: in no amount range without `currency`, in the list without a bound.
    assert ("KWD", "5000.000") not in found("min_amount=0")
    assert {("KWD", "-1.234"), ("KWD", "5000.000")} <= found("limit=200")
    assert client.put("/fx-rates/KWD", json={"rate": "3.25"}, headers=root).status_code == 200
    assert found("min_amount=16250&max_amount=16250") == {("KWD", "5000.000")}  # 5,000 x 3.25
    assert_problem(client.get("/items?currency=XYZ", headers=alice), 422, "VALIDATION_ERROR")
    assert_problem(client.get("/items?currency=eur", headers=alice), 422, "VALIDATION_ERROR")


def _all_pages(client: TestClient, headers: dict[str, str], query: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = client.get(f"/items?{query}" + (f"&cursor={cursor}" if cursor else ""), headers=headers)
        assert page.status_code == 200, page.text
        seen += [i["id"] for i in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return seen


def test_match_and_amount_filters_merge_every_state_in_list_order(
    client: TestClient, alice: dict, sql: psycopg.Connection
) -> None:
    """With no state, these filters read the resolved items and the open ones apart (each by its own
    index) and merge them: every page in either order is the items that match, in list order, across
    resolved, PENDING and other open items alike, with ties on the order column broken by id."""
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, state, leased_by, leased_at, lease_expires_at, resolution, resolved_by,
               resolved_at, created_at, due_at)
           SELECT 'm-' || g, 'E', CASE WHEN g % 3 = 0 THEN -50000 ELSE 12.50 END,
                  CASE WHEN g % 2 = 0 THEN 'MATCHED' ELSE 'PARTIAL' END, 'h', s,
                  CASE WHEN s IN ('ASSIGNED', 'RESOLVED') THEN 'r' END,
                  CASE WHEN s IN ('ASSIGNED', 'RESOLVED') THEN now() END,
                  CASE WHEN s IN ('ASSIGNED', 'RESOLVED') THEN now() + interval '1 hour' END,
                  CASE WHEN s = 'RESOLVED' THEN 'OK' END, CASE WHEN s = 'RESOLVED' THEN 'r' END,
                  CASE WHEN s = 'RESOLVED' THEN now() END,
                  -- a few shared instants, so that the keyset's tie-break on id is exercised
                  now() - (g % 5) * interval '1 hour', now() + (g % 4) * interval '1 day'
           FROM generate_series(1, 36) AS g,
                LATERAL (SELECT (ARRAY['RESOLVED', 'PENDING', 'ASSIGNED', 'QUARANTINED'])[1 + (g / 2) % 4])
                    AS st(s)"""
    )
    for query, where in (
        ("match_decision=MATCHED", "match_decision = 'MATCHED'"),
        ("min_amount=1000", "abs(variance_amount) >= 1000"),
        (
            "max_amount=100&match_decision=MATCHED",
            "abs(variance_amount) <= 100 AND match_decision = 'MATCHED'",
        ),
    ):
        for order in ("created_at", "due_at"):
            expected = [
                str(r[0])
                for r in sql.execute(f"SELECT id FROM review_queue_item WHERE {where} ORDER BY {order}, id")
            ]
            assert len({*sql.execute(f"SELECT state FROM review_queue_item WHERE {where}")}) == 4
            assert _all_pages(client, alice, f"{query}&sort={order}&limit=2") == expected, (query, order)


def test_search_finds_an_id_a_key_or_an_entity(client: TestClient, root: dict, alice: dict) -> None:
    acme = enqueue(client, root, ledger_entity="ACME", idempotency_key="INV-1")
    globex = enqueue(client, root, ledger_entity="GLOBEX", idempotency_key="INV-2")
    other = enqueue(client, root, ledger_entity="INITECH", idempotency_key="GLOBEX-3")
    assert _ids(client, alice, f"q={acme['id']}") == [acme["id"]]
    assert _ids(client, alice, "q=INV-2") == [globex["id"]]
    # A prefix of the entity GLOBEX and of the key GLOBEX-3 (issue 42: prefixes; test_search.py).
    assert sorted(_ids(client, alice, "q=GLOBEX&sort=due_at")) == sorted([globex["id"], other["id"]])
    assert _ids(client, alice, "q=GLOBEX-3") == [other["id"]]
    assert _ids(client, alice, "q=nothing") == []
    assert _ids(client, alice, "q=ACME&state=RESOLVED") == []


# --- my decisions ---------------------------------------------------------------------------


def test_my_decisions_newest_first_with_the_item_as_it_is_now(
    client: TestClient, root: dict, alice: dict, auth: Auth
) -> None:
    april = auth("april", "approver")
    small, big = enqueue(client, root), enqueue(client, root, variance_amount="25000.00")
    held = client.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]
    token = {i["id"]: i["lease_token"] for i in held}
    for item, code, note in ((small, "MATCH_CONFIRMED", None), (big, "WRITE_OFF", "over the threshold")):
        body = {"resolution": code, "note": note, "lease_token": token[item["id"]]}
        assert client.post(f"/items/{item['id']}/complete", json=body, headers=alice).status_code == 200
    (proposal,) = client.post("/leases", json={"queue": "approval"}, headers=april).json()["items"]
    rejected = client.post(
        f"/items/{big['id']}/reject",
        json={"reason": "wrong entity", "lease_token": proposal["lease_token"]},
        headers=april,
    )
    assert rejected.status_code == 200, rejected.text

    mine = client.get("/decisions", headers=alice).json()
    got = [(d["event"]["event"], d["event"]["item_id"], d["item"]["state"]) for d in mine["decisions"]]
    assert got == [("SUBMITTED_FOR_APPROVAL", big["id"], "PENDING"), ("RESOLVED", small["id"], "RESOLVED")]
    assert mine["decisions"][0]["event"]["details"]["resolution"] == "WRITE_OFF"
    theirs = client.get("/decisions?actor=april", headers=alice).json()["decisions"]
    assert [(d["event"]["event"], d["event"]["details"]["reason"]) for d in theirs] == [
        ("REJECTED", "wrong entity")
    ]
    first = client.get("/decisions?limit=1", headers=alice).json()
    rest = client.get(f"/decisions?limit=1&cursor={first['next_cursor']}", headers=alice).json()
    assert [d["event"]["event"] for d in first["decisions"] + rest["decisions"]] == [
        "SUBMITTED_FOR_APPROVAL",
        "RESOLVED",
    ]
    assert rest["next_cursor"] is None
    assert client.get("/decisions", headers=root).json() == {"decisions": [], "next_cursor": None}
