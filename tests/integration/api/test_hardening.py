"""Hostile and careless input: forged lease tokens, poison items, lenient money, lax integers.

Each test here failed on the code before the hardening work (issue 10): a forged token answered
500, a poison item spun forever, and "1_000.50", "+5" or `"2"` were accepted.
"""

import base64
import json
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.app import create_app
from api.schemas import ItemOut
from client import ReviewQueueClient
from tests.support import backdate_lease, seed_items
from tests.support.api import assert_problem, item_body
from tests.support.postgres import make_settings

Headers = dict[str, str]
HOLDER_ACTIONS = ("complete", "renew", "release")


def _body(action: str, token: str) -> dict[str, Any]:
    return {"lease_token": token, **({"resolution": "APPROVED"} if action == "complete" else {})}


def _rows(sql: psycopg.Connection) -> list[tuple[str]]:
    return sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i ORDER BY id").fetchall()


def _old_form(item_id: str, epoch: int) -> str:
    """The lease token as it was before: base64url(item id + 8-byte epoch), computable by anyone."""
    raw = uuid.UUID(item_id).bytes + epoch.to_bytes(8, "big")
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# --- 1 and 6: forged, impossible and old-form lease tokens --------------------------------


@pytest.mark.parametrize("action", HOLDER_ACTIONS)
@pytest.mark.parametrize("epoch", [2**63, 2**64 - 1, 1, 0])
def test_an_old_form_or_overflowing_token_is_409_or_404_never_500(
    client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers], action: str, epoch: int
) -> None:
    """An epoch of 2**63 or more overflowed bigint in the guard (500); epoch 1 is the token anyone
    could compute for a first lease from the public id. Both are refused, and change nothing."""
    seed_items(sql, 1)
    alice = auth("alice", "reviewer")
    (item,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    before = _rows(sql)
    forged = _old_form(item["id"], epoch)
    response = client.post(f"/items/{item['id']}/{action}", json=_body(action, forged), headers=alice)
    assert_problem(response, 409, "LEASE_NOT_HELD")
    unknown = str(uuid.uuid4())
    response = client.post(
        f"/items/{unknown}/{action}", json=_body(action, _old_form(unknown, epoch)), headers=alice
    )
    assert_problem(response, 404, "NOT_FOUND")
    assert _rows(sql) == before


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    action=st.sampled_from(HOLDER_ACTIONS),
    raw=st.binary(min_size=1, max_size=48),
    same_item=st.booleans(),
)
def test_any_well_formed_token_that_is_not_the_lease_is_refused(
    client: TestClient,
    sql: psycopg.Connection,
    auth: Callable[[str, str], Headers],
    action: str,
    raw: bytes,
    same_item: bool,
) -> None:
    """Random bytes, or random bytes behind the item's own id, in every shape the schema admits."""
    alice = auth("alice", "reviewer")
    if not client.get("/items?state=ASSIGNED&leased_by=me", headers=alice).json()["items"]:
        seed_items(sql, 1)
        assert client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    (item,) = client.get("/items?state=ASSIGNED&leased_by=me", headers=alice).json()["items"]
    prefix = uuid.UUID(item["id"]).bytes if same_item else b""
    token = base64.urlsafe_b64encode(prefix + raw).decode().rstrip("=")[:64]
    if token == item["lease_token"]:
        return  # astronomically unlikely: 122 random bits
    response = client.post(f"/items/{item['id']}/{action}", json=_body(action, token), headers=alice)
    assert_problem(response, 409, "LEASE_NOT_HELD")


