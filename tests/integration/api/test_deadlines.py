"""Deadlines (issue 12, part 3) and routing by entity (issue 13, item 14): due_at given or set by the
SLA tiers, lease order earliest due first, leases of one ledger entity (long poll included), the
due_before filter, and the overdue and aging figures of /stats, /metrics and `review-queue stats`."""

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.setting_values import parse_sla_tiers
from api.settings import Settings, load_settings
from client import ReviewQueueClient
from tests.support import wait_for
from tests.support.api import Auth, assert_problem, enqueue, item_body
from tests.support.postgres import make_settings


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def lease_ids(client: TestClient, headers: dict[str, str], **body: Any) -> list[str]:
    response = client.post("/leases", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return [i["id"] for i in response.json()["items"]]


# --- the SLA policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "hours"),
    [
        ("250000.00", 24),
        ("100000.00", 24),  # "at least": the threshold itself is in the tier
        ("99999.99", 72),
        ("-15000.00", 72),  # by the absolute amount: a negative variance is as big as a positive one
        ("1000.00", 120),
        ("999.99", 168),
        ("0.00", 168),
    ],
)
def test_without_due_at_the_default_tiers_set_it_from_the_amount(
    client: TestClient, auth: Auth, amount: str, hours: int
) -> None:
    item = enqueue(client, auth("ingest", "ingest"), variance_amount=amount)
    assert ts(item["due_at"]) - ts(item["created_at"]) == timedelta(hours=hours), item


# --- the tiers in the base currency (issue 40): like four eyes, at the latest rate, failing safe ---


def _set_rate(client: TestClient, auth: Auth, currency: str, rate: str) -> None:
    response = client.put(f"/fx-rates/{currency}", json={"rate": rate}, headers=auth("ada", "admin"))
    assert response.status_code == 200, response.text


def _hours(item: dict[str, Any]) -> float:
    return (ts(item["due_at"]) - ts(item["created_at"])) / timedelta(hours=1)


@pytest.mark.parametrize(
    ("amount", "hours"),
    [
        # 10,000.00 / 1.0850 = 9,216.5898...: no cent lands on the boundary itself.
        ("9216.59", 72),  # 10,000.00015 USD: exact, not rounded to 10,000.00
        ("-9216.59", 72),
        ("9216.58", 120),  # 9,999.98930 USD
        ("-9216.58", 120),
        ("92165.90", 24),  # 100,000.0015 USD
        ("92165.89", 72),  # 99,999.99065 USD
        ("921.66", 120),  # 1,000.0011 USD
        ("921.65", 168),  # 999.99025 USD
    ],
)
def test_the_tiers_compare_the_amount_converted_at_the_latest_rate(
    client: TestClient, auth: Auth, amount: str, hours: int
) -> None:
    _set_rate(client, auth, "EUR", "1.2000")
    _set_rate(client, auth, "EUR", "1.0850")  # the latest one applies, not the first
    item = enqueue(client, auth("ingest", "ingest"), variance_amount=amount, currency="EUR")
    assert _hours(item) == hours, item


@pytest.mark.parametrize(("amount", "hours"), [("7999.99", 120), ("8000.00", 72), ("8000.01", 72)])
def test_an_amount_converting_exactly_to_a_tier_is_in_it(
    client: TestClient, auth: Auth, amount: str, hours: int
) -> None:
    _set_rate(client, auth, "EUR", "1.25")  # 8,000.00 EUR = 10,000.00 USD exactly: "at least"
    item = enqueue(client, auth("ingest", "ingest"), variance_amount=amount, currency="EUR")
    assert _hours(item) == hours, item


@pytest.mark.parametrize(("amount", "currency"), [("1", "JPY"), ("0.001", "KWD"), ("0.00", "EUR")])
def test_an_item_in_a_currency_without_a_rate_gets_the_strictest_tier(
    client: TestClient, auth: Auth, amount: str, currency: str
) -> None:
    # Not the time of so many dollars: 1 JPY and 0.001 KWD are not 1.00 and 0.001 USD. A rate of
    # another currency does not count.
    _set_rate(client, auth, "GBP", "1.27")
    item = enqueue(client, auth("ingest", "ingest"), variance_amount=amount, currency=currency)
    assert _hours(item) == 24, item


