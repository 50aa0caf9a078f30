"""The work list's search (issue 42, "Search that finds"): `GET /items?q=` matches, in any letter
case, a prefix of the id, the idempotency key or the ledger entity, or of any string or number in
the item's `context`, nested too; LIKE's wildcards in the term are plain characters; the matches
page with the list's cursor in either order."""

from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.api import enqueue


def found(client: TestClient, headers: dict[str, str], q: str, **query: Any) -> list[str]:
    response = client.get("/items?" + urlencode({"q": q, "limit": 200, **query}), headers=headers)
    assert response.status_code == 200, response.text
    return [i["id"] for i in response.json()["items"]]


def test_an_invoice_number_in_the_context_is_found_by_its_prefix_in_any_case(
    client: TestClient, root: dict, alice: dict
) -> None:
    invoice = enqueue(client, root, context={"invoice": "INV-77412", "counterparty": "Globex"})["id"]
    enqueue(client, root, context={"invoice": "INV-7840"})
    assert found(client, alice, "inv-7741") == [invoice]  # the example
    assert found(client, alice, "INV-77412") == [invoice]
    assert found(client, alice, "gLoBeX") == [invoice]
    # A prefix of a value, not any part of it: the middle of a number is not what anyone types.
    assert found(client, alice, "77412") == []
    assert found(client, alice, "INV-774120") == []


def test_a_prefix_of_the_id_key_or_entity_in_any_case(client: TestClient, root: dict, alice: dict) -> None:
    item = enqueue(client, root, idempotency_key="Stmt-2026-11/ACME", ledger_entity="Acme-EUR")
    other = enqueue(client, root, idempotency_key="stmt-2026-12/globex", ledger_entity="GLOBEX-USD")
    assert found(client, alice, item["id"][:8].upper()) == [item["id"]]
    assert found(client, alice, item["id"][:13]) == [item["id"]]  # with its first hyphen
    assert found(client, alice, item["id"].upper()) == [item["id"]]
    assert found(client, alice, "STMT-2026-11") == [item["id"]]
    assert sorted(found(client, alice, "stmt-2026-1")) == sorted([item["id"], other["id"]])
    assert found(client, alice, "acme-e") == [item["id"]]
    assert found(client, alice, "globex") == [other["id"]]  # the entity's prefix (the key has it inside)
    assert found(client, alice, "eur") == []  # inside the entity, not its start


def test_nested_strings_and_numbers_count_and_keys_and_flags_do_not(
    client: TestClient, root: dict, alice: dict
) -> None:
    """A payment settles several invoices, a counterparty has a name and an account: the values a
    reviewer searches by sit at any depth, so every string and number counts. Keys are field names,
    not facts; a flag (`true`) or a null would make `t` or `n` find most items."""
    context = {
        "payment": {"reference": "PAY-5521", "invoices": ["INV-1001", {"number": "INV-1002"}]},
        "statement": 884120,
        "amount_due": 1250.5,
        "disputed": True,
        "note": None,
    }
    item = enqueue(client, root, context=context)["id"]
    enqueue(client, root, context={"statement": 99})
    for term in ("pay-55", "INV-1001", "inv-1002", "88412", "1250.5"):
        assert found(client, alice, term) == [item], term
    for term in ("payment", "reference", "invoices", "true", "null", "disputed"):
        assert found(client, alice, term) == [], term


def test_like_wildcards_in_the_term_are_plain_characters(client: TestClient, root: dict, alice: dict) -> None:
    keys = {
        key: enqueue(client, root, idempotency_key=key)["id"] for key in ("A%B-1", "A_B-2", "AXB-3", "A\\B-4")
    }
    assert found(client, alice, "a%") == [keys["A%B-1"]]
    assert found(client, alice, "a_b") == [keys["A_B-2"]]  # not AXB-3: `_` is no wildcard
    assert found(client, alice, "a\\") == [keys["A\\B-4"]]
    assert found(client, alice, "a\\b") == [keys["A\\B-4"]]
    assert found(client, alice, "%") == []  # finds a value that starts with %, not everything
    assert found(client, alice, "_") == []