def test_lease_tokens_are_unforgeable_and_differ_per_lease(
    client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers]
) -> None:
    seed_items(sql, 1)
    alice = auth("alice", "reviewer")
    (first,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert client.post(f"/items/{first['id']}/release", json={}, headers=alice).status_code == 200
    # Named: the release cools the item off for alice's unnamed leases.
    (second,) = client.post("/leases", json={"item_id": first["id"]}, headers=alice).json()["items"]
    assert second["id"] == first["id"] and second["attempts"] == 2
    tokens = {first["lease_token"], second["lease_token"], _old_form(first["id"], 2)}
    assert len(tokens) == 3, "a token equals the one computable from the id and attempts"
    # The token is the item's id and 16 random bytes: nothing of it is the epoch.
    raw = base64.urlsafe_b64decode(second["lease_token"] + "==")
    nonce = sql.execute("SELECT lease_nonce FROM review_queue_item WHERE id = %s", (first["id"],)).fetchone()
    assert raw == uuid.UUID(first["id"]).bytes + nonce[0].bytes  # type: ignore[index]
    stale = client.post(
        f"/items/{first['id']}/complete",
        json={"resolution": "APPROVED", "lease_token": first["lease_token"]},
        headers=alice,
    )
    assert_problem(stale, 409, "LEASE_NOT_HELD")


# --- 2: poison items are quarantined ------------------------------------------------------


@pytest.fixture
def strict_client(db_url: str) -> Any:
    # No release cool-off: these tests count the attempts of one reviewer taking an item back.
    settings = make_settings(db_url, max_attempts=3, release_cooldown_s=0)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _events(client: TestClient, item_id: str, headers: Headers) -> list[str]:
    return [e["event"] for e in client.get(f"/items/{item_id}/events", headers=headers).json()["events"]]


def _counter(metrics: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_released_at_max_attempts_is_quarantined_until_an_admin_requeues_it(
    strict_client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers]
) -> None:
    client = strict_client
    alice, admin = auth("alice", "reviewer"), auth("root", "admin")
    # The counter is the process's (other tests in this worker may have quarantined items): by how much.
    counted = _counter(client.get("/metrics", headers=admin).text, "review_queue_items_quarantined_total")
    poison = client.post("/items", json=item_body(), headers=admin).json()
    newer = client.post("/items", json=item_body(), headers=admin).json()
    for attempt in (1, 2, 3):
        (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
        assert (leased["id"], leased["attempts"]) == (poison["id"], attempt)
        released = client.post(f"/items/{poison['id']}/release", json={"reason": "crash"}, headers=alice)
        assert released.status_code == 200, released.text
    assert released.json()["state"] == "QUARANTINED"
    assert _events(client, poison["id"], admin)[-2:] == ["RELEASED", "QUARANTINED"]
    # Never leased again: the next lease takes the newer item, then nothing.
    assert [
        i["id"] for i in client.post("/leases", json={"batch_size": 5}, headers=alice).json()["items"]
    ] == [newer["id"]]
    listed = client.get("/items?state=QUARANTINED", headers=admin).json()["items"]
    assert [i["id"] for i in listed] == [poison["id"]]
    assert client.get("/stats", headers=admin).json()["counts"]["QUARANTINED"] == 1
    metrics = client.get("/metrics", headers=admin).text
    assert "review_queue_quarantined_items 1.0" in metrics
    assert _counter(metrics, "review_queue_items_quarantined_total") == counted + 1

    # Requeue: reviewers may not; it needs a reason; then it is PENDING in its old place.
    assert_problem(
        client.post(f"/items/{poison['id']}/requeue", json={"reason": "x"}, headers=alice), 403, "FORBIDDEN"
    )
    assert_problem(
        client.post(f"/items/{poison['id']}/requeue", json={}, headers=admin), 422, "VALIDATION_ERROR"
    )
    requeued = client.post(f"/items/{poison['id']}/requeue", json={"reason": "parser fixed"}, headers=admin)
    assert requeued.status_code == 200, requeued.text
    assert (requeued.json()["state"], requeued.json()["attempts"]) == ("PENDING", 0)
    trail = client.get(f"/items/{poison['id']}/events", headers=admin).json()["events"]
    assert (trail[-1]["event"], trail[-1]["actor"], trail[-1]["details"]) == (
        "REQUEUED",
        "root",
        {"reason": "parser fixed"},
    )
    assert_problem(
        client.post(f"/items/{poison['id']}/requeue", json={"reason": "again"}, headers=admin),
        409,
        "NOT_QUARANTINED",
    )
    client.post("/items", json=item_body(), headers=admin)  # newer than the poison item
    (again,) = client.post("/leases", json={"batch_size": 1}, headers=auth("bob", "reviewer")).json()["items"]
    assert again["id"] == poison["id"], "a requeued item keeps its place in the queue"


def test_a_reclaim_at_max_attempts_quarantines(
    strict_client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers]
) -> None:
    """A worker that crashes on the item every time: nobody releases, the reclaimer returns it."""
    client = strict_client
    admin = auth("root", "admin")
    item = client.post("/items", json=item_body(), headers=admin).json()
    states = []
    for n in range(3):
        crasher = auth(f"crasher-{n}", "reviewer")
        assert client.post("/leases", json={"batch_size": 1}, headers=crasher).json()["items"]
        backdate_lease(sql, item["id"])
        reclaimed = client.post("/admin/reclaim", json={}, headers=admin).json()
        states.append(reclaimed["items"][0]["state"])
    assert states == ["PENDING", "PENDING", "QUARANTINED"]
    assert _events(client, item["id"], admin)[-2:] == ["RECLAIMED", "QUARANTINED"]
    assert client.post("/leases", json={}, headers=auth("dora", "reviewer")).json()["items"] == []


def test_a_handler_that_always_fails_on_one_item_costs_bounded_leases(
    strict_client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers]
) -> None:
    """The 10-second spin (1,341 leases) becomes at most REVIEW_QUEUE_MAX_ATTEMPTS leases of the
    poison item, and the client never takes it straight back while other work is waiting."""
    client = strict_client
    admin = auth("root", "admin")
    poison = client.post("/items", json=item_body(source_hash="poison"), headers=admin).json()
    for _ in range(6):
        client.post("/items", json=item_body(), headers=admin)
    token = auth("robot", "reviewer")["Authorization"].split()[1]
    seen: list[str] = []
    worker = ReviewQueueClient("http://testserver", token, http=client)

    def handler(item: ItemOut) -> str:
        seen.append(str(item.id))
        if str(item.id) == poison["id"]:
            raise RuntimeError("cannot parse the source document")
        return "APPROVED"

    def stop_when_quarantined() -> None:
        while not stopper.wait(0.05):
            state = sql.execute(
                "SELECT state FROM review_queue_item WHERE id = %s", (poison["id"],)
            ).fetchone()
            open_items = sql.execute(
                "SELECT count(*) FROM review_queue_item WHERE state IN ('PENDING', 'ASSIGNED')"
            ).fetchone()
            if state == ("QUARANTINED",) and open_items == (0,):
                worker.stop()
                return

    stopper = threading.Event()
    watcher = threading.Thread(target=stop_when_quarantined)
    watcher.start()
    try:
        stats = worker.work(handler, batch_size=1, wait_s=1, handle_signals=False)
    finally:
        stopper.set()
        watcher.join(timeout=60)
    assert not watcher.is_alive()
    poison_leases = sql.execute(
        "SELECT count(*) FROM review_queue_event WHERE item_id = %s AND event = 'LEASED'", (poison["id"],)
    ).fetchone()
    assert poison_leases == (3,), poison_leases
    events = sql.execute(
        "SELECT count(*) FROM review_queue_event WHERE item_id = %s", (poison["id"],)
    ).fetchone()
    assert events == (1 + 3 * 2 + 1,), events  # enqueued, 3 x (leased, released), quarantined
    assert stats.resolved == 6
    # Never the poison item twice in a row while others were pending.
    first_others = [n for n, i in enumerate(seen) if i == poison["id"]]
    assert all(seen[n + 1] != poison["id"] for n in first_others[:-1] if n + 1 < len(seen)), seen