def test_a_rate_set_later_leaves_a_deadline_and_a_batch_takes_each_items_own_rate(
    client: TestClient, auth: Auth
) -> None:
    ingest = auth("ingest", "ingest")
    before = enqueue(client, ingest, variance_amount="500", currency="JPY")
    assert _hours(before) == 24
    _set_rate(client, auth, "JPY", "0.0067")  # 500 JPY = 3.35 USD
    _set_rate(client, auth, "KWD", "3.25")
    assert client.get(f"/items/{before['id']}", headers=ingest).json()["due_at"] == before["due_at"]
    response = client.post(
        "/items/batch",
        json={
            "items": [
                item_body(variance_amount="500", currency="JPY"),  # 3.35 USD
                item_body(variance_amount="3076.924", currency="KWD"),  # 10,000.003 USD
                item_body(variance_amount="3076.923", currency="KWD"),  # 9,999.99975 USD
                item_body(variance_amount="10000.00"),  # the base currency: the amount itself
                item_body(variance_amount="10000.00", currency="CHF"),  # no rate
            ]
        },
        headers=ingest,
    )
    assert response.status_code == 200, response.text
    assert [_hours(r["item"]) for r in response.json()["results"]] == [168, 72, 120, 72, 24]


def test_tiers_come_from_the_setting_and_apply_to_batches_too(db_url: str, auth: Auth) -> None:
    settings = make_settings(db_url, sla_tiers="500:2h, 50.50:1d, 0:3d")
    with TestClient(create_app(settings)) as client:
        ingest = auth("ingest", "ingest")
        given = "2030-01-02T03:04:05.123456+02:00"
        response = client.post(
            "/items/batch",
            json={
                "items": [
                    item_body(variance_amount="-500.00"),
                    item_body(variance_amount="50.50"),
                    item_body(variance_amount="50.49"),
                    item_body(variance_amount="9999.00", due_at=given),
                ]
            },
            headers=ingest,
        )
        assert response.status_code == 200, response.text
        items = [r["item"] for r in response.json()["results"]]
    waits = [ts(i["due_at"]) - ts(i["created_at"]) for i in items[:3]]
    assert waits == [timedelta(hours=2), timedelta(days=1), timedelta(days=3)], items
    assert ts(items[3]["due_at"]) == ts(given), items[3]
    assert items[3]["due_at"] == "2030-01-02T01:04:05.123456+00:00"  # answered in UTC


def test_the_policy_parser_and_lookup() -> None:
    tiers = parse_sla_tiers("0:7d,100000:24h,10000.5:72h")
    assert tiers == ((Decimal("100000"), 24), (Decimal("10000.5"), 72), (Decimal("0"), 168))
    assert Settings().sla_tiers == parse_sla_tiers("100000:24h,10000:72h,1000:120h,0:168h")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("100000:24h,1000:120h", "needs a tier at amount 0"),
        ("0:168h,0:24h", "amount 0 appears twice"),
        ("0:168", "not AMOUNT:DURATION"),
        ("0:0h", "not AMOUNT:DURATION"),
        ("-5:1h,0:2h", "not AMOUNT:DURATION"),
        ("1e5:1h,0:2h", "not AMOUNT:DURATION"),
        ("0.001:1h,0:2h", "not AMOUNT:DURATION"),
        ("", "not AMOUNT:DURATION"),
        ("0:99999d", "more than ten years"),
    ],
)
def test_a_bad_policy_stops_start_up_with_a_message_naming_it(
    value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVIEW_QUEUE_SLA_TIERS", value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert "REVIEW_QUEUE_SLA_TIERS" in str(stopped.value) and says in str(stopped.value), stopped.value


# --- due_at at enqueue -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "due_at",
    [
        "2026-12-04T17:00:00",  # no offset
        "2026-12-04 17:00:00Z",
        "2026-12-04T17:00Z",
        "2026-12-04",
        "1700000000",
        1700000000,
        "1969-12-31T23:59:59Z",  # outside 1970-2999
        "3000-01-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-12-04T24:00:00Z",
        "2026-12-04T17:00:60Z",
        "2026-12-04T17:00:00.1234567Z",
        "2026-12-04T17:00:00+24:00",
        "2026-12-04T17:00:00Z\n",
        "",
        True,
    ],
)
def test_a_due_at_that_is_not_an_rfc3339_instant_is_refused(
    client: TestClient, auth: Auth, sql: psycopg.Connection, due_at: object
) -> None:
    response = client.post("/items", json=item_body(due_at=due_at), headers=auth("ingest", "ingest"))
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == (0,)


