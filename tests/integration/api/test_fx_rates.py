"""Exchange rates into the base currency (issue 40): set by a treasury feed (ingest) or an admin,
kept with who set them and when, never overwritten; the base currency's is 1 by definition."""

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import assert_problem


def test_a_rate_is_appended_with_who_and_when_and_the_latest_is_listed(
    client: TestClient, auth: object
) -> None:
    feed = auth("treasury-feed", "ingest")  # type: ignore[operator]
    ada = auth("ada", "admin")  # type: ignore[operator]
    reader = auth("audrey", "auditor")  # type: ignore[operator]
    first = client.put("/fx-rates/EUR", json={"rate": "1.0790"}, headers=feed)
    assert first.status_code == 200, first.text
    assert (first.json()["currency"], first.json()["rate"], first.json()["set_by"]) == (
        "EUR", "1.0790", "treasury-feed"
    )  # fmt: skip
    assert client.put("/fx-rates/EUR", json={"rate": "1.0850"}, headers=ada).status_code == 200
    assert client.put("/fx-rates/JPY", json={"rate": "0.0067"}, headers=feed).status_code == 200
    listed = client.get("/fx-rates", headers=reader).json()
    assert listed["base_currency"] == "USD"
    assert [(r["currency"], r["rate"], r["set_by"]) for r in listed["rates"]] == [
        ("EUR", "1.0850", "ada"), ("JPY", "0.0067", "treasury-feed")
    ]  # fmt: skip
    history = client.get("/fx-rates/EUR/history", headers=reader).json()
    assert [(r["rate"], r["set_by"]) for r in history["rates"]] == [
        ("1.0850", "ada"),
        ("1.0790", "treasury-feed"),
    ]
    assert history["rates"][0]["set_at"] >= history["rates"][1]["set_at"]
    assert client.get("/fx-rates/GBP/history", headers=reader).json() == {"currency": "GBP", "rates": []}


def test_the_base_currency_has_no_rate_but_one(client: TestClient, auth: object) -> None:
    response = client.put("/fx-rates/USD", json={"rate": "1.5"}, headers=auth("ada", "admin"))  # type: ignore[operator]
    assert "rate is 1 by definition" in assert_problem(response, 409, "BASE_CURRENCY")["detail"]


@pytest.mark.parametrize(
    ("currency", "body"),
    [
        ("EUR", {"rate": "0"}),
        ("EUR", {"rate": "0.0000000000"}),
        ("EUR", {"rate": "-1.08"}),
        ("EUR", {"rate": "1.08500000001"}),
        ("EUR", {"rate": "1e3"}),
        ("EUR", {"rate": 1.085}),
        ("EUR", {"rate": "1.085", "set_by": "someone-else"}),
        ("XAU", {"rate": "2000"}),
        ("eur", {"rate": "1.085"}),
    ],
)
def test_a_malformed_rate_or_currency_is_refused(
    client: TestClient, auth: object, currency: str, body: dict[str, object]
) -> None:
    response = client.put(f"/fx-rates/{currency}", json=body, headers=auth("ada", "admin"))  # type: ignore[operator]
    assert_problem(response, 422, "VALIDATION_ERROR")


def test_the_application_role_cannot_change_or_delete_a_rate(
    client: TestClient, auth: object, db_url: str
) -> None:
    assert (
        client.put("/fx-rates/EUR", json={"rate": "1.0850"}, headers=auth("ada", "admin")).status_code == 200
    )  # type: ignore[operator]
    from tests.support.postgres import libpq

    with psycopg.connect(libpq(db_url), autocommit=True) as app:
        for statement in ("UPDATE fx_rate SET rate = 2", "DELETE FROM fx_rate", "TRUNCATE fx_rate"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)
