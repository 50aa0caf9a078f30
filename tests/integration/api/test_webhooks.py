"""PUT /webhooks/{name} as stored: what happens to the secret, and where a new subscription starts.
No deliverer here (tests/system/test_deliverer.py runs one): the stored rows and the feed are read
directly."""

from collections.abc import Callable

import psycopg
from fastapi.testclient import TestClient

from api import webhook_secret
from tests.support.api import item_body
from tests.support.postgres import WEBHOOK_KEY, libpq

Headers = Callable[[str, str], dict[str, str]]
URL = "https://hooks.example.com/review-queue"


def _stored_secret(sql: psycopg.Connection, name: str) -> str:
    (token,) = sql.execute("SELECT secret FROM webhook_subscription WHERE name = %s", (name,)).fetchone()  # type: ignore[misc]
    return webhook_secret.decrypt(WEBHOOK_KEY, bytes(token))


def test_a_put_without_secret_keeps_the_stored_one_and_one_with_a_secret_replaces_it(
    client: TestClient, auth: Headers, sql: psycopg.Connection
) -> None:
    admin = auth("ada", "admin")
    first, second = webhook_secret.generate(), webhook_secret.generate()
    made = client.put("/webhooks/ledger", json={"url": URL, "secret": first}, headers=admin)
    assert made.status_code == 201 and made.json()["secret"] is None, made.text  # it was given, not made
    assert _stored_secret(sql, "ledger") == first
    changed = client.put(
        "/webhooks/ledger", json={"url": URL + "/v2", "events": ["item.resolved"]}, headers=admin
    )
    assert changed.status_code == 200 and changed.json()["secret"] is None, changed.text
    assert changed.json()["url"] == URL + "/v2"
    assert _stored_secret(sql, "ledger") == first, "a PUT without `secret` replaced the stored one"
    rotated = client.put("/webhooks/ledger", json={"url": URL, "secret": second}, headers=admin)
    assert rotated.status_code == 200, rotated.text
    assert _stored_secret(sql, "ledger") == second


def test_a_new_subscription_gets_what_an_older_transaction_commits_after_it(
    client: TestClient, auth: Headers, superuser_url: str
) -> None:
    """An older transaction has written an event and is still open; a younger one commits an event;
    then the subscription is made, then the older one commits. The subscription starts below the
    oldest transaction in flight (the feed's snapshot rule), so the older event is after its start:
    a start at the newest committed event would have put it behind the cursor, never delivered."""
    admin = auth("ada", "admin")
    item = client.post("/items", json=item_body(), headers=admin).json()
    with psycopg.connect(libpq(superuser_url)) as older:
        older.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " VALUES (%s, 'RENEWED', 'older', 0, %s)",
            (item["id"], item["trace_id"]),
        )
        (older_id,) = older.execute("SELECT max(id) FROM review_queue_event").fetchone()  # type: ignore[misc]
        younger = client.post("/items", json=item_body(), headers=admin).json()
        made = client.put(
            "/webhooks/late", json={"url": URL, "events": ["item.renewed", "item.enqueued"]}, headers=admin
        )
        assert made.status_code == 201, made.text
        older.commit()
    start = made.json()["cursor"]
    page = client.get("/events", params={"after": start, "limit": 100}, headers=admin)
    assert page.status_code == 200, page.text
    after_start = [(e["id"], e["item_id"], e["event"]) for e in page.json()["events"]]
    assert (older_id, item["id"], "RENEWED") in after_start, (
        f"the older transaction's event {older_id} is behind the new subscription's start: {after_start}"
    )
    assert (younger["id"], "ENQUEUED") in [(i, e) for _, i, e in after_start]