def test_a_given_due_at_is_kept_as_the_instant_it_names(client: TestClient, auth: Auth) -> None:
    item = enqueue(client, auth("ingest", "ingest"), due_at="2026-12-04T17:00:00-05:00")
    assert item["due_at"] == "2026-12-04T22:00:00+00:00"
    # In the past is allowed: work that arrives already late is the most urgent.
    late = enqueue(client, auth("ingest", "ingest"), due_at="1999-01-01T00:00:00Z")
    assert late["due_at"] == "1999-01-01T00:00:00+00:00"


def test_due_at_is_in_the_idempotency_comparison_only_when_given(
    client: TestClient, auth: Auth, db_url: str
) -> None:
    ingest = auth("ingest", "ingest")
    derived = item_body(variance_amount="20000.00")
    first = client.post("/items", json=derived, headers=ingest)
    assert first.status_code == 201
    # A retry without due_at is the same item, even under another policy (a restart with new tiers).
    with TestClient(create_app(make_settings(db_url, sla_tiers="0:1h"))) as other_policy:
        again = other_policy.post("/items", json=derived, headers=ingest)
    assert again.status_code == 200 and again.json() == first.json(), again.text
    # Naming a due_at makes it part of the payload: the derived one matches, any other conflicts.
    named = client.post("/items", json={**derived, "due_at": first.json()["due_at"]}, headers=ingest)
    assert named.status_code == 200, named.text
    other = client.post("/items", json={**derived, "due_at": "2031-01-01T00:00:00Z"}, headers=ingest)
    assert assert_problem(other, 409, "IDEMPOTENCY_CONFLICT")["item_id"] == first.json()["id"]

    given = item_body(due_at="2030-06-01T12:00:00Z")
    assert client.post("/items", json=given, headers=ingest).status_code == 201
    same_instant = {**given, "due_at": "2030-06-01T14:00:00+02:00"}
    assert client.post("/items", json=same_instant, headers=ingest).status_code == 200
    omitted = {k: v for k, v in given.items() if k != "due_at"}
    assert client.post("/items", json=omitted, headers=ingest).status_code == 200
    batch = client.post(
        "/items/batch", json={"items": [{**given, "due_at": "2030-06-01T12:00:01Z"}]}, headers=ingest
    )
    assert batch.json()["results"][0]["outcome"] == "conflict", batch.text


# --- lease order -----------------------------------------------------------------------------


def test_leases_go_earliest_due_first_then_oldest(client: TestClient, auth: Auth) -> None:
    ingest, alice = auth("ingest", "ingest"), auth("alice", "reviewer")
    later = enqueue(client, ingest, due_at="2030-01-02T00:00:00Z")
    tie_1 = enqueue(client, ingest, due_at="2030-01-01T00:00:00Z")
    tie_2 = enqueue(client, ingest, due_at="2030-01-01T00:00:00Z")
    urgent = enqueue(client, ingest, due_at="2029-12-31T00:00:00Z")
    derived_big = enqueue(client, ingest, variance_amount="500000.00")  # due in 24 h: before all the above
    assert lease_ids(client, alice, batch_size=3) == [derived_big["id"], urgent["id"], tie_1["id"]]
    assert lease_ids(client, alice, batch_size=5) == [tie_2["id"], later["id"]]


