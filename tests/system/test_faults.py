"""Faults, with real processes and a real PostgreSQL: reviewers killed mid-review, the database
restarted under load, and an acknowledgement lost after the commit."""

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from client import ReviewQueueClient
from tests.support import LONG, backdate_lease, seed_items, wait_for
from tests.support.api import item_body
from tests.support.postgres import libpq
from tests.support.servers import OwnPostgres, start_reclaimer, start_server, stop_server

# A reviewer script: leases, "reviews" each item for a while, completes it; the test kills some
# of these with SIGKILL while they hold leases.
# Each lease it takes is printed (id and token), so the test can replay a dead reviewer's call.
REVIEWER = """
import json, sys, time, httpx
base, token, review_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
    while True:
        items = http.post("/leases", json={"batch_size": 5}).json()["items"]
        if not items:
            break
        for item in items:
            print(json.dumps({"id": item["id"], "lease_token": item["lease_token"]}), flush=True)
        for item in items:
            time.sleep(review_s)
            body = {"resolution": "APPROVED", "lease_token": item["lease_token"]}
            http.post(f"/items/{item['id']}/complete", json=body)
"""


def in_state(sql: psycopg.Connection, state: str) -> int:
    return int(sql.execute("SELECT count(*) FROM review_queue_item WHERE state = %s", (state,)).fetchone()[0])


def resolved_once(sql: psycopg.Connection, total: int) -> None:
    """Every item RESOLVED, each with exactly one RESOLVED event: nothing lost, nothing twice."""
    states = dict(sql.execute("SELECT state, count(*) FROM review_queue_item GROUP BY state").fetchall())
    assert states == {"RESOLVED": total}, states
    events = sql.execute(
        "SELECT count(*), count(DISTINCT item_id) FROM review_queue_event WHERE event = 'RESOLVED'"
    ).fetchone()
    assert events == (total, total), f"RESOLVED events / items: {events}"


@pytest.fixture
def api(db_url: str) -> Iterator[str]:
    process, base = start_server({"DATABASE_URL": db_url}, workers=2)
    yield base
    stop_server(process)


