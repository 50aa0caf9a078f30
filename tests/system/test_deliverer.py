"""The webhook deliverer as a real process, against real PostgreSQL and a real HTTP receiver: signed
deliveries a receiver verifies with the standardwebhooks package, retries with backoff that give up
into `failing`, redeliver, 410, redirects, timeouts, the SSRF guard, and two deliverers at once."""

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from bench.receiver import Receiver
from tests.support import wait_for
from tests.support.api import assert_problem, item_body
from tests.support.servers import start_deliverer, stop_process

Headers = Callable[[str, str], dict[str, str]]
DEADLINE_S = 60  # generous: reached only when something is broken, or the machine is very busy


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver().start()
    yield got
    got.stop()


@pytest.fixture
def deliverer(db_url: str, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "deliverer.log"
    process = start_deliverer(db_url, log)
    yield log
    stop_process(process)
    assert "deliverer_stopped" in log.read_text(), log.read_text()[-3000:]


@pytest.fixture
def fast_client(db_url: str) -> Iterator[TestClient]:
    from api.app import create_app
    from tests.support.postgres import make_settings

    with TestClient(
        create_app(make_settings(db_url, webhook_allow_http=True)), raise_server_exceptions=False
    ) as c:
        yield c


def subscribe(client: TestClient, admin: dict[str, str], receiver: Receiver, path: str, **body: Any) -> str:
    answer = client.put(
        f"/webhooks/{path.strip('/')}", json={"url": receiver.url(path), **body}, headers=admin
    )
    assert answer.status_code == 201, answer.text
    secret = answer.json()["secret"]
    assert secret.startswith("whsec_")
    receiver.secrets[path] = secret
    return str(secret)


def resolve_one(
    client: TestClient, admin: dict[str, str], reviewer: dict[str, str], note: str | None = None
) -> dict[str, Any]:
    created = client.post("/items", json=item_body(), headers=admin).json()
    (held,) = client.post("/leases", json={"batch_size": 1}, headers=reviewer).json()["items"]
    assert held["id"] == created["id"]
    done = client.post(
        f"/items/{held['id']}/complete", json={"resolution": "APPROVED", "note": note}, headers=reviewer
    )
    assert done.status_code == 200, done.text
    return dict(done.json()["item"])


def webhook(client: TestClient, admin: dict[str, str], name: str) -> dict[str, Any]:
    (found,) = [w for w in client.get("/webhooks", headers=admin).json()["webhooks"] if w["name"] == name]
    return dict(found)


def test_a_decision_is_delivered_signed_and_the_receiver_verifies_it(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path, sql: psycopg.Connection
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    subscribe(fast_client, admin, receiver, "/ledger")
    item = resolve_one(fast_client, admin, reviewer)
    wait_for(lambda: receiver.of("/ledger"), DEADLINE_S)
    (got,) = receiver.of("/ledger")
    assert got.forged is None and got.verified is not None, got
    (event_id,) = sql.execute(
        "SELECT id FROM review_queue_event WHERE item_id = %s AND event = 'RESOLVED'", (item["id"],)
    ).fetchone()  # type: ignore[misc]
    assert got.headers["webhook-id"] == f"evt_{event_id}"
    assert got.headers["content-type"] == "application/json"
    body = got.payload
    assert body["type"] == "item.resolved" and body["timestamp"] == body["data"]["at"]
    data = body["data"]
    assert (data["id"], data["event"], data["item_id"], data["actor"]) == (
        event_id,
        "RESOLVED",
        item["id"],
        "alice",
    )
    assert data["item"]["state"] == "RESOLVED" and data["item"]["lease_token"] is None
    # Only the default types went out: ENQUEUED and LEASED are not among them.
    assert [r.payload["type"] for r in receiver.received] == ["item.resolved"]
    wait_for(
        lambda: webhook(fast_client, admin, "ledger")["status"] == "ok" and _delivered(fast_client, admin), 30
    )
    (attempt,) = fast_client.get("/webhooks/ledger/deliveries", headers=admin).json()["deliveries"]
    assert (attempt["outcome"], attempt["status_code"], attempt["attempt"], attempt["webhook_id"]) == (
        "delivered", 200, 1, f"evt_{event_id}",
    )  # fmt: skip
    assert "secret" not in webhook(fast_client, admin, "ledger")


def _delivered(client: TestClient, admin: dict[str, str]) -> bool:
    return bool(client.get("/webhooks/ledger/deliveries", headers=admin).json()["deliveries"])


def test_a_body_that_is_not_ascii_is_signed_as_it_is_sent(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path
) -> None:
    """Every other payload is ASCII: a note with "Zürich" shows the signed bytes are the sent ones."""
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    subscribe(fast_client, admin, receiver, "/zurich")
    resolve_one(fast_client, admin, reviewer, note="Kontrolle Zürich, 5 % Skonto")
    wait_for(lambda: receiver.of("/zurich"), DEADLINE_S)
    (got,) = receiver.of("/zurich")
    assert got.forged is None, f"the receiver could not verify the body it got: {got.forged}: {got.body!r}"
    assert got.verified["data"]["item"]["resolution_note"] == "Kontrolle Zürich, 5 % Skonto"
    assert got.answered == 200


def test_a_success_after_a_failure_starts_the_retry_state_over(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    answers = iter([500])
    receiver.answer = lambda _: (next(answers, 200), {})
    subscribe(fast_client, admin, receiver, "/ledger")
    resolve_one(fast_client, admin, reviewer)
    wait_for(lambda: any(r.answered == 200 for r in receiver.of("/ledger")), DEADLINE_S)
    wait_for(
        lambda: len(fast_client.get("/webhooks/ledger/deliveries", headers=admin).json()["deliveries"]) == 2,
        30,
    )
    sub = webhook(fast_client, admin, "ledger")
    assert (sub["status"], sub["attempts"], sub["failing_since"]) == ("ok", 0, None), sub
    assert [r.answered for r in receiver.of("/ledger")] == [500, 200]


def test_a_secret_stored_under_the_old_key_is_read_after_a_key_rotation(
    fast_client: TestClient, auth: Headers, receiver: Receiver, db_url: str, tmp_path: Path
) -> None:
    """Subscribed under K1 (the API's key); delivered by a deliverer keyed `K2,K1`."""
    from cryptography.fernet import Fernet

    from tests.support.postgres import WEBHOOK_KEY

    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    subscribe(fast_client, admin, receiver, "/rotated")
    resolve_one(fast_client, admin, reviewer)
    rotated = f"{Fernet.generate_key().decode()},{WEBHOOK_KEY}"
    process = start_deliverer(db_url, tmp_path / "d.log", REVIEW_QUEUE_WEBHOOK_KEY=rotated)
    try:
        wait_for(
            lambda: fast_client.get("/webhooks/rotated/deliveries", headers=admin).json()["deliveries"],
            DEADLINE_S,
        )
    finally:
        stop_process(process)
    (attempt,) = fast_client.get("/webhooks/rotated/deliveries", headers=admin).json()["deliveries"]
    assert (attempt["outcome"], attempt["error"]) == ("delivered", None), attempt
    (got,) = receiver.of("/rotated")
    assert got.forged is None and got.verified is not None


def test_a_failing_event_holds_back_only_its_own_item(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path
) -> None:
    """Item A's events fail; B's and C's are delivered meanwhile; A's later event waits behind its
    first, and both arrive in their order once the receiver takes them."""
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    healed = False
    a = fast_client.post("/items", json=item_body(), headers=admin).json()
    receiver.answer = lambda r: (
        (500, {}) if not healed and r.payload["data"]["item_id"] == a["id"] else (200, {})
    )
    subscribe(
        fast_client, admin, receiver, "/lines", events=["item.enqueued", "item.leased", "item.released"]
    )
    # A's ENQUEUED committed before the subscription: a LEASED of A is its first event after it.
    (leased,) = fast_client.post("/leases", json={"batch_size": 1}, headers=reviewer).json()["items"]
    assert leased["id"] == a["id"]
    wait_for(lambda: any(r.answered == 500 for r in receiver.of("/lines")), DEADLINE_S)
    others = [fast_client.post("/items", json=item_body(), headers=admin).json()["id"] for _ in range(2)]
    released = fast_client.post(f"/items/{a['id']}/release", json={}, headers=reviewer)  # A's next event
    assert released.status_code == 200, released.text

    def delivered(item: str) -> list[str]:
        return [r.payload["data"]["event"] for r in receiver.of("/lines")
                if r.answered == 200 and r.payload["data"]["item_id"] == item]  # fmt: skip

    wait_for(lambda: all(delivered(i) == ["ENQUEUED"] for i in others), DEADLINE_S)
    sub = webhook(fast_client, admin, "lines")
    assert (sub["status"], sub["held_items"]) == ("retrying", 1), sub
    assert delivered(a["id"]) == [] and sub["attempts"] >= 1 and sub["last_error"] == "HTTP 500"
    healed = True
    wait_for(lambda: len(delivered(a["id"])) == 2, DEADLINE_S)
    assert delivered(a["id"]) == ["LEASED", "RELEASED"]
    # RELEASED waited: never sent before LEASED went through.
    tried = [(r.payload["data"]["event"], r.answered) for r in receiver.of("/lines")
             if r.payload["data"]["item_id"] == a["id"]]  # fmt: skip
    assert tried[-2:] == [("LEASED", 200), ("RELEASED", 200)], tried
    assert {event for event, _ in tried[:-2]} == {"LEASED"}, tried
    wait_for(lambda: webhook(fast_client, admin, "lines")["held_items"] == 0, 30)
    assert webhook(fast_client, admin, "lines")["attempts"] == 0


def test_a_delivery_retried_after_the_item_moved_on_says_what_happened_then(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path
) -> None:
    """Issue 42: the receiver refuses the RESOLVED event until the item has been reopened and revised
    to another amount; the retry that goes through still says RESOLVED at 12.50 with the decision's
    note, the same `data` as the refused attempt (it said the item as it is now: PENDING, 31.75)."""
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    healed = False
    receiver.answer = lambda r: (200 if healed or r.payload["type"] != "item.resolved" else 500, {})
    subscribe(fast_client, admin, receiver, "/ledger")
    item = resolve_one(fast_client, admin, reviewer, note="first look")
    assert item["variance_amount"] == "12.50"
    wait_for(lambda: any(r.answered == 500 for r in receiver.of("/ledger")), DEADLINE_S)
    reopened = fast_client.post(f"/items/{item['id']}/reopen", json={"reason": "re-issued"}, headers=admin)
    assert reopened.status_code == 200, reopened.text
    revised = fast_client.post(
        f"/items/{item['id']}/revisions",
        json={"variance_amount": "31.75", "source_hash": "h-2"},
        headers=admin,
    )
    assert revised.status_code == 200 and revised.json()["item"]["state"] == "PENDING", revised.text
    healed = True
    wait_for(lambda: len([r for r in receiver.of("/ledger") if r.answered == 200]) == 3, DEADLINE_S)
    got = receiver.of("/ledger")
    assert all(r.forged is None for r in got)
    resolved = [r for r in got if r.payload["type"] == "item.resolved"]
    assert resolved[0].answered == 500 and resolved[-1].answered == 200
    assert {r.headers["webhook-id"] for r in resolved} == {f"evt_{resolved[0].payload['data']['id']}"}
    # Every attempt sends the same data (but `cursor`: a retry of a held event carries the start).
    first = {k: v for k, v in resolved[0].payload["data"].items() if k != "cursor"}
    assert all({k: v for k, v in r.payload["data"].items() if k != "cursor"} == first for r in resolved)
    then = resolved[-1].verified["data"]
    assert (then["event"], then["item_as_of"]) == ("RESOLVED", "event")
    assert (then["item"]["state"], then["item"]["variance_amount"], then["item"]["resolution_note"]) == (
        "RESOLVED", "12.50", "first look",
    )  # fmt: skip
    # The item's later events followed, in order, each as the item stood after it.
    delivered = [(r.payload["type"], r.payload["data"]["item"]["state"], r.payload["data"]["item"][
        "variance_amount"]) for r in got if r.answered == 200]  # fmt: skip
    assert delivered == [
        ("item.resolved", "RESOLVED", "12.50"),
        ("item.reopened", "PENDING", "12.50"),
        ("item.revised", "PENDING", "31.75"),
    ], delivered
    now = fast_client.get(f"/items/{item['id']}", headers=admin).json()
    assert (now["state"], now["variance_amount"], now["resolution_note"]) == ("PENDING", "31.75", None)


def test_failures_back_off_then_give_up_and_redeliver_resumes(
    fast_client: TestClient, auth: Headers, receiver: Receiver, db_url: str, tmp_path: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    receiver.answer = lambda _: (500, {})
    subscribe(fast_client, admin, receiver, "/flaky")
    resolve_one(fast_client, admin, reviewer)
    process = start_deliverer(db_url, tmp_path / "d.log", REVIEW_QUEUE_WEBHOOK_GIVE_UP_TEST_S="3")
    try:
        wait_for(lambda: webhook(fast_client, admin, "flaky")["status"] == "failing", DEADLINE_S)
        failing = webhook(fast_client, admin, "flaky")
        attempts = fast_client.get("/webhooks/flaky/deliveries", headers=admin).json()["deliveries"]
        assert len(attempts) >= 2 and {a["outcome"] for a in attempts} == {"failed"}, attempts
        assert [a["attempt"] for a in attempts] == list(range(len(attempts), 0, -1))  # newest first
        assert {a["webhook_id"] for a in attempts} == {attempts[0]["webhook_id"]}  # the same id every time
        assert attempts[0]["error"] == "HTTP 500" and failing["last_error"] == "HTTP 500"
        metrics = fast_client.get("/metrics", headers=admin).text
        assert "review_queue_webhook_failing_subscriptions 1.0" in metrics
        assert 'review_queue_webhook_delivery_lag_seconds{subscription="flaky"}' in metrics
        # Given up: no more attempts until an admin resumes it.
        seen = len(receiver.of("/flaky"))
        time.sleep(1.5)  # several retry intervals: a retry now would be a bug
        assert len(receiver.of("/flaky")) == seen
        receiver.answer = lambda _: (200, {})
        resumed = fast_client.post("/webhooks/flaky/redeliver", json={}, headers=admin)
        assert resumed.status_code == 200 and resumed.json()["status"] == "ok", resumed.text
        wait_for(lambda: any(r.answered == 200 for r in receiver.of("/flaky")), DEADLINE_S)
        wait_for(lambda: "review_queue_webhook_failing_subscriptions 0.0" in fast_client.get(
            "/metrics", headers=admin).text, 30)  # fmt: skip
        assert all(r.forged is None for r in receiver.received)
    finally:
        stop_process(process)


def test_a_410_disables_the_subscription(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    receiver.answer = lambda _: (410, {})
    subscribe(fast_client, admin, receiver, "/gone")
    resolve_one(fast_client, admin, reviewer)
    wait_for(lambda: webhook(fast_client, admin, "gone")["status"] == "disabled", DEADLINE_S)
    sub = webhook(fast_client, admin, "gone")
    assert sub["active"] is False and "410" in sub["disabled_reason"], sub
    resolve_one(fast_client, admin, reviewer)
    time.sleep(1)  # ten deliverer intervals: a delivery now would be a bug
    assert len(receiver.of("/gone")) == 1


def test_a_redirect_is_not_followed(
    fast_client: TestClient, auth: Headers, receiver: Receiver, deliverer: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    receiver.answer = lambda r: (
        (302, {"location": receiver.url("/elsewhere")}) if r.path == "/moved" else (200, {})
    )
    subscribe(fast_client, admin, receiver, "/moved")
    resolve_one(fast_client, admin, reviewer)
    wait_for(
        lambda: fast_client.get("/webhooks/moved/deliveries", headers=admin).json()["deliveries"], DEADLINE_S
    )
    attempt = fast_client.get("/webhooks/moved/deliveries", headers=admin).json()["deliveries"][-1]
    assert attempt["outcome"] == "failed" and attempt["status_code"] == 302, attempt
    assert "not followed" in attempt["error"] and "/elsewhere" in attempt["error"]
    assert receiver.of("/elsewhere") == []


def test_a_slow_receiver_times_out(
    fast_client: TestClient, auth: Headers, receiver: Receiver, db_url: str, tmp_path: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    receiver.delay_s = 4
    subscribe(fast_client, admin, receiver, "/slow")
    resolve_one(fast_client, admin, reviewer)
    process = start_deliverer(db_url, tmp_path / "d.log", REVIEW_QUEUE_WEBHOOK_TIMEOUT_S="1")
    try:
        wait_for(
            lambda: fast_client.get("/webhooks/slow/deliveries", headers=admin).json()["deliveries"],
            DEADLINE_S,
        )
        attempt = fast_client.get("/webhooks/slow/deliveries", headers=admin).json()["deliveries"][-1]
        assert (attempt["outcome"], attempt["status_code"], attempt["error"]) == (
            "failed", None, "no answer within 1 s",
        )  # fmt: skip
    finally:
        stop_process(process)


def _peak_rss_bytes(pid: int) -> int:
    """The process's resident set at its highest so far (VmHWM): a brief balloon is not missed."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def test_a_receiver_answering_an_endless_body_cannot_balloon_the_deliverer(
    fast_client: TestClient, auth: Headers, receiver: Receiver, db_url: str, tmp_path: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    subscribe(fast_client, admin, receiver, "/endless")
    # Time enough to read the whole (capped) body, as the buffered deliverer did.
    process = start_deliverer(db_url, tmp_path / "d.log", REVIEW_QUEUE_WEBHOOK_TIMEOUT_S="20")

    def attempts() -> list[dict[str, Any]]:
        return list(fast_client.get("/webhooks/endless/deliveries", headers=admin).json()["deliveries"])

    try:
        # An ordinary delivery first: what any delivery costs is in the baseline.
        resolve_one(fast_client, admin, reviewer)
        wait_for(lambda: len(attempts()) == 1, DEADLINE_S)
        before = _peak_rss_bytes(process.pid)
        receiver.endless = True
        resolve_one(fast_client, admin, reviewer)
        wait_for(lambda: len(attempts()) == 2, DEADLINE_S)
        latest = attempts()[0]
        wait_for(lambda: latest["webhook_id"] in receiver.body_sent, DEADLINE_S)
        grown = _peak_rss_bytes(process.pid) - before
    finally:
        stop_process(process)
    assert (latest["outcome"], latest["status_code"]) == ("delivered", 200), latest
    sent = receiver.body_sent[latest["webhook_id"]]
    assert grown < 16 * 2**20, f"the deliverer grew by {grown / 2**20:.0f} MiB ({sent / 2**20:.0f} MiB sent)"
    # The rest stayed in the socket buffers when the deliverer hung up, far short of the whole.
    assert sent < 64 * 2**20, f"the receiver got {sent / 2**20:.0f} MiB of its body out"


def test_a_loopback_receiver_is_refused_unless_allowed(
    fast_client: TestClient, auth: Headers, receiver: Receiver, db_url: str, tmp_path: Path
) -> None:
    admin, reviewer = auth("ada", "admin"), auth("alice", "reviewer")
    subscribe(fast_client, admin, receiver, "/internal")
    resolve_one(fast_client, admin, reviewer)
    process = start_deliverer(db_url, tmp_path / "d.log", REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS="")
    try:
        wait_for(
            lambda: fast_client.get("/webhooks/internal/deliveries", headers=admin).json()["deliveries"],
            DEADLINE_S,
        )
        attempt = fast_client.get("/webhooks/internal/deliveries", headers=admin).json()["deliveries"][-1]
        assert attempt["outcome"] == "failed" and attempt["status_code"] is None
        assert "resolves to 127.0.0.1 (loopback;" in attempt["error"], attempt
        assert receiver.of("/internal") == []
    finally:
        stop_process(process)


def test_two_deliverers_never_send_one_subscription_twice_at_once(
    fast_client: TestClient,
    auth: Headers,
    receiver: Receiver,
    db_url: str,
    tmp_path: Path,
    sql: psycopg.Connection,
) -> None:
    admin = auth("ada", "admin")
    receiver.delay_s = 0.05  # each request stays in flight a while: overlap would be seen
    paths = [f"/sub-{n}" for n in range(3)]
    for path in paths:
        subscribe(fast_client, admin, receiver, path, events=["item.enqueued"])
    for _ in range(10):
        assert fast_client.post("/items", json=item_body(), headers=admin).status_code == 201
    processes = [start_deliverer(db_url, tmp_path / f"d{n}.log") for n in range(2)]
    try:
        wait_for(
            lambda: all(len({r.headers["webhook-id"] for r in receiver.of(p)}) == 10 for p in paths),
            DEADLINE_S,
        )
    finally:
        for process in processes:
            stop_process(process)
    assert receiver.most_in_flight == dict.fromkeys(paths, 1), receiver.most_in_flight
    enqueued = [f"evt_{r[0]}" for r in sql.execute("SELECT id FROM review_queue_event ORDER BY xid, id")]
    for path in paths:
        assert [r.headers["webhook-id"] for r in receiver.of(path)] == enqueued, path
    logs = "".join((tmp_path / f"d{n}.log").read_text() for n in range(2))
    assert logs.count("webhook_delivered") == 30, "a deliverer sent an event another one had sent"


def test_http_is_refused_unless_allowed_and_https_is_taken(client: TestClient, auth: Headers) -> None:
    admin = auth("ada", "admin")
    problem = assert_problem(
        client.put("/webhooks/plain", json={"url": "http://hooks.example.com/rq"}, headers=admin),
        422,
        "VALIDATION_ERROR",
    )
    assert problem["errors"][0]["loc"] == ["body", "url"]
    assert (
        client.put("/webhooks/tls", json={"url": "https://hooks.example.com/rq"}, headers=admin).status_code
        == 201
    )
