"""The served process facing the network: which proxies it believes, and stalled connections."""

import csv
import fcntl
import io
import json
import socket
import struct
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support import wait_for
from tests.support.servers import start_server, stop_server


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

    from db import chain
    from tests.support import wait_for
    from tests.support.audit import add_events, seal

    add_events(sql, 1)
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'RENEWED', 'bulk-' || g, 1, trace_id FROM review_queue_item, generate_series(1, %s) g"
        " WHERE idempotency_key = 'idem-1'",
        (EXPORT_EVENTS,),
    )
    seal(db_url)
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
        seal(db_url)
        body = _read_response(*readers[0])
    finally:
        for sock, _ in readers:
            sock.close()
        stop_server(process)
    assert len(body) > 5_000_000, len(body)
    result = chain.verify_lines(body.splitlines(keepends=True))
    assert result.broken is None, result.broken
    assert (result.first_seq, result.last_seq, result.events) == (1, head, head)


# --- the decisions export and clients that stop reading -------------------------------------

DECISIONS = 40_000  # about 12 MB of CSV: more than the kernel buffers on both ends can hold
STALLED = 3


def _bulk_decisions(sql_url: str, count: int) -> None:
    with psycopg.connect(sql_url, autocommit=True) as sql:
        sql.execute(
            """
            WITH item AS (
                INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount,
                    match_decision, source_hash, state, resolution, resolution_note, resolved_by,
                    resolved_at, leased_by, leased_at, created_at, due_at)
                SELECT 'bulk-' || i, 'ACME-CORP', -12.50, 'PARTIAL', 'sha256:' || md5(i::text),
                       'RESOLVED', 'MATCH_CONFIRMED', 'a note long enough to make rows realistic', 'alice',
                       now() - interval '1 hour' + i * interval '1 millisecond', 'alice',
                       now() - interval '2 hours', now() - interval '3 hours', now()
                FROM generate_series(1, %s) AS i
                RETURNING id, trace_id, resolved_at, resolution_note
            )
            INSERT INTO review_queue_event (item_id, event, actor, at, lease_epoch, trace_id, details)
            SELECT id, 'RESOLVED', 'alice', resolved_at, 1, trace_id,
                   jsonb_build_object('resolution', 'MATCH_CONFIRMED', 'note', resolution_note)
            FROM item
            """,
            (count,),
        )


def _stalled_download(host: str, port: int, path: str, token: str) -> tuple[socket.socket, bytes]:
    """A client that asks for the export, takes its first bytes, and then reads nothing more."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    first = sock.recv(1024)
    assert first.startswith(b"HTTP/1.1 200 "), f"the export did not start: {first!r}"
    return sock, first


def _waiting_bytes(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def _busy_sessions(sql_url: str) -> list[tuple[str, str]]:
    """The service's sessions running a statement or inside a transaction: (state, query)."""
    with psycopg.connect(sql_url, autocommit=True) as sql:
        rows = sql.execute(
            "SELECT state, query FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'review-queue' AND state <> 'idle' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [(str(state), str(query)) for state, query in rows]


def test_clients_that_stop_reading_an_export_hold_no_connection(
    db_url: str, superuser_url: str, make_token: Callable[[str, str], str]
) -> None:
    """The API with ONE pooled connection: three downloads of a 40,000-row export stall once the
    socket buffers are full, and meanwhile every other request is served (it would be a fast 503 if
    a stalled download held the connection, as a transaction streamed with a cursor would); no
    transaction stays open. Then the downloads resume and each is whole."""
    from tests.support.postgres import libpq

    sql_url = libpq(superuser_url)
    _bulk_decisions(sql_url, DECISIONS)
    process, base = start_server(
        {"DATABASE_URL": db_url, "REVIEW_QUEUE_POOL_SIZE": "1", "REVIEW_QUEUE_POOL_MAX_OVERFLOW": "0"}
    )
    auditor, reviewer = make_token("audrey", "auditor"), make_token("alice", "reviewer")
    host, port = base.removeprefix("http://").split(":")
    today = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400))
    later = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 2 * 86400))
    path = f"/reports/decisions.csv?from={today}&to={later}"
    try:
        with ExitStack() as stack:
            downloads = [_stalled_download(host, int(port), path, auditor) for _ in range(STALLED)]
            stalled = [stack.enter_context(sock) for sock, _ in downloads]

            # Stalled: what each client has waiting stops growing, and the server fills its own send
            # buffers and stops too, blocked in its send. An export holding a transaction (a cursor)
            # never gets here: its session stays "idle in transaction".
            def settled() -> bool:
                before = [_waiting_bytes(s) for s in stalled]
                time.sleep(1)
                still = all(b > 0 for b in before) and [_waiting_bytes(s) for s in stalled] == before
                return still and _busy_sessions(sql_url) == []

            wait_for(settled, timeout=90)
            with httpx.Client(base_url=base, timeout=30) as http:
                for _ in range(20):
                    response = http.get("/stats", headers={"Authorization": f"Bearer {reviewer}"})
                    assert response.status_code == 200, response.text
            assert _busy_sessions(sql_url) == []

            for sock, first in downloads:  # read on: each download is whole, in order, and ends properly
                sock.settimeout(60)
                data = first
                while not data.endswith(b"\r\n0\r\n\r\n"):
                    chunk = sock.recv(1 << 16)
                    assert chunk, "the server closed a download before its end"
                    data += chunk
                body = _dechunked(data.split(b"\r\n\r\n", 1)[1])
                rows = list(csv.reader(io.StringIO(body.decode(), newline="")))
                header, *rows = rows
                assert len(rows) == DECISIONS
                at, event = header.index("resolved_at"), header.index("event_id")
                keys = [(datetime.fromisoformat(r[at]), int(r[event])) for r in rows]
                assert keys == sorted(keys) and len(set(keys)) == DECISIONS
    finally:
        stop_server(process)


def _dechunked(data: bytes) -> bytes:
    out, rest = [], data
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return b"".join(out)
        out.append(rest[:size])
        rest = rest[size + 2 :]