def test_a_released_item_keeps_its_place(client: TestClient, auth: Auth) -> None:
    ingest, alice, bob = auth("ingest", "ingest"), auth("alice", "reviewer"), auth("bob", "reviewer")
    first = enqueue(client, ingest, due_at="2030-01-01T00:00:00Z")
    second = enqueue(client, ingest, due_at="2030-01-02T00:00:00Z")
    third = enqueue(client, ingest, due_at="2030-01-03T00:00:00Z")
    assert lease_ids(client, alice, batch_size=2) == [first["id"], second["id"]]
    # Something more urgent arrives while second is out; second, released, goes back to its place.
    urgent = enqueue(client, ingest, due_at="2029-01-01T00:00:00Z")
    released = client.post(f"/items/{second['id']}/release", json={"reason": "FX desk"}, headers=alice)
    assert released.json()["due_at"] == second["due_at"], released.text
    assert lease_ids(client, bob, batch_size=3) == [urgent["id"], second["id"], third["id"]]


# --- leases of one ledger entity -------------------------------------------------------------


def test_a_lease_by_ledger_entity_takes_only_that_entity_in_due_order(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    ingest, alice = auth("ingest", "ingest"), auth("alice", "reviewer")
    acme_late = enqueue(client, ingest, ledger_entity="ACME", due_at="2030-02-01T00:00:00Z")
    globex = enqueue(client, ingest, ledger_entity="GLOBEX", due_at="2029-01-01T00:00:00Z")
    acme_soon = enqueue(client, ingest, ledger_entity="ACME", due_at="2030-01-01T00:00:00Z")
    enqueue(client, ingest, ledger_entity="acme", due_at="2031-01-01T00:00:00Z")  # compared exactly
    assert lease_ids(client, alice, batch_size=10, ledger_entity="ACME") == [acme_soon["id"], acme_late["id"]]
    assert lease_ids(client, alice, ledger_entity="ACME") == []
    assert lease_ids(client, alice, ledger_entity="NOBODY") == []
    states = dict(sql.execute("SELECT id::text, state FROM review_queue_item").fetchall())
    assert states[globex["id"]] == "PENDING"
    assert lease_ids(client, alice, batch_size=1) == [globex["id"]]  # without the filter: every entity


def test_the_python_client_passes_ledger_entity_and_due_at(
    client: TestClient, auth: Auth, make_token: Callable[[str, str], str]
) -> None:
    ingest = auth("ingest", "ingest")
    wanted = enqueue(client, ingest, ledger_entity="INITECH")
    enqueue(client, ingest, ledger_entity="OTHER", due_at="2000-01-01T00:00:00Z")
    # The TestClient is an httpx.Client; not closed here (the fixture owns it).
    reviewer = ReviewQueueClient("http://testserver", make_token("carol", "reviewer"), http=client)
    assert [str(i.id) for i in reviewer.lease(5, ledger_entity="INITECH")] == [wanted["id"]]
    feeder = ReviewQueueClient("http://testserver", make_token("feeder", "ingest"), http=client)
    due = datetime(2031, 1, 1, 9, 30, tzinfo=UTC)
    assert feeder.enqueue(**{**item_body(), "due_at": due}).due_at == due


@pytest.mark.parametrize("entity", ["", "x" * 201, 5, None, "\u0000"])
def test_a_malformed_ledger_entity_filter_is_refused(
    client: TestClient, auth: Auth, sql: psycopg.Connection, entity: object
) -> None:
    enqueue(client, auth("ingest", "ingest"))
    response = client.post("/leases", json={"ledger_entity": entity}, headers=auth("alice", "reviewer"))
    if entity is None:  # null is "no filter", as absent
        assert response.status_code == 200 and len(response.json()["items"]) == 1, response.text
        return
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'PENDING'").fetchone() == (1,)


def test_two_reviewers_of_one_entity_never_get_the_same_item(
    db_url: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    """Real concurrent requests (threads, each with its own connection from the pool) leasing one
    entity's items while another entity's items wait: each item once, to one reviewer, all of it."""
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, due_at) SELECT 'k' || i, CASE WHEN i % 2 = 0 THEN 'ACME' ELSE 'GLOBEX' END, 1,"
        " 'PARTIAL', 'h', now() + (i % 7) * interval '1 hour' FROM generate_series(1, 400) i"
    )
    tokens = {f"r{n}": make_token(f"r{n}", "reviewer") for n in range(6)}
    got: dict[str, list[str]] = {name: [] for name in tokens}
    with TestClient(create_app(make_settings(db_url, max_leases_per_reviewer=10_000))) as client:
        barrier = threading.Barrier(len(tokens))

        def worker(name: str) -> None:
            headers = {"Authorization": f"Bearer {tokens[name]}"}
            barrier.wait()
            while ids := lease_ids(client, headers, batch_size=7, ledger_entity="ACME"):
                got[name].extend(ids)

        threads = [threading.Thread(target=worker, args=(name,)) for name in tokens]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    leased = [i for ids in got.values() for i in ids]
    assert len(leased) == len(set(leased)), "DOUBLE_LEASE"
    rows = sql.execute(
        "SELECT ledger_entity, state, count(*) FROM review_queue_item GROUP BY 1, 2"
    ).fetchall()
    assert sorted(rows) == [("ACME", "ASSIGNED", 200), ("GLOBEX", "PENDING", 200)], rows
    assert sum(1 for ids in got.values() if ids) > 1, f"one reviewer took everything: {got}"


