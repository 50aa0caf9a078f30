"""Through PgBouncer in transaction-pooling mode: every transaction may land on another server
connection, so nothing may depend on session state, and server-side prepared statements are off
(REVIEW_QUEUE_PREPARE_THRESHOLD=0; PgBouncer 1.18, Debian 12's, cannot track them)."""

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from api.app import create_app
from tests.support import LONG, backdate_lease, seed_items
from tests.support.api import drain_concurrently, item_body
from tests.support.postgres import libpq, make_settings
from tests.support.servers import PgBouncer, start_server, stop_server


@pytest.fixture
def bounced_url(pgbouncer: PgBouncer, db_url: str) -> str:
    return pgbouncer.url(str(make_url(db_url).database))


@pytest.fixture
def bounced_client(bounced_url: str) -> Iterator[TestClient]:
    # No release cool-off: ann releases and leases the same items again, round after round.
    settings = make_settings(bounced_url, prepare_threshold=0, release_cooldown_s=0)
    with TestClient(create_app(settings)) as client:
        yield client


def test_concurrent_reviewers_through_pgbouncer_resolve_every_item_once(
    bounced_url: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    process, base = start_server(
        {"DATABASE_URL": bounced_url, "REVIEW_QUEUE_PREPARE_THRESHOLD": "0"}, workers=2
    )
    try:
        drain_concurrently(base, make_token, sql, total=1000 if LONG else 300, clients=12)
    finally:
        stop_server(process)


def test_lease_complete_reclaim_through_pgbouncer(
    bounced_client: TestClient, auth: Callable[[str, str], dict[str, str]], sql: psycopg.Connection
) -> None:
    seed_items(sql, 4)
    ann, bob, admin = auth("ann", "reviewer"), auth("bob", "reviewer"), auth("root", "admin")
    # Enough requests to pass psycopg's default prepare threshold (5) many times over: with
    # preparing on, the second transaction on another server connection would fail.
    for _ in range(3):
        items = bounced_client.post("/leases", json={"batch_size": 2}, headers=ann).json()["items"]
        assert len(items) == 2
        for item in items:
            assert bounced_client.post(f"/items/{item['id']}/release", headers=ann).status_code == 200
    held = bounced_client.post("/leases", json={"batch_size": 4}, headers=ann).json()["items"]
    assert len(held) == 4
    done = bounced_client.post(
        f"/items/{held[0]['id']}/complete", json={"resolution": "APPROVED"}, headers=ann
    )
    assert done.json()["outcome"] == "resolved"
    again = bounced_client.post(
        f"/items/{held[0]['id']}/complete", json={"resolution": "APPROVED"}, headers=ann
    )
    assert again.json()["outcome"] == "already_resolved"
    backdate_lease(sql, held[1]["id"])
    reclaimed = bounced_client.post("/admin/reclaim", headers=admin).json()
    assert reclaimed["reclaimed"] == 1
    late = bounced_client.post(
        f"/items/{held[1]['id']}/complete", json={"resolution": "APPROVED"}, headers=ann
    )
    assert late.status_code == 409
    assert late.json()["code"] == "LEASE_NOT_HELD"
    again_leased = bounced_client.post("/leases", json={"batch_size": 4}, headers=bob).json()["items"]
    assert [i["id"] for i in again_leased] == [held[1]["id"]]
    states = dict(sql.execute("SELECT state, count(*) FROM review_queue_item GROUP BY state").fetchall())
    assert states == {"RESOLVED": 1, "ASSIGNED": 3}


def server_connections(sql: psycopg.Connection) -> set[int]:
    """The PgBouncer server connections to the test database (every backend but `sql`'s own)."""
    rows = sql.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchall()
    return {int(pid) for (pid,) in rows}


def settings_on_every_server_connection(
    bounced_url: str,
    sql: psycopg.Connection,
    pids: set[int],
    *,
    statement: str | None = None,
    everywhere: bool = False,
) -> dict[int, tuple[str, str]]:
    """lock_timeout and statement_timeout as each of `pids` (all idle PgBouncer server connections)
    sees them. As many client transactions are held open at once as there are server connections,
    so PgBouncer must hand each of them a different one: every server connection is looked at,
    whichever PgBouncer would have handed back next. `statement` runs after the read, on the first
    connection or on all of them."""
    seen: dict[int, tuple[str, str]] = {}
    with contextlib.ExitStack() as stack:
        for n in range(len(pids)):
            conn = stack.enter_context(psycopg.connect(libpq(bounced_url), prepare_threshold=None))
            pid, lock, stmt = conn.execute(  # opens a transaction: the server connection stays ours
                "SELECT pg_backend_pid(), current_setting('lock_timeout'),"
                " current_setting('statement_timeout')"
            ).fetchone()  # type: ignore[misc]
            if statement and (everywhere or n == 0):
                conn.execute(statement)
            seen[pid] = (lock, stmt)
    # Leaving the stack commits and closes them all, only now. A server connection that ended
    # meanwhile (PgBouncer may close one) holds no setting any more; every other one was looked at.
    left = pids & server_connections(sql)
    assert set(seen) >= left, f"server connections not looked at: {left - set(seen)}"
    return seen


@pytest.mark.fresh_db("counts every backend of its database as a PgBouncer server connection")
def test_no_session_state_leaks_through_pgbouncer(
    bounced_client: TestClient,
    bounced_url: str,
    auth: Callable[[str, str], dict[str, str]],
    sql: psycopg.Connection,
) -> None:
    seed_items(sql, 40)
    ann = auth("ann", "reviewer")
    with ThreadPoolExecutor(4) as pool:  # concurrent requests, so PgBouncer opens several server connections
        statuses = list(
            pool.map(
                lambda _: bounced_client.post("/leases", json={"batch_size": 2}, headers=ann).status_code,
                range(20),
            )
        )
    assert statuses == [200] * 20, statuses
    pids = server_connections(sql)
    assert pids, "no server connection to check"
    # The API's lock_timeout and statement_timeout were transaction-local (SET LOCAL): gone from every
    # server connection the API's transactions ran on, whichever PgBouncer hands out next.
    clean = settings_on_every_server_connection(bounced_url, sql, pids)
    assert clean and set(clean.values()) == {("0", "0")}, clean

    # The check sees a leak: a session-level SET on one server connection is found there, and only there.
    settings_on_every_server_connection(bounced_url, sql, pids, statement="SET lock_timeout = 1234")
    leaked = settings_on_every_server_connection(bounced_url, sql, pids)
    assert sorted(v for v in leaked.values() if v != ("0", "0")) == [("1234ms", "0")], leaked
    settings_on_every_server_connection(bounced_url, sql, pids, statement="RESET ALL", everywhere=True)


WAIT_S = 20  # a lease's wait; "promptly" means well inside it, not a tuned wall-clock bound


def waited_lease(client: TestClient, headers: dict[str, str], enqueue: Callable[[], object]) -> float:
    """Seconds a `POST /leases` with `wait_s` took to hand over the item `enqueue` adds while it waits."""
    signal = client.app.state.work_signal  # type: ignore[attr-defined]
    answer: dict[str, Any] = {}
    started = time.monotonic()
    waiter = threading.Thread(
        target=lambda: answer.update(r=client.post("/leases", json={"wait_s": WAIT_S}, headers=headers))
    )
    waiter.start()
    wait_until(lambda: signal.waiters == 1, "the lease waiting")
    enqueue()
    waiter.join(timeout=WAIT_S + 10)
    assert len(answer["r"].json()["items"]) == 1, answer["r"].text
    return time.monotonic() - started


def wait_until(condition: Callable[[], Any], what: str, within_s: float = 30.0) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {within_s} s")


def test_a_listener_behind_pgbouncer_knows_it_is_deaf_leaves_no_backend_listening_and_leases_poll(
    bounced_url: str, auth: Callable[[str, str], dict[str, str]], sql: psycopg.Connection
) -> None:
    # Its LISTEN went to a server connection PgBouncer lends to others: it would never hear a NOTIFY,
    # and that backend would collect them unread. Found, the backend goes and waiting leases poll.
    settings = make_settings(bounced_url, prepare_threshold=0, poll_interval_ms=200)
    with TestClient(create_app(settings)) as client:
        signal = client.app.state.work_signal  # type: ignore[attr-defined]
        wait_until(lambda: signal.deaf, "the listener found deaf")
        assert not signal.listening
        assert signal.backend_pid
        wait_until(
            lambda: (
                not sql.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (signal.backend_pid,)
                ).fetchone()
            ),
            "the backend that took the LISTEN terminated",
        )
        took = waited_lease(client, auth("ann", "reviewer"), lambda: seed_items(sql, 1))
        assert took < WAIT_S / 2, f"the lease took {took:.1f} s of its {WAIT_S} s: nothing polled"


def test_a_listener_on_its_own_direct_url_wakes_leases_served_through_pgbouncer(
    bounced_url: str, db_url: str, auth: Callable[[str, str], dict[str, str]], sql: psycopg.Connection
) -> None:
    # The longest poll interval: a listening process does not poll, so only the NOTIFY can explain
    # an answer well inside the wait.
    settings = make_settings(
        bounced_url, prepare_threshold=0, poll_interval_ms=5_000, listen_database_url=db_url
    )
    with TestClient(create_app(settings)) as client:
        signal = client.app.state.work_signal  # type: ignore[attr-defined]
        wait_until(lambda: signal.listening, "the listener up")
        admin = auth("ada", "admin")
        took = waited_lease(
            client,
            auth("ann", "reviewer"),
            lambda: client.post("/items", json=item_body(), headers=admin).raise_for_status(),
        )
        assert took < WAIT_S / 2, f"the lease took {took:.1f} s of its {WAIT_S} s: the NOTIFY was lost"
        assert not signal.deaf
