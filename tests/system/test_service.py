"""The API as a real process: JSON logs, the database going away and coming back, graceful shutdown."""

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

from tests.support import backdate_lease, lock_waiters, wait_for
from tests.support.api import assert_problem, item_body
from tests.support.postgres import libpq
from tests.support.servers import OwnPostgres, start_server, stop_server


def test_log_lines_are_json_with_the_seed_fields(
    db_url: str, make_token: Callable[[str, str], str], sql: psycopg.Connection, tmp_path: Path
) -> None:
    out = tmp_path / "server.log"
    process, base = start_server(
        {"DATABASE_URL": db_url, "REVIEW_QUEUE_LOG_FORMAT": "json", "REVIEW_QUEUE_LOG_LEVEL": "INFO"},
        stdout=out.open("wb"),
    )
    admin = {"Authorization": f"Bearer {make_token('ops', 'admin')}"}
    alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    try:
        with httpx.Client(base_url=base) as http:
            http.post("/items", json=item_body(), headers=admin)
            http.post("/items", json=item_body(), headers=admin)
            one, two = http.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]
            http.post(f"/items/{one['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)
            http.post(f"/items/{one['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)  # no-op
            backdate_lease(sql, two["id"])
            http.post("/admin/reclaim", headers={**admin, "X-Request-ID": "reclaim-42"})
    finally:
        stop_server(process)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]  # every line is JSON
    by_event: dict[str, list[dict]] = {}
    for line in lines:
        by_event.setdefault(line["event"], []).append(line)
    seed = {"trace_id", "source_hash", "match_decision", "item_id"}
    for name in ("review_item_leased", "review_item_resolved", "review_item_completion_noop"):
        assert by_event.get(name), f"no {name} line"
        for line in by_event[name]:
            assert seed <= set(line) and line["worker_id"] == "alice", line
    (reclaimed,) = by_event["review_item_lease_reclaimed"]
    assert seed <= set(reclaimed) and reclaimed["level"] == "warning" and reclaimed["item_id"] == two["id"]
    assert reclaimed["request_id"] == "reclaim-42"
    assert by_event["review_item_completion_noop"][0]["reason"] == "already_resolved"
    access = by_event["http_request"]
    assert len(access) >= 6 and all(
        {"method", "route", "status", "duration_ms", "request_id"} <= set(a) for a in access
    )


def test_database_down_is_a_fast_503_and_recovers_without_restart(
    own_postgres: OwnPostgres, make_token_on: Callable[[str, str, str], str]
) -> None:
    token = make_token_on(own_postgres.url, "alice", "reviewer")
    headers = {"Authorization": f"Bearer {token}"}
    connect_timeout_s, pool_timeout_ms = 2, 1000
    process, base = start_server(
        {
            "DATABASE_URL": own_postgres.url,
            "REVIEW_QUEUE_TOKEN_CACHE_S": "0",
            "REVIEW_QUEUE_CONNECT_TIMEOUT_S": str(connect_timeout_s),
            "REVIEW_QUEUE_POOL_TIMEOUT_MS": str(pool_timeout_ms),
        }
    )
    # "Fast" is a ratio of what the service is configured to wait, not a number tuned on an idle box;
    # a request that hung on the dead database would run into the client's much longer timeout.
    fast_s = 5 * (connect_timeout_s + pool_timeout_ms / 1000)
    try:
        with httpx.Client(base_url=base, timeout=4 * fast_s) as http:
            assert http.post("/leases", headers=headers).status_code == 200
            own_postgres.stop()
            started = time.monotonic()
            down = http.post("/leases", headers=headers)
            elapsed = time.monotonic() - started
            assert_problem(down, 503, "DATABASE_UNAVAILABLE")
            assert elapsed < fast_s, f"503 took {elapsed:.2f} s"
            assert down.headers["retry-after"]
            assert_problem(http.get("/readyz"), 503, "DATABASE_UNAVAILABLE")
            assert http.get("/healthz").status_code == 200

            own_postgres.start()
            assert http.post("/leases", headers=headers).status_code == 200, "the next lease must succeed"
            assert http.get("/readyz").status_code == 200
    finally:
        stop_server(process)


def test_sigterm_finishes_in_flight_requests(
    db_url: str, make_token: Callable[[str, str], str], tmp_path: Path
) -> None:
    # The lease below waits for a table lock for as long as the test holds it (up to a minute).
    process, base = start_server({"DATABASE_URL": db_url, "REVIEW_QUEUE_PG_LOCK_TIMEOUT_MS": "60000"})
    headers = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    result: dict = {}

    def refused() -> bool:
        try:
            httpx.get(f"{base}/healthz", timeout=5)
        except httpx.TransportError:
            return True
        return False

    with psycopg.connect(libpq(db_url)) as locker, psycopg.connect(libpq(db_url), autocommit=True) as sql:
        httpx.post(f"{base}/leases", headers=headers)  # warm the token cache and the pool
        locker.execute("LOCK TABLE review_queue_item IN ACCESS EXCLUSIVE MODE")
        request = threading.Thread(
            target=lambda: result.update(r=httpx.post(f"{base}/leases", headers=headers, timeout=120))
        )
        request.start()
        wait_for(lambda: lock_waiters(sql) == 1, 60)  # the lease is in flight, waiting for the lock
        process.send_signal(signal.SIGTERM)
        # Shutting down: no new connections are taken, but the server stays up for the one in flight.
        wait_for(refused, 60)
        assert process.poll() is None, "the server must wait for the request in flight"
        assert request.is_alive()
        locker.rollback()
        request.join(timeout=60)
    assert result["r"].status_code == 200
    assert process.wait(timeout=60) == 0