def test_reviewers_killed_mid_review_lose_nothing(
    db_url: str, make_token: Callable[[str, str], str], sql: psycopg.Connection, tmp_path: Path
) -> None:
    total, doomed = (300, 6) if LONG else (60, 3)
    seed_items(sql, total)
    process, api = start_server({"DATABASE_URL": db_url}, workers=2)
    try:
        tokens = [make_token(f"doomed-{n}", "reviewer") for n in range(doomed)]
        logs = [tmp_path / f"doomed-{n}.jsonl" for n in range(doomed)]
        victims = [
            subprocess.Popen([sys.executable, "-c", REVIEWER, api, token, "0.2"], stdout=log.open("wb"))
            for token, log in zip(tokens, logs, strict=True)
        ]
        # Kill each victim while it holds a batch it has only partly completed.
        wait_for(lambda: in_state(sql, "RESOLVED") >= doomed, 60)
        for victim in victims:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
    finally:
        # SIGTERM makes the server finish what the victims had in flight before it exits, so what the
        # database holds now is final: nothing of theirs can still commit behind the counts below.
        assert stop_server(process) == 0
    held = {
        item_id: holder
        for item_id, holder in sql.execute(
            "SELECT id::text, leased_by FROM review_queue_item"
            " WHERE state = 'ASSIGNED' AND leased_by LIKE 'doomed-%'"
        ).fetchall()
    }
    assert held, "the victims died holding nothing: the test proves nothing"
    # A lease a dead reviewer still holds, with the token it was given: its "late completion" below.
    leases = {
        lease["id"]: (f"doomed-{n}", tokens[n], lease["lease_token"])
        for n, log in enumerate(logs)
        for lease in map(json.loads, log.read_text().splitlines())
    }
    zombie_item = min(held)
    zombie, zombie_bearer, zombie_lease = leases[zombie_item]
    assert held[zombie_item] == zombie

    process, api = start_server({"DATABASE_URL": db_url})
    try:
        # Their leases run out (by the database clock) and the reclaimer, a real process, takes them back.
        backdate_lease(sql)
        reclaimer = start_reclaimer(db_url, tmp_path / "reclaimer.log")
        try:
            wait_for(lambda: in_state(sql, "ASSIGNED") == 0, 60)
        finally:
            reclaimer.send_signal(signal.SIGTERM)
            assert reclaimer.wait(timeout=60) == 0
        reclaimed = dict(
            sql.execute(
                "SELECT item_id::text, details->>'previous_holder' FROM review_queue_event"
                " WHERE event = 'RECLAIMED'"
            ).fetchall()
        )
        assert reclaimed == held, "the reclaimer must return exactly what the dead reviewers held"

        # Someone else leases the reclaimed items (they are the oldest pending ones) ...
        with ReviewQueueClient(api, make_token("successor", "reviewer")) as successor:
            taken = successor.lease(len(held))
            assert {str(i.id) for i in taken} == set(held), "the reclaimed items are first in line"
            # ... and the dead reviewer's late completion, with its own token, is refused and changes nothing.
            before = sql.execute("SELECT count(*), max(id) FROM review_queue_event").fetchone()
            with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {zombie_bearer}"}) as http:
                late = http.post(
                    f"/items/{zombie_item}/complete",
                    json={"resolution": "APPROVED", "lease_token": zombie_lease},
                )
            assert late.status_code == 409 and late.json()["code"] == "LEASE_NOT_HELD", late.text
            assert sql.execute("SELECT count(*), max(id) FROM review_queue_event").fetchone() == before
            row = sql.execute(
                "SELECT state, leased_by FROM review_queue_item WHERE id = %s", (zombie_item,)
            ).fetchone()
            assert row == ("ASSIGNED", "successor"), row
            for item in taken:
                done = successor.complete(item.id, "APPROVED", lease_token=item.lease_token)
                assert done.outcome == "resolved", done

        survivors = [
            subprocess.Popen(
                [sys.executable, "-c", REVIEWER, api, make_token(f"survivor-{n}", "reviewer"), "0"],
                stdout=subprocess.DEVNULL,
            )
            for n in range(3)
        ]
        for survivor in survivors:
            assert survivor.wait(timeout=300) == 0
    finally:
        assert stop_server(process) == 0

    resolved_once(sql, total)
    resolvers = dict(
        sql.execute("SELECT item_id::text, actor FROM review_queue_event WHERE event = 'RESOLVED'").fetchall()
    )
    assert {i: resolvers[i] for i in held} == dict.fromkeys(held, "successor")


