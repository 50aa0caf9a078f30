"""REVIEW_QUEUE_READ_DATABASE_URL: the lag-tolerant reads (the reports, /stats, the decisions export)
go to it, a read-only server as a standby is; the queue's writes and the feed stay on
DATABASE_URL. Two databases of the test server stand for the leader and a standby whose copy
differs (as a lagging one's does), so each answer shows which one it came from."""

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from db import roles
from tests.support import seed_items
from tests.support.api import item_body
from tests.support.postgres import fresh_database, libpq, make_settings, with_database


@pytest.fixture
def standby_url(server_url: str, template_db: str) -> Iterator[str]:
    """A copy with 7 pending items the leader does not have, read-only like a standby."""
    with fresh_database(server_url, template_db) as name:
        with psycopg.connect(libpq(with_database(server_url, name)), autocommit=True) as sql:
            seed_items(sql, 7)
            sql.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
        yield with_database(server_url, name, role=roles.APP_ROLE)


def test_lag_tolerant_reads_go_to_the_read_database_and_the_rest_to_the_leader(
    db_url: str, standby_url: str, auth: Callable[[str, str], dict[str, str]]
) -> None:
    ingest, auditor = auth("ingest-bot", "ingest"), auth("audra", "auditor")
    settings = make_settings(db_url, read_database_url=standby_url)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        for _ in range(2):
            assert client.post("/items", json=item_body(), headers=ingest).status_code == 201
        stats = client.get("/stats", headers=auditor)
        assert stats.status_code == 200, stats.text
        assert stats.json()["counts"]["PENDING"] == 7, "read from the standby"
        today = datetime.now(UTC).date()
        period = {
            "from": (today - timedelta(days=7)).isoformat(),
            "to": (today + timedelta(days=1)).isoformat(),
        }
        for path in ("/reports/sla", "/reports/backlog", "/reports/decisions.csv"):
            answer = client.get(path, params=period, headers=auditor)
            assert answer.status_code == 200, (path, answer.text)
        feed = client.get("/events", params={"types": "ENQUEUED"}, headers=auditor)
        assert feed.status_code == 200 and len(feed.json()["events"]) == 2, "the feed stays on the leader"
    with TestClient(create_app(make_settings(db_url)), raise_server_exceptions=False) as client:
        assert client.get("/stats", headers=auditor).json()["counts"]["PENDING"] == 2