# --- 3: money and integers are strict ------------------------------------------------------


@pytest.mark.parametrize(
    "amount",
    [
        "1_000.50",
        "١٢.٥٠",  # Arabic-Indic digits
        " 12.50 ",
        "12.50\n",
        "+5",
        "1e5",
        "0E+1000000",
        "12.",
        ".5",
        "12.500",
        "12345678901234567",
        "NaN",
        "-",
        "",
        True,
    ],
)
def test_lenient_amounts_are_refused_and_store_nothing(
    client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers], amount: object
) -> None:
    response = client.post("/items", json=item_body(variance_amount=amount), headers=auth("root", "admin"))
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert _rows(sql) == []


@pytest.mark.parametrize(
    ("sent", "stored"),
    [("12.50", "12.50"), ("-0.01", "-0.01"), ("9999999999999999.99", "9999999999999999.99"), ("7", "7.00")],
)
def test_strict_decimal_strings_are_accepted_exactly(
    client: TestClient, auth: Callable[[str, str], Headers], sent: str, stored: str
) -> None:
    response = client.post("/items", json=item_body(variance_amount=sent), headers=auth("root", "admin"))
    assert response.status_code == 201, response.text
    assert response.json()["variance_amount"] == stored


@pytest.mark.parametrize(("number", "stored"), [("1e5", "100000.00"), ("12.5", "12.50"), ("-3", "-3.00")])
def test_a_json_number_goes_through_decimal_with_the_same_limits(
    client: TestClient, auth: Callable[[str, str], Headers], number: str, stored: str
) -> None:
    body = item_body(variance_amount="__AMOUNT__")
    raw = json.dumps(body).replace('"__AMOUNT__"', number)
    response = client.post(
        "/items", content=raw, headers={**auth("root", "admin"), "content-type": "application/json"}
    )
    assert response.status_code == 201, response.text
    assert response.json()["variance_amount"] == stored


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/leases", {"batch_size": "2"}),
        ("/leases", {"batch_size": 2.5}),
        ("/leases", {"batch_size": True}),
        ("/admin/reclaim", {"reclaim_batch": "2"}),
        ("/admin/reclaim", {"reclaim_batch": 1.5}),
    ],
)
def test_integers_in_json_bodies_are_strict(
    client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers], path: str, body: Any
) -> None:
    seed_items(sql, 3)
    before = _rows(sql)
    assert_problem(client.post(path, json=body, headers=auth("root", "admin")), 422, "VALIDATION_ERROR")
    assert _rows(sql) == before


