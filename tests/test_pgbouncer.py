"""Through PgBouncer in transaction-pooling mode: every transaction may land on another server
connection, so nothing may depend on session state, and server-side prepared statements are off
(REVIEW_QUEUE_PREPARE_THRESHOLD=0; PgBouncer 1.18, Debian 12's, cannot track them)."""

from collections.abc import Callable, Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from api.app import create_app
from tests.api.test_concurrency_http import drain_concurrently
from tests.conftest import LONG, PgBouncer, libpq, make_settings, start_server, stop_server
from tests.support import backdate_lease, seed_items


@pytest.fixture
def bounced_url(pgbouncer: PgBouncer, db_url: str) -> str:
    return pgbouncer.url(str(make_url(db_url).database))


@pytest.fixture
def bounced_client(bounced_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(bounced_url, prepare_threshold=0))) as client:
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


def test_no_session_state_leaks_through_pgbouncer(
    bounced_client: TestClient,
    bounced_url: str,
    auth: Callable[[str, str], dict[str, str]],
    sql: psycopg.Connection,
) -> None:
    seed_items(sql, 40)
    ann = auth("ann", "reviewer")
    for _ in range(20):
        assert bounced_client.post("/leases", json={"batch_size": 2}, headers=ann).status_code == 200
    # Whatever server connection PgBouncer hands out next, the API's lock_timeout and
    # statement_timeout were transaction-local (SET LOCAL) and are gone.
    with psycopg.connect(libpq(bounced_url), prepare_threshold=None, autocommit=True) as conn:
        for _ in range(20):
            assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
