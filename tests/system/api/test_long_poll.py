"""POST /leases with wait_s: woken by LISTEN/NOTIFY, holding no pooled connection while it waits,
ended by a client that goes away, and polling while the listening connection is lost."""

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from db.notify import LISTENER_NAME
from tests.support import seed_items
from tests.support.api import assert_problem, item_body
from tests.support.postgres import make_settings
from tests.support.servers import metric

WAIT_S = 20  # the largest wait; "promptly" below means well inside it, never a tuned wall-clock bound


def until(condition: Callable[[], Any], *, within_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {within_s} s")


def test_a_waiting_lease_holds_no_connection_and_wakes_on_enqueue(
    tight_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    reviewer = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    admin = {"Authorization": f"Bearer {make_token('ada', 'admin')}"}
    answer: dict[str, Any] = {}

    def wait_for_work() -> None:
        started = time.monotonic()
        answer["response"] = httpx.post(
            f"{tight_server}/leases", json={"wait_s": WAIT_S}, headers=reviewer, timeout=WAIT_S + 10
        )
        answer["elapsed"] = time.monotonic() - started

    waiter = threading.Thread(target=wait_for_work)
    waiter.start()
    until(lambda: metric(tight_server, admin, "review_queue_lease_waiters") == 1, what="one waiter")

    # The pool has one connection: these answer only because the waiting lease holds none.
    listed = httpx.get(f"{tight_server}/items", headers=reviewer)
    assert listed.status_code == 200, listed.text
    assert sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'review-queue' AND state LIKE 'idle in transaction%'"
    ).fetchone() == (0,)

    # Enqueued through the API, i.e. by another connection; its NOTIFY wakes the waiter.
    created = httpx.post(f"{tight_server}/items", json=item_body(), headers=admin)
    assert created.status_code == 201, created.text
    waiter.join(timeout=WAIT_S + 15)
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert [i["id"] for i in response.json()["items"]] == [created.json()["id"]]
    # Woken, not timed out: a listening process does not poll, so only the NOTIFY can explain it.
    assert answer["elapsed"] < WAIT_S / 2, f"the lease took {answer['elapsed']:.1f} s of its {WAIT_S} s"


def test_release_and_reclaim_wake_waiters_too(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], sql: psycopg.Connection
) -> None:
    seed_items(sql, 1)
    alice, bob, admin = auth("alice", "reviewer"), auth("bob", "reviewer"), auth("ada", "admin")
    (held,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    for hand_back in ("release", "reclaim"):
        answer: dict[str, Any] = {}

        def wait_for_work(answer: dict[str, Any] = answer, bob: dict[str, str] = bob) -> None:
            answer["r"] = client.post("/leases", json={"wait_s": WAIT_S}, headers=bob)

        waiter = threading.Thread(target=wait_for_work)
        started = time.monotonic()
        waiter.start()
        until(lambda: client.app.state.work_signal.waiters == 1, what="bob waiting")  # type: ignore[attr-defined]
        if hand_back == "release":
            client.post(f"/items/{held['id']}/release", json={"reason": "not mine"}, headers=alice)
        else:
            sql.execute("UPDATE review_queue_item SET lease_expires_at = now() - interval '1 hour'")
            assert client.post("/admin/reclaim", headers=admin).json()["reclaimed"] == 1
        waiter.join(timeout=WAIT_S + 5)
        elapsed = time.monotonic() - started
        assert [i["id"] for i in answer["r"].json()["items"]] == [held["id"]], answer["r"].text
        assert elapsed < WAIT_S / 2, f"{hand_back}: took {elapsed:.1f} s"
        held = answer["r"].json()["items"][0]
        alice = bob  # bob holds it now and hands it back next round
        bob = auth(f"carol-{hand_back}", "reviewer")


def test_one_notify_per_statement_not_per_row(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], db_url: str
) -> None:
    admin = auth("ada", "admin")
    from tests.support.postgres import libpq

    with psycopg.connect(libpq(db_url), autocommit=True) as listener:
        listener.execute("LISTEN review_queue_work")
        response = client.post(
            "/items/batch", json={"items": [item_body() for _ in range(50)]}, headers=admin
        )
        assert response.status_code == 200
        # A new key announces once more; the same key again (a conflict) creates nothing, announces nothing.
        client.post("/items/batch", json={"items": [item_body(idempotency_key="key-x")]}, headers=admin)
        client.post("/items/batch", json={"items": [item_body(idempotency_key="key-x")]}, headers=admin)
        client.post("/leases", json={"batch_size": 10}, headers=auth("alice", "reviewer"))
        notes = list(listener.notifies(timeout=1.0))
    assert [n.channel for n in notes] == ["review_queue_work", "review_queue_work"], notes


