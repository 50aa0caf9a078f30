"""The served process facing the network: which proxies it believes, and stalled connections."""

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import start_server, stop_server


def _clients_logged(log: Path) -> list[str]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line["client"] for line in lines if line.get("event") == "http_request"]


@pytest.mark.parametrize(("allowed", "logged"), [("", "127.0.0.1"), ("127.0.0.1", "203.0.113.7")])
def test_x_forwarded_for_is_believed_only_from_configured_proxies(
    db_url: str, tmp_path: Path, allowed: str, logged: str
) -> None:
    """By default nobody, not even 127.0.0.1, chooses the address a request is logged under."""
    log = tmp_path / "server.log"
    env = {
        "DATABASE_URL": db_url,
        "REVIEW_QUEUE_LOG_FORMAT": "json",
        "REVIEW_QUEUE_LOG_LEVEL": "INFO",
        "REVIEW_QUEUE_FORWARDED_ALLOW_IPS": allowed,
    }
    process, base = start_server(env, stdout=log.open("wb"))
    try:
        response = httpx.get(f"{base}/healthz", headers={"X-Forwarded-For": "203.0.113.7"})
        assert response.status_code == 200
    finally:
        stop_server(process)
    assert _clients_logged(log)[-1] == logged, _clients_logged(log)


@pytest.fixture
def served(db_url: str) -> Iterator[str]:
    process, base = start_server({"DATABASE_URL": db_url})
    yield base
    stop_server(process)


def test_stalled_connections_do_not_starve_real_requests(
    served: str, make_token: Callable[[str, str], str]
) -> None:
    """uvicorn keeps a connection that never completes its request head (it has no header timeout;
    docs/security.md has the proxy settings that close them). What the service itself promises:
    200 such sockets, silent or stopped half-way through a header line, cost it nothing else."""
    host, port = served.removeprefix("http://").split(":")
    token = make_token("alice", "reviewer")
    with ExitStack() as stack:
        for n in range(200):
            sock = stack.enter_context(socket.create_connection((host, int(port)), timeout=5))
            if n % 2:
                sock.sendall(b"POST /leases HTTP/1.1\r\nHost: x\r\nAuthoriz")
        # Each request must get through while every stalled socket is still open (timeout: 10 s).
        with httpx.Client(base_url=served, timeout=10) as http:
            for _ in range(20):
                response = http.post("/leases", json={}, headers={"Authorization": f"Bearer {token}"})
                assert response.status_code == 200, response.text


EXPORT_EVENTS = 20_000  # about 10 MB of NDJSON: far more than a socket buffers


def _transactions_held(sql: psycopg.Connection) -> int:
    """The service's sessions of this database in an open transaction (a stalled export held one)."""
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'review-queue' AND state LIKE 'idle in transaction%'"
    ).fetchone()
    return int(row[0]) if row else 0


def _export_request(token: str) -> bytes:
    return f"GET /audit/export HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()


def _read_response(sock: socket.socket, started: bytes) -> bytes:
    """The rest of an HTTP/1.1 response whose first bytes were `started`: its whole body."""
    import h11

    parser = h11.Connection(h11.CLIENT)
    parser.send(h11.Request(method="GET", target="/audit/export", headers=[("Host", "x")]))
    parser.receive_data(started)
    body = bytearray()
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            parser.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif isinstance(event, h11.Response):
            assert event.status_code == 200, event


def test_stalled_audit_export_readers_hold_no_connection(
    db_url: str, sql: psycopg.Connection, make_token: Callable[[str, str], str]
) -> None:
    """20 auditors open the export, read a little and stop reading, with small socket buffers so
    the server must wait for them. The export reads the chain in short transactions, a page at a
    time, so waiting costs a socket, not a pooled connection: leases and /stats stay 200 (the pool
    is 10 + 5; each stalled reader held one until its client read on). A reader that reads on gets
    the whole chain as it stood when it asked, linked across the pages, and it verifies."""
    import asyncio

    from cli import reclaimer
    from db import chain
    from tests.conftest import make_settings
    from tests.db.test_audit import add_events
    from tests.support import wait_for

    add_events(sql, 1)
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'RENEWED', 'bulk-' || g, 1, trace_id FROM review_queue_item, generate_series(1, %s) g"
        " WHERE idempotency_key = 'idem-1'",
        (EXPORT_EVENTS,),
    )
    asyncio.run(reclaimer.seal_once(make_settings(db_url), db_url))
    (head,) = sql.execute("SELECT max(seq) FROM review_queue_chain").fetchone()  # type: ignore[misc]
    process, base = start_server({"DATABASE_URL": db_url})
    host, port = base.removeprefix("http://").split(":")
    auditor, reviewer = make_token("audrey", "auditor"), make_token("rita", "reviewer")
    readers: list[tuple[socket.socket, bytes]] = []
    try:
        for _ in range(20):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(60)
            sock.connect((host, int(port)))
            sock.sendall(_export_request(auditor))
            started = sock.recv(2048)  # a little: the status line and the first lines, then no more
            assert started.startswith(b"HTTP/1.1 200"), started[:300]
            readers.append((sock, started))
        # Every reader is stalled now; none holds a transaction while it does not read.
        wait_for(lambda: _transactions_held(sql) == 0, 60)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {reviewer}"}, timeout=30) as http:
            for _ in range(10):
                leased = http.post("/leases", json={"batch_size": 1})
                assert leased.status_code == 200, leased.text
                assert http.get("/stats").status_code == 200
        # The chain grows meanwhile; an export ends at the head it started from.
        add_events(sql, 5)
        asyncio.run(reclaimer.seal_once(make_settings(db_url), db_url))
        body = _read_response(*readers[0])
    finally:
        for sock, _ in readers:
            sock.close()
        stop_server(process)
    assert len(body) > 5_000_000, len(body)
    result = chain.verify_lines(body.splitlines(keepends=True))
    assert result.broken is None, result.broken
    assert (result.first_seq, result.last_seq, result.events) == (1, head, head)
