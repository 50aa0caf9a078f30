"""POST /items, GET /items/{id}, POST /items/{id}/complete."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support import backdate_lease
from tests.support.api import assert_problem, enqueue, item_body


def lease_one(client: TestClient, headers: dict[str, str]) -> dict:
    response = client.post("/leases", json={"batch_size": 1}, headers=headers)
    assert response.status_code == 200, response.text
    (item,) = response.json()["items"]
    return item


class TestEnqueue:
    def test_created_item_has_the_full_shape(self, client: TestClient, ingest: dict[str, str]) -> None:
        body = item_body(trace_id="3f1c5c1e-8a5e-4a7e-9a52-2b3f0f0c1a11")
        response = client.post("/items", json=body, headers=ingest)
        assert response.status_code == 201
        item = response.json()
        assert set(item) == {
            "id", "idempotency_key", "ledger_entity", "variance_amount", "currency", "match_decision",
            "state", "leased_by", "leased_at", "lease_expires_at", "trace_id", "source_hash", "created_at",
            "resolution", "resolution_note", "resolved_by", "resolved_at", "attempts", "lease_token",
            "context", "due_at", "prepared_by", "prepared_at", "proposed_resolution", "proposed_note",
            "approved_by", "approved_at",
        }  # fmt: skip
        assert (item["attempts"], item["lease_token"], item["context"]) == (0, None, None)
        assert item["due_at"].endswith("+00:00")
        assert item["state"] == "PENDING"
        assert (item["variance_amount"], item["currency"]) == ("12.50", "USD")  # the base currency
        assert item["trace_id"] == body["trace_id"]
        assert item["leased_by"] is None and item["resolved_at"] is None
        assert item["created_at"].endswith("+00:00")
        assert client.get(f"/items/{item['id']}", headers=ingest).json() == item

    @pytest.mark.parametrize(
        ("sent", "stored"),
        [
            ("0.10", "0.10"),
            ("0.1", "0.10"),
            (0.1, "0.10"),
            ("-7", "-7.00"),
            (12, "12.00"),
            ("9999999999999999.99", "9999999999999999.99"),
        ],
    )
    def test_money_is_exact(
        self, client: TestClient, ingest: dict[str, str], sent: object, stored: str
    ) -> None:
        item = enqueue(client, ingest, variance_amount=sent)
        assert item["variance_amount"] == stored
        assert client.get(f"/items/{item['id']}", headers=ingest).json()["variance_amount"] == stored

    def test_json_number_keeps_every_digit(self, client: TestClient, ingest: dict[str, str]) -> None:
        raw = (
            '{"idempotency_key": "exact", "ledger_entity": "E", "variance_amount": 1234567890123456.78,'
            ' "match_decision": "PARTIAL", "source_hash": "h"}'
        )
        response = client.post("/items", content=raw, headers={**ingest, "content-type": "application/json"})
        assert response.status_code == 201, response.text
        assert response.json()["variance_amount"] == "1234567890123456.78"

    @pytest.mark.parametrize(
        "amount",
        [
            "12.345",
            "0.001",
            12.345,
            "NaN",
            "Infinity",
            "-Infinity",
            "abc",
            "",
            "10000000000000000.00",
            None,
            True,
        ],
    )
    def test_bad_money_is_refused_not_rounded(
        self, client: TestClient, ingest: dict[str, str], amount: object
    ) -> None:
        response = client.post("/items", json=item_body(variance_amount=amount), headers=ingest)
        assert_problem(response, 422, "VALIDATION_ERROR")

    @pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
    def test_bare_nan_literals_are_refused(
        self, client: TestClient, ingest: dict[str, str], literal: str
    ) -> None:
        raw = (
            '{"idempotency_key": "k", "ledger_entity": "E", "variance_amount": ' + literal + ","
            ' "match_decision": "PARTIAL", "source_hash": "h"}'
        )
        response = client.post("/items", content=raw, headers={**ingest, "content-type": "application/json"})
        assert_problem(response, 422, "VALIDATION_ERROR")

    @pytest.mark.parametrize(
        "overrides",
        [
            {"idempotency_key": ""},
            {"idempotency_key": "x" * 201},
            {"ledger_entity": ""},
            {"source_hash": "a\x00b"},
            {"match_decision": "MAYBE"},
            {"match_decision": "matched"},
            {"trace_id": "not-a-uuid"},
            {"state": "RESOLVED"},
            {"leased_by": "mallory"},
        ],
    )
    def test_invalid_fields_are_422(
        self, client: TestClient, ingest: dict[str, str], overrides: dict
    ) -> None:
        response = client.post("/items", json=item_body(**overrides), headers=ingest)
        assert_problem(response, 422, "VALIDATION_ERROR")

    def test_lone_surrogate_is_422(self, client: TestClient, ingest: dict[str, str]) -> None:
        raw = (
            '{"idempotency_key": "k", "ledger_entity": "\\ud800", "variance_amount": "1.00",'
            ' "match_decision": "PARTIAL", "source_hash": "h"}'
        )
        response = client.post("/items", content=raw, headers={**ingest, "content-type": "application/json"})
        assert_problem(response, 422, "VALIDATION_ERROR")

    def test_missing_field_is_422(self, client: TestClient, ingest: dict[str, str]) -> None:
        body = item_body()
        del body["source_hash"]
        body_problem = assert_problem(
            client.post("/items", json=body, headers=ingest), 422, "VALIDATION_ERROR"
        )
        assert any(err["loc"] == ["body", "source_hash"] for err in body_problem["errors"])

    def test_200_chars_is_accepted(self, client: TestClient, ingest: dict[str, str]) -> None:
        enqueue(client, ingest, ledger_entity="é" * 200)

    def test_same_key_same_payload_returns_the_existing_item(
        self, client: TestClient, ingest: dict[str, str]
    ) -> None:
        body = item_body(variance_amount="5.5")
        first = client.post("/items", json=body, headers=ingest)
        again = client.post("/items", json={**body, "variance_amount": "5.50"}, headers=ingest)
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json() == first.json()

    def test_same_key_different_payload_is_a_conflict(
        self, client: TestClient, ingest: dict[str, str]
    ) -> None:
        body = item_body()
        first = client.post("/items", json=body, headers=ingest).json()
        changes = [
            {"variance_amount": "12.51"},
            {"ledger_entity": "OTHER"},
            {"match_decision": "PARTIAL"},
            {"source_hash": "other"},
            {"trace_id": "3f1c5c1e-8a5e-4a7e-9a52-2b3f0f0c1a11"},
        ]
        for change in changes:
            response = client.post("/items", json={**body, **change}, headers=ingest)
            assert assert_problem(response, 409, "IDEMPOTENCY_CONFLICT")["item_id"] == first["id"]
        assert client.get(f"/items/{first['id']}", headers=ingest).json() == first

    def test_concurrent_duplicates_create_one_item_and_never_500(
        self, client: TestClient, ingest: dict[str, str]
    ) -> None:
        body = item_body()
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda _: client.post("/items", json=body, headers=ingest), range(16)))
        codes = sorted(r.status_code for r in responses)
        assert codes == [200] * 15 + [201], codes
        assert len({r.json()["id"] for r in responses}) == 1


class TestGetItem:
    def test_unknown_id_is_404(self, client: TestClient, alice: dict[str, str]) -> None:
        response = client.get("/items/00000000-0000-0000-0000-000000000000", headers=alice)
        assert_problem(response, 404, "NOT_FOUND")

    @pytest.mark.parametrize("bad", ["123", "not-a-uuid", "00000000-0000-0000-0000-00000000000Z"])
    def test_malformed_id_is_422(self, client: TestClient, alice: dict[str, str], bad: str) -> None:
        assert_problem(client.get(f"/items/{bad}", headers=alice), 422, "VALIDATION_ERROR")


class TestComplete:
    def test_holder_resolves(self, client: TestClient, ingest: dict, alice: dict) -> None:
        enqueue(client, ingest)
        leased = lease_one(client, alice)
        response = client.post(
            f"/items/{leased['id']}/complete", json={"resolution": "APPROVED", "note": "ok"}, headers=alice
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["outcome"] == "resolved"
        item = body["item"]
        assert (item["state"], item["resolution"], item["resolution_note"], item["resolved_by"]) == (
            "RESOLVED", "APPROVED", "ok", "alice",
        )  # fmt: skip
        assert item["resolved_at"] is not None

    def test_retry_is_already_resolved_and_keeps_the_first_note(
        self, client: TestClient, ingest: dict, alice: dict
    ) -> None:
        enqueue(client, ingest)
        leased = lease_one(client, alice)
        url = f"/items/{leased['id']}/complete"
        first = client.post(url, json={"resolution": "APPROVED", "note": "first"}, headers=alice).json()
        retry = client.post(url, json={"resolution": "APPROVED", "note": "second"}, headers=alice)
        assert retry.status_code == 200
        assert retry.json()["outcome"] == "already_resolved"
        assert retry.json()["item"] == first["item"]
        assert retry.json()["item"]["resolution_note"] == "first"

    def test_retry_with_another_resolution_conflicts(
        self, client: TestClient, ingest: dict, alice: dict
    ) -> None:
        enqueue(client, ingest)
        leased = lease_one(client, alice)
        url = f"/items/{leased['id']}/complete"
        client.post(url, json={"resolution": "APPROVED"}, headers=alice)
        assert_problem(
            client.post(url, json={"resolution": "REJECTED"}, headers=alice), 409, "RESOLUTION_CONFLICT"
        )
        assert client.get(f"/items/{leased['id']}", headers=alice).json()["resolution"] == "APPROVED"

    def test_not_held_cases_are_409_and_change_nothing(
        self, client: TestClient, ingest: dict, alice: dict, bob: dict
    ) -> None:
        pending = enqueue(client, ingest)
        url = f"/items/{pending['id']}/complete"
        assert_problem(
            client.post(url, json={"resolution": "APPROVED"}, headers=alice), 409, "LEASE_NOT_HELD"
        )
        assert client.get(f"/items/{pending['id']}", headers=alice).json() == pending

        held = lease_one(client, alice)
        assert_problem(client.post(url, json={"resolution": "APPROVED"}, headers=bob), 409, "LEASE_NOT_HELD")
        after = client.get(f"/items/{pending['id']}", headers=alice).json()
        assert after == held

        client.post(url, json={"resolution": "APPROVED"}, headers=alice)
        assert_problem(client.post(url, json={"resolution": "APPROVED"}, headers=bob), 409, "LEASE_NOT_HELD")
        assert client.get(f"/items/{pending['id']}", headers=alice).json()["resolved_by"] == "alice"

    def test_expired_but_unreclaimed_lease_still_counts(
        self, client: TestClient, ingest: dict, alice: dict, sql
    ) -> None:
        enqueue(client, ingest)
        leased = lease_one(client, alice)
        backdate_lease(sql)
        response = client.post(
            f"/items/{leased['id']}/complete", json={"resolution": "APPROVED"}, headers=alice
        )
        assert response.status_code == 200 and response.json()["outcome"] == "resolved"

    def test_unknown_item_is_404(self, client: TestClient, alice: dict) -> None:
        response = client.post(
            "/items/00000000-0000-0000-0000-000000000000/complete",
            json={"resolution": "APPROVED"},
            headers=alice,
        )
        assert_problem(response, 404, "NOT_FOUND")

    @pytest.mark.parametrize(
        "body",
        [
            {},
            {"resolution": "approved"},
            {"resolution": "1APPROVED"},
            {"resolution": "A" * 65},
            {"resolution": "APPROVED", "note": "n" * 4001},
            {"resolution": "APPROVED", "resolved_by": "mallory"},
            {"resolution": 7},
            [],
        ],
    )
    def test_bad_body_is_422(self, client: TestClient, ingest: dict, alice: dict, body: object) -> None:
        enqueue(client, ingest)
        leased = lease_one(client, alice)
        response = client.post(f"/items/{leased['id']}/complete", json=body, headers=alice)
        assert_problem(response, 422, "VALIDATION_ERROR")
        assert client.get(f"/items/{leased['id']}", headers=alice).json()["state"] == "ASSIGNED"

    def test_longest_resolution_and_note_are_accepted(
        self, client: TestClient, ingest: dict, alice: dict, sql: psycopg.Connection
    ) -> None:
        longest = "A" + "_9" * 31 + "Z"
        sql.execute("INSERT INTO resolution_code (code, label) VALUES (%s, 'the longest code')", (longest,))
        enqueue(client, ingest)
        leased = lease_one(client, alice)
        body = {"resolution": longest, "note": "n" * 4000}
        response = client.post(f"/items/{leased['id']}/complete", json=body, headers=alice)
        assert response.status_code == 200, response.text
        stored = sql.execute(
            "SELECT state, resolution, resolution_note, resolved_by FROM review_queue_item WHERE id = %s",
            (leased["id"],),
        ).fetchone()
        assert stored == ("RESOLVED", body["resolution"], body["note"], "alice"), (
            "stored cut short or changed"
        )
        (event,) = sql.execute(
            "SELECT details FROM review_queue_event WHERE item_id = %s AND event = 'RESOLVED'",
            (leased["id"],),
        ).fetchall()
        assert {k: event[0][k] for k in ("resolution", "note")} == {
            "resolution": body["resolution"],
            "note": body["note"],
        }
        answer = response.json()["item"]
        assert (answer["resolution"], answer["resolution_note"]) == (body["resolution"], body["note"])

    def test_malformed_id_is_422(self, client: TestClient, alice: dict) -> None:
        response = client.post("/items/nope/complete", json={"resolution": "APPROVED"}, headers=alice)
        assert_problem(response, 422, "VALIDATION_ERROR")


def test_http_client_type() -> None:
    # The suite speaks plain httpx through Starlette's TestClient.
    assert issubclass(TestClient, httpx.Client)
