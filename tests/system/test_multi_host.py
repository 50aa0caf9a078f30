"""A multi-host DATABASE_URL, as an operator writes one for a primary and its standby, in each of
the spellings libpq accepts: migrate, token create, reclaim and serve reach the writable server past
a dead one and a read-only one. And a server that turns read-only under the service (a demoted
primary) answers 503 with a stable code, /readyz 503, and the pool lets go of it."""

from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from db import roles
from tests.support.api import assert_problem, item_body
from tests.support.clusters import TcpCluster
from tests.support.servers import command, free_port, start_server, stop_server


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[TcpCluster, TcpCluster]]:
    """(writable, read-only): two clusters of their own on TCP ports."""
    writable, read_only = TcpCluster(), TcpCluster(read_only=True)
    try:
        for cluster in (writable, read_only):
            with psycopg.connect(
                cluster.url(), autocommit=True, options="-c default_transaction_read_only=off"
            ) as conn:
                roles.ensure_roles(conn)
        yield writable, read_only
    finally:
        writable.remove()
        read_only.remove()


def _spell(how: str, servers: list[str], user: str, database: str) -> str:
    hosts = [server.rsplit(":", 1) for server in servers]
    if how == "authority":
        return f"postgresql://{user}@{','.join(servers)}/{database}?target_session_attrs=read-write"
    if how == "host-port pairs":
        pairs = "&".join(f"host={server}" for server in servers)
        return f"postgresql://{user}@/{database}?{pairs}&target_session_attrs=read-write"
    return (
        f"postgresql://{user}@/{database}?host={','.join(h for h, _ in hosts)}"
        f"&port={','.join(p for _, p in hosts)}&target_session_attrs=read-write"
    )


@pytest.mark.parametrize("how", ["authority", "host-port pairs", "comma lists"])
def test_every_spelling_reaches_the_writable_server_past_a_dead_and_a_read_only_one(
    how: str, clusters: tuple[TcpCluster, TcpCluster]
) -> None:
    writable, read_only = clusters
    database = f"rq_{how.replace(' ', '_').replace('-', '_')}"
    for cluster in (writable, read_only):
        with psycopg.connect(
            cluster.url(), autocommit=True, options="-c default_transaction_read_only=off"
        ) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")
            conn.execute(f"CREATE DATABASE {database} OWNER {roles.OWNER_ROLE}")
    # Nothing listens on the first port; the second is up but read-only, as a standby is.
    servers = [f"127.0.0.1:{free_port()}", read_only.server, writable.server]
    env = {
        "DATABASE_URL": _spell(how, servers, roles.APP_ROLE, database),
        "REVIEW_QUEUE_MIGRATION_DATABASE_URL": _spell(how, servers, roles.OWNER_ROLE, database),
        "REVIEW_QUEUE_LOG_LEVEL": "WARNING",
    }
    migrated = command(env, "migrate")
    assert migrated.returncode == 0 and "schema is at head" in migrated.stdout, migrated.stderr
    tokens = {}
    for subject, role in (("ingest-bot", "ingest"), ("rita", "reviewer")):
        made = command(env, "token", "create", "--subject", subject, "--role", role)
        assert made.returncode == 0, made.stderr
        tokens[role] = {"Authorization": f"Bearer {made.stdout.strip().splitlines()[-1]}"}
    reclaimed = command(env, "reclaim", "--once")
    assert reclaimed.returncode == 0 and reclaimed.stdout.strip().endswith("reclaimed 0"), reclaimed.stderr

    process, base = start_server(env, deliverer=True)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.get("/readyz").status_code == 200
            assert http.post("/items", json=item_body(), headers=tokens["ingest"]).status_code == 201
            (item,) = http.post("/leases", json={"batch_size": 1}, headers=tokens["reviewer"]).json()["items"]
            done = http.post(
                f"/items/{item['id']}/complete",
                json={"resolution": "APPROVED", "lease_token": item["lease_token"]},
                headers=tokens["reviewer"],
            )
            assert done.status_code == 200 and done.json()["outcome"] == "resolved", done.text
    finally:
        assert stop_server(process) == 0
    with psycopg.connect(writable.url(database)) as conn:
        assert conn.execute("SELECT state FROM review_queue_item").fetchall() == [("RESOLVED",)]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h1:5432,h2:x/db",
        "postgresql://u@/db?host=h1,h2,h3&port=1,2",
        "postgresql://u@h1/db?host=h2",
    ],
)
def test_a_url_naming_no_one_list_of_servers_stops_migrate_with_a_sentence(url: str) -> None:
    result = command({"DATABASE_URL": url}, "migrate")
    assert result.returncode == 1
    assert "invalid setting DATABASE_URL" in result.stderr and "Traceback" not in result.stderr, result.stderr