def test_the_matches_page_with_the_lists_cursor_in_either_order(
    client: TestClient, root: dict, alice: dict
) -> None:
    dues = ["2026-12-20T00:00:00Z", "2026-12-08T00:00:00Z", "2026-12-15T00:00:00Z", "2026-12-08T00:00:00Z"]
    matches = [
        enqueue(client, root, due_at=due, context={"statement": f"ST-{n}"}) for n, due in enumerate(dues * 2)
    ]
    for _ in range(5):
        enqueue(client, root, context={"statement": "OTHER"})
    for order in ("created_at", "due_at"):
        expected = [i["id"] for i in sorted(matches, key=lambda i: (i[order], i["id"]))]
        seen, cursor = [], None
        while True:
            query = {"q": "st-", "sort": order, "limit": 3, **({"cursor": cursor} if cursor else {})}
            page = client.get("/items?" + urlencode(query), headers=alice)
            assert page.status_code == 200, page.text
            seen += [i["id"] for i in page.json()["items"]]
            if (cursor := page.json()["next_cursor"]) is None:
                break
        assert seen == expected, order
    assert found(client, alice, "st-", state="RESOLVED") == []


# Letters whose lower case Python and PostgreSQL (C.UTF-8, the embedded server's) agree on, the
# wildcards and the backslash, digits and a separator: enough to make every escaping mistake show.
ALPHABET = "aAbBéÉöÖ%_\\-/ 19"
VALUES = ["Ab%1", "ab_1", "aB\\9", "É-ö/1", "éÖ 9", "b-a", "%_\\", "AÉ%"]


@pytest.fixture
def varied(client: TestClient, root: dict) -> dict[str, list[str]]:
    """Items whose key, entity and context values mix case, wildcards and accents: {id: values}."""
    items: dict[str, list[str]] = {}
    for n, value in enumerate(VALUES):
        other = VALUES[(n + 3) % len(VALUES)]
        key = f"{value}#{n}"
        item = enqueue(client, root, idempotency_key=key, ledger_entity=f"E{other}", context={"v": [other]})
        items[item["id"]] = [item["id"], key, f"E{other}", other]
    return items


@given(
    term=st.one_of(
        st.text(ALPHABET, min_size=1, max_size=6),
        st.tuples(st.sampled_from(VALUES), st.integers(1, 6), st.booleans()).map(
            lambda t: (t[0][: t[1]].upper() if t[2] else t[0][: t[1]].lower()) or "a"
        ),
    )
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_term_finds_exactly_the_items_with_a_value_that_starts_so(
    client: TestClient, alice: dict, varied: dict[str, list[str]], term: str
) -> None:
    expected = {i for i, values in varied.items() if any(v.lower().startswith(term.lower()) for v in values)}
    assert set(found(client, alice, term)) & set(varied) == expected, term


def test_a_term_longer_than_the_indexed_prefixes_is_checked_whole(
    client: TestClient, root: dict, alice: dict
) -> None:
    """The index holds the first 32 characters of each value's prefixes; a longer term is looked up
    by its first 32 and then compared whole, wildcards escaped."""
    head = "Remittance-2026-11-30-ACME-GLOBEX"  # 33 characters
    one = enqueue(client, root, context={"remittance": f"{head}-000_17"})["id"]
    two = enqueue(client, root, context={"remittance": f"{head}-000X17"})["id"]
    assert sorted(found(client, alice, head.upper())) == sorted([one, two])
    assert found(client, alice, f"{head}-000_1".lower()) == [one]  # `_` is no wildcard
    assert found(client, alice, f"{head}-000X") == [two]
    assert found(client, alice, f"{head}-001") == []