def test_database_restart_under_load_loses_nothing_and_never_500s(
    own_postgres: OwnPostgres, make_token_on: Callable[[str, str, str], str]
) -> None:
    total, clients = (600, 8) if LONG else (200, 6)
    with psycopg.connect(libpq(own_postgres.url), autocommit=True) as sql:
        seed_items(sql, total)
    tokens = [make_token_on(own_postgres.url, f"reviewer-{n}", "reviewer") for n in range(clients)]
    process, base = start_server({"DATABASE_URL": own_postgres.url}, workers=2)
    statuses: Counter[int] = Counter()

    def call(
        http: httpx.Client, path: str, body: dict[str, object] | None = None, method: str = "POST"
    ) -> dict:
        # Retry on 503 (and on a refused connection), as the README tells clients to.
        while True:
            response = http.request(method, path, json=body)
            statuses[response.status_code] += 1
            if response.status_code != 503:
                assert response.status_code == 200, response.text
                return dict(response.json())
            time.sleep(0.2)

    def reviewer(token: str) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            while True:
                items = call(http, "/leases", {"batch_size": 3})["items"]
                if not items:
                    # A lease whose answer was lost in the restart is still ours: find it, as a
                    # reloaded UI would, and finish it.
                    items = call(http, "/items?state=ASSIGNED&leased_by=me", method="GET")["items"]
                    if not items:
                        return
                for item in items:
                    outcome = call(http, f"/items/{item['id']}/complete", {"resolution": "APPROVED"})[
                        "outcome"
                    ]
                    assert outcome in ("resolved", "already_resolved")

    threads = [threading.Thread(target=reviewer, args=(t,)) for t in tokens]
    try:
        for t in threads:
            t.start()
        with psycopg.connect(libpq(own_postgres.url), autocommit=True) as sql:
            wait_for(lambda: in_state(sql, "RESOLVED") >= total // 4, 60)
        own_postgres.stop()  # fast shutdown: every connection dies, in-flight transactions roll back
        # Down until the clients have surely met it (a 503), however slowly this machine runs them.
        wait_for(lambda: statuses[503] > 0, 120)
        own_postgres.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a reviewer hung"
    finally:
        stop_server(process)

    assert statuses[503] > 0, f"the restart was never seen: {statuses}"
    assert set(statuses) <= {200, 503}, statuses  # never a 500
    with psycopg.connect(libpq(own_postgres.url), autocommit=True) as sql:
        resolved_once(sql, total)


class DropFirstResponse:
    """A TCP proxy that forwards requests, but for the first `drops` responses waits until the
    server has answered (so the server has committed) and then closes the client's connection
    without passing the answer on: the acknowledgement is lost after the commit."""

    def __init__(self, upstream: str, drops: int = 1) -> None:
        url = httpx.URL(upstream)
        self.upstream, self.drops, self.dropped = (url.host, url.port), drops, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server, contextlib.suppress(OSError):
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            if self.dropped < self.drops:
                server.recv(65536)  # the server answered, so it has committed ...
                self.dropped += 1
                client.shutdown(socket.SHUT_RDWR)  # ... and the client never hears it
                return
            self._pump(server, client)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


def test_a_lost_acknowledgement_is_retried_into_already_resolved(
    api: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    seed_items(sql, 1)
    token = make_token("alice", "reviewer")
    with ReviewQueueClient(api, token) as direct:
        (item,) = direct.lease(1)
    proxy = DropFirstResponse(api)
    try:
        # The client library retries a transport error; the retry finds the completion done.
        with ReviewQueueClient(proxy.url, token) as client:
            result = client.complete(item.id, "APPROVED", lease_token=item.lease_token)
    finally:
        proxy.close()
    assert proxy.dropped == 1, "no response was dropped: the test proves nothing"
    assert result.outcome == "already_resolved"
    resolved_once(sql, 1)
    # And by hand, without the library: the retry of the same call says the same.
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}) as http:
        again = http.post(f"/items/{item.id}/complete", json={"resolution": "APPROVED"})
    assert again.status_code == 200
    assert again.json()["outcome"] == "already_resolved"
    resolved_once(sql, 1)


def test_slow_uploads_hold_no_database_connection(
    db_url: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    """The body is read before the transaction starts, so clients trickling bodies in (slowloris)
    tie up sockets, not the pool: with a pool of 2 and 10 stalled uploads, others are served."""
    seed_items(sql, 1)
    token = make_token("alice", "reviewer")
    process, base = start_server(
        {"DATABASE_URL": db_url, "REVIEW_QUEUE_POOL_SIZE": "2", "REVIEW_QUEUE_POOL_MAX_OVERFLOW": "0"}
    )
    host, port = httpx.URL(base).host, httpx.URL(base).port
    stalled = []
    try:
        for _ in range(10):
            sock = socket.create_connection((host, port))
            sock.sendall(
                b"POST /leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: 1000\r\n\r\n{"
            )
            stalled.append(sock)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            # The server's one event loop has answered requests sent after the stalled ones, so it
            # has taken those in (and, were it to open a transaction for them, would have done so).
            for _ in range(3):
                assert http.get("/healthz").status_code == 200
            idle_in_transaction = sql.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%'"
            ).fetchone()
            assert idle_in_transaction == (0,), "stalled uploads hold database transactions"
            # With both pooled connections held by stalled uploads, this would be a 503 after the
            # pool timeout; served, it proves the pool was free.
            leased = http.post("/leases", json={"batch_size": 1})
        assert leased.status_code == 200, leased.text
        assert len(leased.json()["items"]) == 1
    finally:
        for sock in stalled:
            sock.close()
        stop_server(process)