def test_a_long_poll_for_one_entity_is_not_handed_another_entitys_work(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    ingest, alice = auth("ingest", "ingest"), auth("alice", "reviewer")
    signal = client.app.state.work_signal  # type: ignore[attr-defined]
    answer: dict[str, Any] = {}
    waiter = threading.Thread(
        target=lambda: answer.update(
            r=client.post("/leases", json={"wait_s": 20, "ledger_entity": "ACME"}, headers=alice)
        )
    )
    waiter.start()
    wait_for(lambda: signal.waiters == 1, timeout=15)
    seen = signal.generation
    other = enqueue(client, ingest, ledger_entity="GLOBEX")
    wait_for(lambda: signal.generation > seen, timeout=15)  # the waiter was woken by GLOBEX's NOTIFY ...
    wanted = enqueue(client, ingest, ledger_entity="ACME")  # ... and is still waiting for ACME's work
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert [i["id"] for i in answer["r"].json()["items"]] == [wanted["id"]], answer["r"].text
    state = sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (other["id"],)).fetchone()
    assert state == ("PENDING",)


# --- GET /items?due_before= ------------------------------------------------------------------


def test_items_can_be_listed_by_due_before(client: TestClient, auth: Auth) -> None:
    ingest = auth("ingest", "ingest")
    a = enqueue(client, ingest, due_at="2030-01-01T00:00:00Z")
    enqueue(client, ingest, due_at="2030-01-02T00:00:00Z")
    b = enqueue(client, ingest, due_at="2029-12-31T23:59:59.999999Z")

    def listed(**params: str) -> list[str]:
        response = client.get("/items", params=params, headers=auth("audrey", "auditor"))
        assert response.status_code == 200, response.text
        return [i["id"] for i in response.json()["items"]]

    assert listed(due_before="2030-01-02T00:00:00Z") == [a["id"], b["id"]]  # exclusive; created order
    assert listed(due_before="2030-01-01T00:00:00Z") == [b["id"]]
    assert listed(due_before="2030-01-01T01:00:00+01:00", state="PENDING") == [b["id"]]
    for bad in ("2030-01-01", "1700000000", "tomorrow"):
        assert_problem(
            client.get("/items", params={"due_before": bad}, headers=ingest), 422, "VALIDATION_ERROR"
        )


# --- overdue and aging -----------------------------------------------------------------------


def test_stats_show_overdue_and_aging_of_open_items(client: TestClient, aged: dict[str, str]) -> None:
    stats = client.get("/stats", headers=aged).json()
    # Open: 3 + 4 + 5 + 6 + 2 = 20; overdue: all but the first 3; resolved ones count nowhere.
    assert stats["aging"] == {"0-1d": 3, "1-3d": 4, "3-7d": 5, "7-30d": 6, "30d+": 2}
    assert list(stats["aging"]) == ["0-1d", "1-3d", "3-7d", "7-30d", "30d+"]
    assert stats["overdue"] == 17
    assert 30 * 86400 <= stats["oldest_overdue_s"] < 31 * 86400, stats
    by_entity = stats["overdue_by_ledger_entity"]
    assert sum(by_entity.values()) == 17 and all(by_entity.values()), by_entity
    assert list(by_entity.values()) == sorted(by_entity.values(), reverse=True), by_entity


