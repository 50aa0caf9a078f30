"""Money in its currency (issue 40): every item carries an ISO 4217 code, its amount has at most that
currency's decimals (never rounded), the base currency fills in for an item sent without one, and
the same idempotency key with another currency is a conflict."""

from decimal import Decimal

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.schemas.money import currencies
from api.settings import Settings
from tests.support.api import assert_problem, item_body


def _enqueue(client: TestClient, headers: dict[str, str], **fields: object) -> dict:
    response = client.post("/items", json=item_body(**fields), headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_the_iso_list_has_the_minor_units_finance_expects() -> None:
    units = currencies()
    assert {c: units[c] for c in ("JPY", "KRW", "USD", "EUR", "GBP", "KWD", "BHD", "OMR", "TND", "JOD")} == {
        "JPY": 0, "KRW": 0, "USD": 2, "EUR": 2, "GBP": 2, "KWD": 3, "BHD": 3, "OMR": 3, "TND": 3, "JOD": 3,
    }  # fmt: skip
    # No amounts in gold or the test code, and none the column could not hold unrounded (CLF: 4).
    assert not {"XAU", "XTS", "XXX", "XDR", "CLF", "UYW"} & set(units)
    assert len(units) > 150


@pytest.mark.parametrize(
    ("amount", "currency", "stored", "shown"),
    [
        ("1500", "JPY", "1500", "1500"),
        ("-1500", "JPY", "-1500", "-1500"),
        ("12.5", "EUR", "12.50", "12.50"),
        ("1.234", "KWD", "1.234", "1.234"),
        ("1.2", "BHD", "1.200", "1.200"),
        ("9999999999999999.999", "KWD", "9999999999999999.999", "9999999999999999.999"),
    ],
)
def test_an_amount_is_stored_and_read_back_with_its_currencys_decimals(
    client: TestClient,
    ingest: dict[str, str],
    sql: psycopg.Connection,
    amount: str,
    currency: str,
    stored: str,
    shown: str,
) -> None:
    item = _enqueue(client, ingest, variance_amount=amount, currency=currency)
    assert (item["variance_amount"], item["currency"]) == (shown, currency)
    read = client.get(f"/items/{item['id']}", headers=ingest).json()
    assert (read["variance_amount"], read["currency"]) == (shown, currency)
    row = sql.execute(
        "SELECT variance_amount::text, currency FROM review_queue_item WHERE id = %s", (item["id"],)
    ).fetchone()
    assert row == (stored, currency)


@pytest.mark.parametrize(
    ("amount", "currency", "sentence"),
    [
        ("1500.5", "JPY", "1500.5 has 1 decimal; an amount in JPY has no decimals"),
        ("1500.00", "JPY", "1500.00 has 2 decimals; an amount in JPY has no decimals"),
        ("1.2345", "KWD", "1.2345 has 4 decimals; an amount in KWD has at most 3 decimals"),
        ("12.345", "EUR", "12.345 has 3 decimals; an amount in EUR has at most 2 decimals"),
        (Decimal("0.5"), "KRW", "0.5 has 1 decimal; an amount in KRW has no decimals"),
    ],
)
def test_more_decimals_than_the_currency_has_is_a_422_naming_them(
    client: TestClient, ingest: dict[str, str], amount: str | Decimal, currency: str, sentence: str
) -> None:
    body = item_body(currency=currency)
    body["variance_amount"] = float(amount) if isinstance(amount, Decimal) else amount
    problem = assert_problem(client.post("/items", json=body, headers=ingest), 422, "VALIDATION_ERROR")
    assert sentence in problem["detail"], problem
    assert problem["errors"][0]["type"] == "currency_minor_units"
    batch = client.post("/items/batch", json={"items": [item_body(), body]}, headers=ingest)
    assert sentence in assert_problem(batch, 422, "VALIDATION_ERROR")["detail"]
    assert client.get("/items", headers=ingest).json()["items"] == []  # nothing of the batch either


def test_without_a_currency_the_base_one_applies_and_its_decimals(
    client: TestClient, ingest: dict[str, str], settings: Settings
) -> None:
    assert settings.base_currency == "USD"
    assert _enqueue(client, ingest)["currency"] == "USD"
    problem = assert_problem(
        client.post("/items", json=item_body(variance_amount="1.234"), headers=ingest),
        422,
        "VALIDATION_ERROR",
    )
    assert problem["detail"] == (
        "body.variance_amount: 1.234 has 3 decimals; an amount in USD has at most 2 decimals"
        " (ISO 4217 minor units)"
    )
    batch = client.post(
        "/items/batch", json={"items": [item_body(), item_body(variance_amount="0.001")]}, headers=ingest
    )
    assert assert_problem(batch, 422, "VALIDATION_ERROR")["errors"][0]["loc"] == [
        "body", "items", 1, "variance_amount"
    ]  # fmt: skip


def test_another_base_currency_is_the_deployments_and_the_policy_says_which(
    settings: Settings, auth: object
) -> None:
    from api.app import create_app

    yen = settings.model_copy(update={"base_currency": "JPY"})
    with TestClient(create_app(yen)) as client:
        headers = auth("matcher", "ingest")  # type: ignore[operator]
        assert client.get("/resolutions/policy", headers=headers).json()["base_currency"] == "JPY"
        item = client.post("/items", json=item_body(variance_amount="1500"), headers=headers).json()
        assert (item["variance_amount"], item["currency"]) == ("1500", "JPY")
        refused = client.post("/items", json=item_body(variance_amount="12.50"), headers=headers)
        assert (
            "an amount in JPY has no decimals" in assert_problem(refused, 422, "VALIDATION_ERROR")["detail"]
        )


def test_the_base_currency_setting_is_an_iso_code() -> None:
    with pytest.raises(ValueError, match="ISO 4217"):
        Settings.model_validate({"REVIEW_QUEUE_BASE_CURRENCY": "XAU"})
    assert Settings.model_validate({"REVIEW_QUEUE_BASE_CURRENCY": "EUR"}).base_currency == "EUR"


# {} and [] were a 500 (unhashable in the check of the amount's decimals);
# tests/system/api/test_fuzz.py found it.
@pytest.mark.parametrize("currency", ["usd", "EURO", "ABC", "XAU", "CLF", "", 978, {}, [], None])
def test_a_currency_not_on_the_iso_list_is_refused(
    client: TestClient, ingest: dict[str, str], currency: object
) -> None:
    body = item_body(currency=currency)
    response = client.post("/items", json=body, headers=ingest)
    if currency is None:  # null: the base currency, as when absent
        assert response.status_code == 201 and response.json()["currency"] == "USD"
        return
    assert_problem(response, 422, "VALIDATION_ERROR")


def test_the_same_key_with_another_currency_is_an_idempotency_conflict(
    client: TestClient, ingest: dict[str, str]
) -> None:
    body = item_body(variance_amount="9500.00", currency="EUR")
    assert client.post("/items", json=body, headers=ingest).status_code == 201
    assert client.post("/items", json=body, headers=ingest).status_code == 200
    for other in ({**body, "currency": "USD"}, {k: v for k, v in body.items() if k != "currency"}):
        assert_problem(client.post("/items", json=other, headers=ingest), 409, "IDEMPOTENCY_CONFLICT")
        result = client.post("/items/batch", json={"items": [other]}, headers=ingest).json()["results"][0]
        assert (result["outcome"], result["problem"]["code"]) == ("conflict", "IDEMPOTENCY_CONFLICT")


def test_a_revision_may_change_amount_and_currency_and_the_trail_keeps_both(
    client: TestClient, ingest: dict[str, str]
) -> None:
    item = _enqueue(client, ingest, variance_amount="9500.00", currency="EUR")
    revised = client.post(
        f"/items/{item['id']}/revisions",
        json={"variance_amount": "1.234", "currency": "KWD", "source_hash": "sha256:kwd"},
        headers=ingest,
    )
    assert revised.status_code == 200, revised.text
    assert (revised.json()["item"]["variance_amount"], revised.json()["item"]["currency"]) == ("1.234", "KWD")
    # Without a currency the amount is in the item's own, which it keeps: three decimals fit KWD.
    kept = client.post(
        f"/items/{item['id']}/revisions",
        json={"variance_amount": "2.5", "source_hash": "sha256:kwd2"},
        headers=ingest,
    )
    assert (kept.json()["item"]["variance_amount"], kept.json()["item"]["currency"]) == ("2.500", "KWD")
    yen = client.post(
        f"/items/{item['id']}/revisions",
        json={"variance_amount": "2.5", "currency": "JPY", "source_hash": "sha256:jpy"},
        headers=ingest,
    )
    assert "an amount in JPY has no decimals" in assert_problem(yen, 422, "VALIDATION_ERROR")["detail"]
    # A retry of the first revision with another currency is a conflict, not a silent no-op.
    again = client.post(
        f"/items/{item['id']}/revisions",
        json={"variance_amount": "2.500", "currency": "BHD", "source_hash": "sha256:kwd2"},
        headers=ingest,
    )
    assert_problem(again, 409, "IDEMPOTENCY_CONFLICT")
    events = client.get(f"/items/{item['id']}/events", headers=ingest).json()["events"]
    revisions = [e["details"] for e in events if e["event"] == "REVISED"]
    assert [(r["previous"]["variance_amount"], r["previous"]["currency"]) for r in revisions] == [
        ("9500.00", "EUR"), ("1.234", "KWD")
    ]  # fmt: skip
    assert [(r["current"]["variance_amount"], r["current"]["currency"]) for r in revisions] == [
        ("1.234", "KWD"), ("2.500", "KWD")
    ]  # fmt: skip
    assert_problem(
        client.post(
            "/items/00000000-0000-4000-8000-000000000000/revisions",
            json={"variance_amount": "1", "source_hash": "sha256:x"},
            headers=ingest,
        ),
        404,
        "NOT_FOUND",
    )


def test_the_database_refuses_a_fourth_decimal_and_a_malformed_code(sql: psycopg.Connection) -> None:
    insert = (
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, currency,"
        " match_decision, source_hash) VALUES (%s, 'E', %s, %s, 'PARTIAL', 'h')"
    )
    sql.execute(insert, ("ok", Decimal("1.234"), "KWD"))
    for key, amount, code in (
        ("a", Decimal("1.2345"), "KWD"),
        ("b", Decimal("1E16"), "USD"),
        ("c", 1, "usd"),
    ):
        with pytest.raises(psycopg.errors.CheckViolation):
            sql.execute(insert, (key, amount, code))
