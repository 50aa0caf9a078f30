"""The auditor role and the chain's export: streamed in chain order, verified offline, any byte
changed and it fails."""

import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from db import audit, chain
from tests.support.api import Auth, assert_problem, item_body
from tests.support.audit import seal
from tests.support.cli import completed, invoke
from tests.support.postgres import libpq


def make_history(client: TestClient, auth: Auth, db_url: str, items: int = 4) -> int:
    """Items enqueued, leased and resolved through the API, then sealed; returns the head seq."""
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    for _ in range(items):
        assert client.post("/items", json=item_body(), headers=admin).status_code == 201
    for item in client.post("/leases", json={"batch_size": items}, headers=alice).json()["items"]:
        body = {"resolution": "APPROVED", "note": "FX rounding: €0.01 ✓"}
        assert client.post(f"/items/{item['id']}/complete", json=body, headers=alice).status_code == 200
    seal(db_url)
    with psycopg.connect(libpq(db_url)) as conn:
        result = audit.verify(conn)
    assert result.broken is None and result.head_seq == 3 * items
    return result.head_seq


def test_an_auditor_reads_but_changes_nothing(client: TestClient, auth: Auth, db_url: str) -> None:
    make_history(client, auth, db_url, items=2)
    audrey = auth("audrey", "auditor")
    items = client.get("/items", headers=audrey).json()["items"]
    assert len(items) == 2 and all(i["lease_token"] is None for i in items)
    assert client.get(f"/items/{items[0]['id']}/events", headers=audrey).status_code == 200
    assert client.get("/stats", headers=audrey).status_code == 200
    assert client.get("/audit/export", headers=audrey).status_code == 200
    for method, path, body in (
        ("POST", "/items", item_body()),
        ("POST", "/leases", {}),
        ("POST", f"/items/{items[0]['id']}/complete", {"resolution": "APPROVED"}),
        ("POST", "/admin/reclaim", {}),
        ("GET", "/metrics", None),
    ):
        assert_problem(client.request(method, path, json=body, headers=audrey), 403, "FORBIDDEN")


def test_export_round_trip_verifies_offline_and_any_changed_byte_fails(
    client: TestClient, auth: Auth, db_url: str
) -> None:
    head = make_history(client, auth, db_url)
    response = client.get("/audit/export", headers=auth("audrey", "auditor"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = response.content.splitlines(keepends=True)
    assert len(lines) == head
    with psycopg.connect(libpq(db_url)) as conn:
        expected_head = conn.execute("SELECT hash FROM review_queue_chain WHERE seq = %s", (head,)).fetchone()
    result = chain.verify_lines(lines, against=(head, bytes(expected_head[0])))  # type: ignore[index]
    assert (result.broken, result.first_seq, result.last_seq, result.events) == (None, 1, head, head)

    data = response.content
    # Flip one bit of every byte in turn (the first two lines, and the last byte): each must fail.
    for position in [*range(len(lines[0]) + len(lines[1])), len(data) - 1]:
        changed = bytearray(data)
        changed[position] ^= 0x01
        broken = chain.verify_lines(bytes(changed).splitlines(keepends=True)).broken
        assert broken is not None, (
            f"flipping byte {position} ({data[position : position + 1]!r}) went unnoticed"
        )


def test_a_range_verifies_on_its_own_with_the_link_into_it(
    client: TestClient, auth: Auth, db_url: str
) -> None:
    head = make_history(client, auth, db_url)
    audrey = auth("audrey", "auditor")
    whole = client.get("/audit/export", headers=audrey).content.splitlines(keepends=True)
    part = client.get("/audit/export", params={"from": 4, "to": 9}, headers=audrey).content.splitlines(
        keepends=True
    )
    assert part == whole[3:9]
    result = chain.verify_lines(part)
    assert (result.broken, result.first_seq, result.last_seq) == (None, 4, 9)
    # Dropping a line from the middle, or reordering two, is caught.
    assert chain.verify_lines(part[:2] + part[3:]).broken == chain.Break(
        6, "missing", "line 3 has seq 7 after seq 5"
    )
    swapped = chain.verify_lines([part[0], part[2], part[1], *part[3:]]).broken
    assert swapped is not None and swapped.seq == 5
    # Beyond the head: the stream ends at the head.
    assert len(client.get("/audit/export", params={"from": head}, headers=audrey).content.splitlines()) == 1


@pytest.mark.parametrize("params", [{"from": 0}, {"to": 0}, {"from": "x"}, {"from": 2**63}])
def test_export_refuses_a_bad_range(client: TestClient, auth: Auth, params: dict[str, object]) -> None:
    assert_problem(
        client.get("/audit/export", params=params, headers=auth("ada", "admin")), 422, "VALIDATION_ERROR"
    )


def test_cli_export_and_offline_verify(client: TestClient, auth: Auth, db_url: str, tmp_path: Path) -> None:
    head = make_history(client, auth, db_url, items=3)
    export = tmp_path / "export.ndjson"

    def cli(*args: str, url: str = db_url) -> subprocess.CompletedProcess[str]:
        return completed(invoke(url, "audit", *args), "audit", *args)

    result = cli("export", "--from", "1", "--file", str(export))
    assert result.returncode == 0, result.stderr
    assert f"exported {head} events" in result.stdout
    stored_head = cli("head").stdout.strip()
    # Offline: no database at all (an address nothing listens on).
    offline = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    ok = cli("verify", "--file", str(export), "--against", stored_head, url=offline)
    assert ok.returncode == 0, ok.stderr
    assert f"verified {head} events" in ok.stdout and f"head {stored_head}" in ok.stdout
    data = bytearray(export.read_bytes())
    data[len(data) // 2] ^= 0x01
    export.write_bytes(bytes(data))
    bad = cli("verify", "--file", str(export), url=offline)
    assert bad.returncode == 1 and "BROKEN at seq" in bad.stderr


def test_a_client_leaving_mid_export_releases_its_transaction(
    live_server: str,
    sql: psycopg.Connection,
    db_url: str,
    make_token: Callable[[str, str], str],
    db_name: str,
) -> None:
    import time

    import httpx

    from tests.support.audit import add_events

    add_events(sql, 1)
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'RENEWED', 'bulk-' || g, 1, trace_id FROM review_queue_item, generate_series(1, 3000) g"
        " WHERE idempotency_key = 'idem-1'"
    )
    seal(db_url)
    headers = {"Authorization": f"Bearer {make_token('audrey', 'auditor')}"}

    def open_transactions() -> int:
        (count,) = sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state LIKE 'idle in transaction%%'",
            (db_name,),
        ).fetchone()  # type: ignore[misc]
        return int(count)

    with httpx.stream("GET", f"{live_server}/audit/export", headers=headers, timeout=30) as response:
        assert response.status_code == 200
        first = next(response.iter_bytes())
        assert first.startswith(b'{"event":')
    # Pages are read in short transactions of their own, and the server may still be reading a
    # few after the client left (it learns of the leaving late on a loaded machine): what must come
    # is a lasting quiet, a second without any open transaction, never one held open.
    deadline, quiet = time.monotonic() + 30, 0
    while quiet < 10 and time.monotonic() < deadline:
        quiet = quiet + 1 if open_transactions() == 0 else 0
        time.sleep(0.1)
    assert quiet >= 10, "the export's transaction stayed open after the client left"