def test_a_client_that_goes_away_ends_its_wait(
    own_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    token = make_token("alice", "reviewer")
    admin = {"Authorization": f"Bearer {make_token('ada', 'admin')}"}
    url = httpx.URL(own_server)
    body = b'{"wait_s": 20}'
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(
            b"POST /leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        until(lambda: metric(own_server, admin, "review_queue_lease_waiters") == 1, what="waiting")
    # Well before its 20 s, the server has stopped waiting for a client that is gone ...
    until(lambda: metric(own_server, admin, "review_queue_lease_waiters") == 0, within_s=WAIT_S / 2)
    # ... so work that arrives now is not leased to nobody.
    seed_items(sql, 1)
    created = httpx.post(f"{own_server}/items", json=item_body(), headers=admin)
    assert created.status_code == 201
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state <> 'PENDING'").fetchone() == (0,)


def test_a_lost_listener_falls_back_to_polling_and_reconnects(
    db_url: str, auth: Callable[[str, str], dict[str, str]], sql: psycopg.Connection
) -> None:
    settings = make_settings(db_url, poll_interval_ms=100)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        signal = client.app.state.work_signal  # type: ignore[attr-defined]
        alice = auth("alice", "reviewer")
        first_pid = until(lambda: signal.listening and signal.backend_pid, what="listener up")
        real_url = signal.url
        signal.url = "postgresql://nobody@127.0.0.1:1/nothing"  # it cannot come back for now
        (terminated,) = sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s AND pid = %s",
            (LISTENER_NAME, first_pid),
        ).fetchone()
        assert terminated
        until(lambda: not signal.listening, what="listener noticed as lost")

        # Nobody listens: an insert is found by polling at REVIEW_QUEUE_POLL_INTERVAL_MS.
        answer: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: answer.update(r=client.post("/leases", json={"wait_s": WAIT_S}, headers=alice))
        )
        started = time.monotonic()
        waiter.start()
        until(lambda: signal.waiters == 1, what="waiting")
        seed_items(sql, 1)
        waiter.join(timeout=WAIT_S + 5)
        assert len(answer["r"].json()["items"]) == 1, answer["r"].text
        assert time.monotonic() - started < WAIT_S / 2

        # The listener reconnects by itself once it can.
        signal.url = real_url
        until(lambda: signal.listening and signal.backend_pid != first_pid, what="listener back")
        answer.clear()
        waiter = threading.Thread(
            target=lambda: answer.update(r=client.post("/leases", json={"wait_s": WAIT_S}, headers=alice))
        )
        waiter.start()
        until(lambda: signal.waiters == 1, what="waiting again")
        created = client.post("/items", json=item_body(), headers=auth("ada", "admin"))
        waiter.join(timeout=WAIT_S + 5)
        assert [i["id"] for i in answer["r"].json()["items"]] == [created.json()["id"]]


@pytest.mark.parametrize("wait_s", ["2", 2.5, True, -1, 21, None])
def test_wait_s_is_a_json_integer_from_0_to_20(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], wait_s: object
) -> None:
    response = client.post("/leases", json={"wait_s": wait_s}, headers=auth("alice", "reviewer"))
    assert_problem(response, 422, "VALIDATION_ERROR")


def test_wait_s_0_answers_at_once_and_a_short_wait_times_out_empty(
    client: TestClient, auth: Callable[[str, str], dict[str, str]]
) -> None:
    alice = auth("alice", "reviewer")
    assert client.post("/leases", json={"wait_s": 0}, headers=alice).json() == {"items": []}
    started = time.monotonic()
    assert client.post("/leases", json={"wait_s": 1}, headers=alice).json() == {"items": []}
    assert time.monotonic() - started >= 1.0  # it did wait, for the whole second