def _blocked_in_commit(sql: psycopg.Connection, pid: int) -> bool:
    row = sql.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "SyncRep"


def test_a_lock_timeout_at_commit_is_a_503_everywhere(
    own_postgres: OwnPostgres, make_token_on: Callable[[str, str, str], str], tmp_path: Path
) -> None:
    """NOTIFY takes one database-wide lock at COMMIT (notifying commits queue up in order). A commit
    that holds it long (here: one waiting for a synchronous standby that never answers) makes every
    other notifying commit hit lock_timeout at its COMMIT, as seen under load. Both transaction paths
    (POST /items through the request's transaction, a release in one round trip) must answer 503
    DATABASE_UNAVAILABLE, log it and count it so, and never print an ASGI traceback."""
    url = own_postgres.url

    def local_session() -> psycopg.Connection:
        sql = psycopg.connect(libpq(url), autocommit=True)
        sql.execute("SET synchronous_commit = local")  # this session's commits never wait
        return sql

    with local_session() as sql:
        seed_items(sql, 2)
        # Only the blocker waits for the standby: the service's sessions commit locally.
        sql.execute("ALTER DATABASE postgres SET synchronous_commit = local")
        sql.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        sql.execute("SELECT pg_reload_conf()")
    admin = {"Authorization": f"Bearer {make_token_on(url, 'ada', 'admin')}"}
    alice = {"Authorization": f"Bearer {make_token_on(url, 'alice', 'reviewer')}"}
    log = tmp_path / "server.log"
    env = {"DATABASE_URL": url, "REVIEW_QUEUE_LOG_FORMAT": "json", "REVIEW_QUEUE_LOG_LEVEL": "INFO"}
    process, base = start_server(env, stdout=log.open("wb"))
    blocker = psycopg.connect(libpq(url))
    blocker.execute("SET synchronous_commit = on")
    blocker.execute("CREATE TEMP TABLE written (x int)")  # a commit waits for a standby if it wrote
    blocker.execute("NOTIFY review_queue_elsewhere")
    committing = threading.Thread(target=blocker.commit)  # returns once its backend is cancelled

    def unblock() -> None:
        with local_session() as sql:
            sql.execute("SELECT pg_cancel_backend(%s)", (blocker.info.backend_pid,))
        committing.join(timeout=60)
        assert not committing.is_alive()

    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            items = http.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]
            assert len(items) == 2
            committing.start()
            with local_session() as sql:
                wait_for(lambda: _blocked_in_commit(sql, blocker.info.backend_pid), 60)
            enqueued = http.post("/items", json=item_body(), headers=admin)
            released = http.post(f"/items/{items[0]['id']}/release", json={}, headers=alice)
            # A commit that notifies nobody is not held up.
            assert http.get("/stats", headers=alice).status_code == 200
            unblock()
            for response in (enqueued, released):
                problem = response.json()
                assert (response.status_code, problem["code"]) == (503, "DATABASE_UNAVAILABLE"), problem
                assert "lock timeout" in problem["detail"], problem
            # Nothing of either was kept, and the pool is healthy: both go through now.
            assert http.post("/items", json=item_body(), headers=admin).status_code == 201
            assert http.post(f"/items/{items[0]['id']}/release", json={}, headers=alice).status_code == 200
            metrics = http.get("/metrics", headers=admin).text
    finally:
        if committing.is_alive():
            unblock()
        blocker.close()
        stop_server(process)
        with local_session() as sql:
            sql.execute("ALTER SYSTEM RESET synchronous_standby_names")
            sql.execute("SELECT pg_reload_conf()")
    for route in ("/items", "/items/{item_id}/release"):
        assert f'route="{route}",status="503"}} 1.0' in metrics, metrics
        assert f'review_queue_lock_timeouts_total{{route="{route}"}} 1.0' in metrics, metrics
        assert f'review_queue_database_unavailable_total{{route="{route}"}} 1.0' in metrics, metrics
    assert 'status="500"' not in metrics, metrics
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-5000:]
    logged = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    statuses = [line["status"] for line in logged if line.get("event") == "http_request"]
    assert statuses.count(503) == 2 and 500 not in statuses, statuses