def _demote(sql: psycopg.Connection, database: str) -> None:
    """What a demotion does to the service's connections: the server restarts read-only, so every
    session ends and new ones are read-only."""
    sql.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    sql.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        (database,),
    )


@pytest.mark.fresh_db("turns its database read-only and ends every session of it")
def test_a_server_turned_read_only_answers_503_then_the_pool_lets_go_of_it(
    client: TestClient, db_name: str, sql: psycopg.Connection, auth: Callable[[str, str], dict[str, str]]
) -> None:
    ingest, reviewer = auth("ingest-bot", "ingest"), auth("rita", "reviewer")
    for _ in range(2):
        assert client.post("/items", json=item_body(), headers=ingest).status_code == 201
    held = client.post("/leases", json={"batch_size": 2}, headers=reviewer).json()["items"]
    assert client.get("/readyz").status_code == 200

    _demote(sql, db_name)
    complete = f"/items/{held[0]['id']}/complete"
    body = {"resolution": "APPROVED", "lease_token": held[0]["lease_token"]}
    assert_problem(client.post(complete, json=body, headers=reviewer), 503, "DATABASE_UNAVAILABLE")
    assert_problem(client.post("/items", json=item_body(), headers=ingest), 503, "DATABASE_UNAVAILABLE")
    assert_problem(client.get("/readyz"), 503, "DATABASE_UNAVAILABLE")

    # The new leader takes writes. No restart of the service, no session terminated this time: the
    # pooled connections opened while the server was read-only must not be handed out again.
    sql.execute(f"ALTER DATABASE {db_name} RESET default_transaction_read_only")
    done = client.post(complete, json=body, headers=reviewer)
    assert done.status_code == 200 and done.json()["outcome"] == "resolved", done.text
    assert client.post("/items", json=item_body(), headers=ingest).status_code == 201
    other = held[1]
    answer = client.post(
        f"/items/{other['id']}/complete",
        json={"resolution": "APPROVED", "lease_token": other["lease_token"]},
        headers=reviewer,
    )
    assert answer.status_code == 200, answer.text
    assert client.get("/readyz").status_code == 200


@pytest.mark.fresh_db("turns its database read-only and ends every session of it")
def test_a_completion_refused_read_only_lets_go_of_the_pool_by_itself(
    client: TestClient, db_name: str, sql: psycopg.Connection, auth: Callable[[str, str], dict[str, str]]
) -> None:
    """Only completions between the demotion and the new leader (no other route, no /readyz, whose
    own refusals drop the pool too): the completion path must drop it itself."""
    ingest, reviewer = auth("ingest-bot", "ingest"), auth("rita", "reviewer")
    assert client.post("/items", json=item_body(), headers=ingest).status_code == 201
    (held,) = client.post("/leases", json={"batch_size": 1}, headers=reviewer).json()["items"]
    _demote(sql, db_name)
    complete = f"/items/{held['id']}/complete"
    body = {"resolution": "APPROVED", "lease_token": held["lease_token"]}
    for _ in range(3):  # a pool's worth of read-only sessions opened
        assert_problem(client.post(complete, json=body, headers=reviewer), 503, "DATABASE_UNAVAILABLE")
    sql.execute(f"ALTER DATABASE {db_name} RESET default_transaction_read_only")
    done = client.post(complete, json=body, headers=reviewer)
    assert done.status_code == 200 and done.json()["outcome"] == "resolved", done.text