@pytest.fixture
def two_tokens(make_token: Callable[[str, str], str]) -> dict[str, str]:
    # Made here, outside the event loop the async test runs on (make_token runs one of its own).
    return {"admin": make_token("ada", "admin"), "reviewer": make_token("alice", "reviewer")}


@pytest.mark.anyio
async def test_the_async_work_loop_waits_with_wait_s_and_stop_ends_the_wait(
    own_server: str, two_tokens: dict[str, str]
) -> None:
    from client import AsyncReviewQueueClient

    admin = {"Authorization": f"Bearer {two_tokens['admin']}"}
    seen: list[str] = []

    async def handler(item: Any) -> str:
        seen.append(item.ledger_entity)
        return "APPROVED"

    async def waiters() -> float:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"{own_server}/metrics", headers=admin)).text
        return sum(
            float(x.split()[-1]) for x in text.splitlines() if x.startswith("review_queue_lease_waiters ")
        )

    async def until_async(condition: Callable[[], Any], what: str) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if await condition():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{what} not reached within 10 s")

    async with AsyncReviewQueueClient(own_server, two_tokens["reviewer"]) as client:
        worker = asyncio.create_task(client.work(handler, wait_s=WAIT_S, handle_signals=False))
        await until_async(lambda: _eq(waiters(), 1), "the loop waiting on the server")
        async with httpx.AsyncClient() as http:
            created = await http.post(
                f"{own_server}/items", json=item_body(ledger_entity="ARRIVED"), headers=admin
            )
        assert created.status_code == 201
        await until_async(lambda: _true(seen == ["ARRIVED"]), "the item handled")
        await until_async(lambda: _eq(waiters(), 1), "waiting again")
        stopped_at = time.monotonic()
        client.stop()
        stats = await asyncio.wait_for(worker, WAIT_S)
        assert time.monotonic() - stopped_at < WAIT_S / 2, "stop() did not end the wait"
        assert (stats.leased, stats.resolved) == (1, 1)
        await until_async(lambda: _eq(waiters(), 0), "the server ending the abandoned wait")


async def _eq(value: Any, expected: float) -> bool:
    return bool(await value == expected)


async def _true(value: bool) -> bool:
    return value


def test_a_submission_for_approval_wakes_a_waiting_approver_and_a_resolution_announces_nothing(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], db_url: str
) -> None:
    from tests.support.postgres import libpq

    alice, ada, bob = auth("alice", "reviewer"), auth("ada", "admin"), auth("bob", "approver")
    small = client.post("/items", json=item_body(variance_amount="12.50"), headers=ada).json()
    large = client.post("/items", json=item_body(variance_amount="5000.00"), headers=ada).json()
    held = {i["id"]: i for i in client.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]}
    assert set(held) == {small["id"], large["id"]}
    with psycopg.connect(libpq(db_url), autocommit=True) as listener:
        listener.execute("LISTEN review_queue_work")
        # Resolved outright (no approval needed): nothing new is leasable, nothing is announced.
        done = client.post(
            f"/items/{small['id']}/complete",
            json={"resolution": "MATCH_CONFIRMED", "lease_token": held[small["id"]]["lease_token"]},
            headers=alice,
        )
        assert done.json()["outcome"] == "resolved", done.text
        assert list(listener.notifies(timeout=1.0)) == []

        answer: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: answer.update(
                r=client.post("/leases", json={"queue": "approval", "wait_s": WAIT_S}, headers=bob)
            )
        )
        started = time.monotonic()
        waiter.start()
        until(lambda: client.app.state.work_signal.waiters == 1, what="bob waiting")  # type: ignore[attr-defined]
        submitted = client.post(
            f"/items/{large['id']}/complete",
            json={
                "resolution": "WRITE_OFF",
                "note": "below the write-off limit",
                "lease_token": held[large["id"]]["lease_token"],
            },
            headers=alice,
        )
        assert submitted.json()["outcome"] == "submitted_for_approval", submitted.text
        waiter.join(timeout=WAIT_S + 5)
        elapsed = time.monotonic() - started
        assert [i["id"] for i in answer["r"].json()["items"]] == [large["id"]], answer["r"].text
        assert elapsed < WAIT_S / 2, f"the approver was woken after {elapsed:.1f} s of {WAIT_S} s"
        assert [n.channel for n in listener.notifies(timeout=1.0)] == ["review_queue_work"]
