"""Many HTTP clients against a real uvicorn server: nothing leased twice, nothing lost."""

import threading
from collections import Counter
from collections.abc import Callable

import httpx
import psycopg

from tests.conftest import LONG
from tests.support import seed_items


def test_concurrent_http_clients_resolve_every_item_exactly_once(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    total, clients = (2000, 24) if LONG else (400, 12)
    drain_concurrently(live_server, make_token, sql, total=total, clients=clients)


def drain_concurrently(
    base: str, make_token: Callable[[str, str], str], sql: psycopg.Connection, *, total: int, clients: int
) -> None:
    """`clients` reviewers lease and complete `total` items at once; each is resolved exactly once."""
    seed_items(sql, total)
    leased: list[str] = []
    statuses: list[int] = []
    barrier = threading.Barrier(clients)

    def reviewer(n: int) -> None:
        headers = {"Authorization": f"Bearer {make_token(f'reviewer-{n}', 'reviewer')}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            barrier.wait()
            while True:
                response = http.post("/leases", json={"batch_size": 1 + n % 5})
                statuses.append(response.status_code)
                items = response.json()["items"]
                if not items:
                    return
                for item in items:
                    leased.append(item["id"])
                    done = http.post(f"/items/{item['id']}/complete", json={"resolution": "APPROVED"})
                    statuses.append(done.status_code)
                    assert done.json()["outcome"] == "resolved", done.text

    threads = [threading.Thread(target=reviewer, args=(n,), name=f"reviewer-{n}") for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"reviewers still running after the join timeout: {hung}"

    twice = [i for i, n in Counter(leased).items() if n > 1]
    assert not twice, f"DOUBLE_LEASE over HTTP: {twice[:5]}"
    assert len(leased) == total, f"{total - len(leased)} items never handed out"
    assert set(statuses) == {200}, Counter(statuses)
    rows = sql.execute(
        "SELECT state, count(*), count(DISTINCT resolved_by) > 1 FROM review_queue_item GROUP BY state"
    ).fetchall()
    assert rows == [("RESOLVED", total, True)], rows