def test_aging_counts_every_open_state_in_every_band(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    """PENDING rows are counted per band by index range, the other open states in one pass: each
    (state, band) gets its own count, so a band read from the wrong bound or part shows."""
    ages = {
        "0-1d": "2 hours",
        "1-3d": "1 day 1 hour",
        "3-7d": "6 days",
        "7-30d": "29 days",
        "30d+": "400 days",
    }
    states = ("PENDING", "ASSIGNED", "QUARANTINED", "AWAITING_APPROVAL", "RESOLVED")
    expected = dict.fromkeys(ages, 0)
    for s, state in enumerate(states):
        for b, (band, age) in enumerate(ages.items()):
            n = 1 + s + 5 * b  # 1 .. 25, all different
            expected[band] += n if state != "RESOLVED" else 0
            sql.execute(
                """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount,
                       match_decision, source_hash, state, leased_by, leased_at, lease_expires_at,
                       resolution, resolved_by, resolved_at, prepared_by, proposed_resolution, created_at)
                   SELECT %(state)s || %(band)s || g, 'E', 1, 'PARTIAL', 'h', %(state)s,
                          CASE WHEN %(state)s IN ('ASSIGNED', 'RESOLVED') THEN 'r' END,
                          CASE WHEN %(state)s IN ('ASSIGNED', 'RESOLVED') THEN now() END,
                          CASE WHEN %(state)s IN ('ASSIGNED', 'RESOLVED') THEN now() + interval '1 hour' END,
                          CASE WHEN %(state)s = 'RESOLVED' THEN 'OK' END,
                          CASE WHEN %(state)s = 'RESOLVED' THEN 'r' END,
                          CASE WHEN %(state)s = 'RESOLVED' THEN now() END,
                          CASE WHEN %(state)s = 'AWAITING_APPROVAL' THEN 'p' END,
                          CASE WHEN %(state)s = 'AWAITING_APPROVAL' THEN 'OK' END,
                          now() - CAST(%(age)s AS interval)
                   FROM generate_series(1, %(n)s) AS g""",
                {"state": state, "band": band, "age": age, "n": n},
            )
    stats = client.get("/stats", headers=auth("ada", "admin")).json()
    assert stats["aging"] == expected


def test_overdue_by_ledger_entity_is_the_top_20_most_first(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    # Entity E01 has 1 overdue item, E02 2, ... E25 25; then the 20 with most are E25..E06.
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, due_at) SELECT 'k' || e || '-' || n, 'E' || lpad(e::text, 2, '0'), 1, 'PARTIAL',"
        " 'h', now() - interval '1 minute' FROM generate_series(1, 25) e, generate_series(1, e) n"
    )
    stats = client.get("/stats", headers=auth("rita", "reviewer")).json()
    expected = {f"E{e:02d}": e for e in range(25, 5, -1)}
    assert list(stats["overdue_by_ledger_entity"].items()) == list(expected.items())
    assert stats["overdue"] == sum(range(1, 26))


def test_nothing_overdue_reads_as_zero_and_null(client: TestClient, auth: Auth) -> None:
    enqueue(client, auth("ingest", "ingest"))
    stats = client.get("/stats", headers=auth("rita", "reviewer")).json()
    assert (stats["overdue"], stats["oldest_overdue_s"], stats["overdue_by_ledger_entity"]) == (0, None, {})
    assert stats["aging"] == {"0-1d": 1, "1-3d": 0, "3-7d": 0, "7-30d": 0, "30d+": 0}


def test_metrics_expose_overdue_items_and_the_oldest_overdue(
    client: TestClient, aged: dict[str, str]
) -> None:
    text = client.get("/metrics", headers=aged).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("review_queue_overdue_items ", "review_queue_oldest_overdue_seconds "))
    }
    assert values["review_queue_overdue_items"] == 17, text
    assert 30 * 86400 <= values["review_queue_oldest_overdue_seconds"] < 31 * 86400, values