def test_the_documented_money_schema_is_exactly_what_is_accepted(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    amount = schema["ItemIn"]["properties"]["variance_amount"]
    string, number = amount["anyOf"]
    # Up to three decimals (KWD's); the currency's own minor units are checked with the currency.
    assert string == {"type": "string", "pattern": r"^-?[0-9]{1,16}(\.[0-9]{1,3})?$"}
    assert number == {
        "type": "number",
        "multipleOf": 0.001,
        "exclusiveMinimum": -1e16,
        "exclusiveMaximum": 1e16,
    }
    shown = schema["ItemOut"]["properties"]["variance_amount"]
    assert shown["type"] == "string" and shown["pattern"] == r"^-?[0-9]{1,16}(\.[0-9]{1,3})?$"


# --- 5: authentication before the database ------------------------------------------------


# --- 7: smaller items ----------------------------------------------------------------------


def test_a_trailing_slash_is_not_found_never_a_redirect_to_the_callers_host(
    client: TestClient, auth: Callable[[str, str], Headers]
) -> None:
    item = client.post("/items", json=item_body(), headers=auth("root", "admin")).json()
    response = client.get(
        f"/items/{item['id']}/",
        headers={**auth("alice", "reviewer"), "Host": "evil.example"},
        follow_redirects=False,
    )
    assert_problem(response, 404, "NOT_FOUND")
    assert "location" not in response.headers


@pytest.mark.parametrize("request_id", ["ünïcode-id", "id\u200bwith-zero-width", "tab\there"])
def test_a_request_id_must_be_ascii(client: TestClient, request_id: str) -> None:
    response = client.get("/healthz", headers={"X-Request-ID": request_id.encode()})  # raw UTF-8 bytes
    generated = response.headers["x-request-id"]
    assert generated.isascii() and len(generated) == 32, generated
    accepted = client.get("/healthz", headers={"X-Request-ID": "abc-123.4:5_6"})
    assert accepted.headers["x-request-id"] == "abc-123.4:5_6"


def test_a_wait_on_the_per_reviewer_lock_says_what_was_waited_for(
    db_url: str, sql: psycopg.Connection, auth: Callable[[str, str], Headers]
) -> None:
    seed_items(sql, 2)
    alice = auth("alice", "reviewer")
    with (
        TestClient(
            create_app(make_settings(db_url, pg_lock_timeout_ms=200)), raise_server_exceptions=False
        ) as c,
        psycopg.connect(sql.info.dsn, autocommit=True) as holder,
    ):
        # What a concurrent lease call of alice holds for its transaction.
        holder.execute("SELECT pg_advisory_lock(hashtextextended('review_queue.lease:' || 'alice', 0))")
        problem = assert_problem(c.post("/leases", json={}, headers=alice), 503, "DATABASE_UNAVAILABLE")
        assert "per-reviewer lock" in problem["detail"] and "table" not in problem["detail"], problem
        assert c.post("/leases", json={}, headers=auth("bob", "reviewer")).json()["items"], (
            "bob is not blocked"
        )
        metrics = c.get("/metrics", headers=auth("root", "admin")).text
    assert 'review_queue_lock_timeouts_total{route="/leases"}' in metrics


# --- 8: bounded metric labels ----------------------------------------------------------------


def test_free_text_resolutions_cannot_grow_the_metric_without_bound(
    client: TestClient, sql: psycopg.Connection, auth: Callable[[str, str], Headers]
) -> None:
    from db.telemetry import MAX_RESOLUTION_LABELS

    seed_items(sql, 120)
    alice = auth("alice", "reviewer")
    held = client.post("/leases", json={"batch_size": 120}, headers=alice).json()["items"]
    for n, item in enumerate(held):
        resolution = f"RANDOM_{n}_{uuid.uuid4().hex[:8].upper()}"
        # Each a code of the catalogue (an admin can add any number of them).
        sql.execute("INSERT INTO resolution_code (code, label) VALUES (%s, 'random')", (resolution,))
        response = client.post(
            f"/items/{item['id']}/complete", json={"resolution": resolution}, headers=alice
        )
        assert response.status_code == 200, response.text
    metrics = client.get("/metrics", headers=auth("root", "admin")).text
    series = [line for line in metrics.splitlines() if line.startswith("review_queue_items_resolved_total{")]
    assert len(series) <= MAX_RESOLUTION_LABELS + 1, len(series)
    assert any('resolution="other"' in line for line in series), series
