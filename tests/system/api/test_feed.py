"""GET /events over HTTP: the long poll (no pooled connection held while it waits) and its 422s."""

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support import wait_for
from tests.support.api import assert_problem, item_body
from tests.support.audit import settle

WAIT_S = 20


def test_a_waiting_feed_read_holds_no_connection_and_answers_when_an_event_commits(
    tight_server: str,
    make_token: Callable[[str, str], str],
    sql: psycopg.Connection,
) -> None:
    reader = {"Authorization": f"Bearer {make_token('ledger', 'integration')}"}
    admin = {"Authorization": f"Bearer {make_token('ada', 'admin')}"}
    head = httpx.get(f"{tight_server}/events", headers=reader).json()
    assert head == {"events": [], "next_cursor": "0" * 32}
    answer: dict[str, Any] = {}

    def wait_for_events() -> None:
        answer["response"] = httpx.get(
            f"{tight_server}/events",
            params={"after": head["next_cursor"], "wait_s": WAIT_S},
            headers=reader,
            timeout=WAIT_S + 10,
        )

    waiter = threading.Thread(target=wait_for_events)
    waiter.start()
    time.sleep(1)  # not a synchronisation: the checks below hold whether or not it waits yet
    # The pool has one connection: these answer only because the waiting read holds none.
    for _ in range(3):
        assert httpx.get(f"{tight_server}/items", headers=admin).status_code == 200
    assert sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'review-queue' AND state LIKE 'idle in transaction%'"
    ).fetchone() == (0,)
    created = httpx.post(f"{tight_server}/items", json=item_body(), headers=admin)
    assert created.status_code == 201, created.text
    waiter.join(timeout=WAIT_S + 15)
    response = answer["response"]
    assert response.status_code == 200, response.text
    (event,) = response.json()["events"]
    assert (event["event"], event["item_id"], event["item"]["state"]) == (
        "ENQUEUED",
        created.json()["id"],
        "PENDING",
    )
    assert response.json()["next_cursor"] == event["cursor"] != head["next_cursor"]


@pytest.mark.parametrize(
    "params",
    [
        {"after": "0" * 31},
        {"after": "0" * 16 + "8" + "0" * 15},  # the id's top bit: not a bigint
        {"after": "G" * 32},
        {"types": "RESOLVED,"},
        {"types": "resolved"},
        {"types": "DELETED"},
        {"wait_s": 21},
        {"wait_s": -1},
        {"limit": 0},
        {"limit": 501},
    ],
)
def test_a_malformed_feed_request_is_a_422(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], params: dict[str, Any]
) -> None:
    assert_problem(
        client.get("/events", params=params, headers=auth("ledger", "integration")), 422, "VALIDATION_ERROR"
    )


def test_a_filtered_read_moves_its_cursor_over_what_it_does_not_serve(
    client: TestClient, auth: Callable[[str, str], dict[str, str]], db_url: str
) -> None:
    admin, reader = auth("ada", "admin"), auth("ledger", "integration")
    for _ in range(3):
        client.post("/items", json=item_body(), headers=admin)
    settle(db_url)
    page = client.get("/events", params={"types": "RESOLVED"}, headers=reader).json()
    everything = client.get("/events", headers=reader).json()
    assert (
        page["events"] == []
        and page["next_cursor"] == everything["next_cursor"] == everything["events"][-1]["cursor"]
    )


POLLERS = 60


def test_feed_long_pollers_leave_the_pool_to_other_routes(
    db_url: str, make_token: Callable[[str, str], str]
) -> None:
    """Many long-pollers of GET /events on one process with a pool of two: their looks at the feed
    share at most half of the pool, so the other routes meanwhile never get a 503 for a connection
    (before, every poller looked every poll interval on a pooled connection of its own). With as
    many waiting as REVIEW_QUEUE_FEED_MAX_WAITERS, one more long-poll is a 429 with Retry-After;
    a read that does not wait is still served, and once they are done a long-poll is again."""
    from tests.support.servers import metric, start_server, stop_server

    process, base = start_server(
        {
            "DATABASE_URL": db_url,
            "REVIEW_QUEUE_POOL_SIZE": "2",
            "REVIEW_QUEUE_POOL_MAX_OVERFLOW": "0",
            "REVIEW_QUEUE_POOL_TIMEOUT_MS": "200",
            "REVIEW_QUEUE_POLL_INTERVAL_MS": "50",
            "REVIEW_QUEUE_FEED_MAX_WAITERS": str(POLLERS),
        }
    )
    reader = {"Authorization": f"Bearer {make_token('ledger', 'integration')}"}
    admin = {"Authorization": f"Bearer {make_token('ada', 'admin')}"}
    try:
        head = httpx.get(f"{base}/events", headers=reader).json()["next_cursor"]
        polled: list[int] = []

        def poll() -> None:
            params = {"after": head, "wait_s": 15, "types": "RESOLVED"}
            polled.append(httpx.get(f"{base}/events", params=params, headers=reader, timeout=30).status_code)

        pollers = [threading.Thread(target=poll) for _ in range(POLLERS)]
        for t in pollers:
            t.start()
        # Every poller waiting (they wait 15 s, and no RESOLVED comes): the checks below run within that.
        wait_for(lambda: metric(base, admin, "review_queue_feed_waiters") >= POLLERS, timeout=10)
        others: list[int] = []
        with httpx.Client(base_url=base, headers=admin, timeout=30) as http:
            # With every poller counted, a long-poll more is refused.
            deadline, busy = time.monotonic() + 4, None
            while busy is None and time.monotonic() < deadline:
                extra = http.get("/events", params={"after": head, "wait_s": 1}, headers=reader)
                busy = extra if extra.status_code == 429 else None
            plain = http.get("/events", params={"after": head}, headers=reader)
            for _ in range(40):
                others.append(http.get("/items").status_code)
                others.append(http.post("/items", json=item_body()).status_code)
        for t in pollers:
            t.join(timeout=60)
        after = httpx.get(f"{base}/events", params={"after": head, "wait_s": 1}, headers=reader, timeout=30)
    finally:
        stop_server(process)
    assert others.count(503) == 0 and set(others) <= {200, 201}, {s: others.count(s) for s in set(others)}
    assert sorted(set(polled)) == [200] and len(polled) == POLLERS, {s: polled.count(s) for s in set(polled)}
    assert busy is not None, "no long-poll was refused while the most allowed waited"
    assert_problem(busy, 429, "FEED_BUSY")
    assert busy.headers["retry-after"] == "5"
    assert plain.status_code == 200 and after.status_code == 200, (plain.text, after.text)
