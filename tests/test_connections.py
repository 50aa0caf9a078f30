"""The served process facing the network: which proxies it believes, and stalled connections."""

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
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
