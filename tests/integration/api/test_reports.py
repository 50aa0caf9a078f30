"""GET /reports/*: the figures of items that went through the real API (every path that writes a
decision), compared with the trail; periods, limits and time zones refused as problems; who may
read what; the CSV and NDJSON exports."""

import csv
import io
import json
import random
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.schemas import ThroughputOut, ThroughputRowOut
from db import reports
from tests.support import backdate_lease
from tests.support import reports as ref
from tests.support.api import assert_problem, item_body
from tests.support.openapi import OPENAPI
from tests.support.reports import run

Headers = dict[str, str]


@pytest.fixture
def tokens(auth: Callable[[str, str], Headers]) -> dict[str, Headers]:
    return {
        who: auth(who, role)
        for who, role in (
            ("ada", "admin"),
            ("audrey", "auditor"),
            ("alice", "reviewer"),
            ("bob", "reviewer"),
            ("april", "approver"),
            ("ivan", "ingest"),
        )
    }


def _ok(response: Any) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def _lease(client: TestClient, who: Headers, entity: str, queue: str = "review") -> dict[str, Any]:
    (item,) = _ok(
        client.post("/leases", json={"batch_size": 1, "ledger_entity": entity, "queue": queue}, headers=who)
    )["items"]
    return item


def live_through_the_api(client: TestClient, sql: psycopg.Connection, t: dict[str, Headers]) -> None:
    """One item per path that writes, leases or ends a lease, each in a ledger entity of its own."""

    def enqueue(entity: str, amount: str = "12.50", currency: str = "USD") -> str:
        body = item_body(ledger_entity=entity, variance_amount=amount, currency=currency)
        return str(_ok(client.post("/items", json=body, headers=t["ivan"]))["id"])

    def complete(
        who: str, item: dict[str, Any], code: str = "MATCH_CONFIRMED", **extra: Any
    ) -> dict[str, Any]:
        body = {"resolution": code, "note": "JE-1", "lease_token": item["lease_token"], **extra}
        return _ok(client.post(f"/items/{item['id']}/complete", json=body, headers=t[who]))

    enqueue("E1")
    complete("alice", _lease(client, t["alice"], "E1"))

    enqueue("E2")
    item = _lease(client, t["alice"], "E2")
    _ok(client.post(f"/items/{item['id']}/renew", json={}, headers=t["alice"]))
    _ok(client.post(f"/items/{item['id']}/release", json={"reason": "skip"}, headers=t["alice"]))
    complete("bob", _lease(client, t["bob"], "E2"))

    for entity, approve in (("E3", True), ("E4", False)):
        enqueue(entity, "25000.00")
        assert complete("alice", _lease(client, t["alice"], entity), "ADJUSTMENT_POSTED")["outcome"] == (
            "submitted_for_approval"
        )
        proposal = _lease(client, t["april"], entity, "approval")
        action = "approve" if approve else "reject"
        body = {"lease_token": proposal["lease_token"]} | ({} if approve else {"reason": "wrong entity"})
        _ok(client.post(f"/items/{proposal['id']}/{action}", json=body, headers=t["april"]))
    # The rejected E4 is held for alice (REVIEW_QUEUE_REJECTED_RETURN_S); here that time has passed.
    sql.execute(
        "UPDATE review_queue_item SET returned_until = now() - interval '1 second' WHERE ledger_entity = 'E4'"
    )
    # 25,000.00 is past the catalogue's materiality (10,000.00): every code needs an approver.
    assert (
        complete("bob", _lease(client, t["bob"], "E4"), "MATCH_REJECTED")["outcome"]
        == "submitted_for_approval"
    )
    proposal = _lease(client, t["april"], "E4", "approval")
    _ok(
        client.post(
            f"/items/{proposal['id']}/approve",
            json={"lease_token": proposal["lease_token"]},
            headers=t["april"],
        )
    )

    item_id = enqueue("E5")
    complete("alice", _lease(client, t["alice"], "E5"))
    _ok(client.post(f"/items/{item_id}/reopen", json={"reason": "wrong"}, headers=t["ada"]))
    complete("bob", _lease(client, t["bob"], "E5"), "TIMING_DIFFERENCE")

    item_id = enqueue("E6")
    complete("alice", _lease(client, t["alice"], "E6"))
    revision = {"variance_amount": "13.50", "source_hash": "sha256:new-6"}
    # Decertified: open, and in euros from now on (the backlog's split moves it at this moment).
    _ok(client.post(f"/items/{item_id}/revisions", json=revision | {"currency": "EUR"}, headers=t["ivan"]))

    item_id = enqueue("E7")
    held = _lease(client, t["alice"], "E7")
    _ok(
        client.post(
            f"/items/{item_id}/revisions", json={**revision, "source_hash": "sha256:new-7"}, headers=t["ivan"]
        )
    )
    complete("alice", {**held, "lease_token": None}, source_hash="sha256:new-7")

    item_id = enqueue("E8")
    _lease(client, t["alice"], "E8")
    _ok(
        client.post(
            f"/admin/items/{item_id}/reassign", json={"reviewer": "bob", "reason": "cover"}, headers=t["ada"]
        )
    )
    complete("bob", {"id": item_id, "lease_token": None})

    item_id = enqueue("E9")
    _lease(client, t["alice"], "E9")
    _ok(client.post(f"/admin/items/{item_id}/release", json={"reason": "leave"}, headers=t["ada"]))
    held = _lease(client, t["bob"], "E9")
    _ok(
        client.post(
            f"/items/{item_id}/release",
            json={"reason": "later", "lease_token": held["lease_token"]},
            headers=t["bob"],
        )
    )

    enqueue("E10", "1250", "JPY")  # never leased

    item_id = enqueue("E11")
    _lease(client, t["alice"], "E11")
    backdate_lease(sql, item_id)
    assert _ok(client.post("/admin/reclaim", json={}, headers=t["ada"]))["reclaimed"] == 1
    complete("bob", _lease(client, t["bob"], "E11"))


def spread_over_days(sql: psycopg.Connection, seed: int) -> None:
    """Move each item's whole life (row and events, together) back by its own number of hours, and
    give it a deadline of its own: real histories, spread over two weeks and around midnights."""
    rng = random.Random(seed)
    shift_columns = (
        "created_at",
        "leased_at",
        "lease_expires_at",
        "resolved_at",
        "prepared_at",
        "approved_at",
    )
    sql.execute("SET session_replication_role = replica")  # past the append-only trigger
    for (item_id,) in sql.execute("SELECT id FROM review_queue_item").fetchall():
        back = timedelta(hours=rng.randint(24, 14 * 24), minutes=rng.choice([0, 30, 59]))
        sets = ", ".join(f"{c} = {c} - %(back)s" for c in shift_columns)
        due = timedelta(minutes=rng.choice([-30, 0, 1, 90, 24 * 60, 3 * 24 * 60]))
        sql.execute(
            f"UPDATE review_queue_item SET {sets}, due_at = created_at - %(back)s + %(due)s"
            " WHERE id = %(id)s",
            {"back": back, "due": due, "id": item_id},
        )
        # The lease start a submission, rejection or release records moves with it; on about half
        # the items it is cleared, as on events written before it was recorded, so that the reports'
        # fallback (looking the lease up in the trail) is held to the same figures.
        sql.execute(
            "UPDATE review_queue_event SET at = at - %(back)s,"
            " leased_at = CASE WHEN %(older)s THEN NULL ELSE leased_at - %(back)s END WHERE item_id = %(id)s",
            {"back": back, "older": rng.random() < 0.5, "id": item_id},
        )
        # A reopening names the decision it reopened by its moment: that moved too.
        sql.execute(
            "UPDATE review_queue_event SET details = jsonb_set(details, '{previous_resolved_at}',"
            " to_jsonb(CAST(details ->> 'previous_resolved_at' AS timestamptz) - %s))"
            " WHERE item_id = %s AND event = 'REOPENED'",
            (back, item_id),
        )
    # The reopened items' deadlines moved with their rows (the service never changes one).
    sql.execute(
        "UPDATE review_queue_reopened_item r SET due_at = i.due_at"
        " FROM review_queue_item i WHERE i.id = r.item_id"
    )
    sql.execute("SET session_replication_role = origin")


_LEASE_START = (
    "(SELECT l.at FROM review_queue_event l WHERE l.item_id = e.item_id AND l.id < e.id"
    " AND l.event IN ('LEASED', 'REASSIGNED') ORDER BY l.id DESC LIMIT 1)"
)
_RECORDS_LEASE = ("SUBMITTED_FOR_APPROVAL", "REJECTED", "RELEASED", "REOPENED")


def test_the_database_records_the_lease_each_decision_ended_whatever_an_insert_says(
    client: TestClient, sql: psycopg.Connection, tokens: dict[str, Headers]
) -> None:
    live_through_the_api(client, sql, tokens)
    rows = sql.execute(
        f"SELECT e.event, e.leased_at, {_LEASE_START} FROM review_queue_event e"
        " WHERE e.event = ANY(%s) ORDER BY e.id",
        (list(_RECORDS_LEASE),),
    ).fetchall()
    assert {event for event, _, _ in rows} == set(_RECORDS_LEASE)
    assert all(recorded is not None and recorded == looked_up for _, recorded, looked_up in rows)
    others = sql.execute(
        "SELECT count(*) FROM review_queue_event WHERE leased_at IS NOT NULL AND NOT event = ANY(%s)",
        (list(_RECORDS_LEASE),),
    ).fetchone()
    assert others == (0,)
    # A forged lease start is replaced by the trail's.
    item_id, last_lease = sql.execute(
        "SELECT item_id, at FROM review_queue_event WHERE event = 'LEASED' ORDER BY id DESC LIMIT 1"
    ).fetchone() or (None, None)
    (recorded,) = sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, leased_at)"
        " SELECT id, 'RELEASED', 'mallory', lease_epoch, trace_id, '2000-01-01Z' FROM review_queue_item"
        " WHERE id = %s RETURNING leased_at",
        (item_id,),
    ).fetchone() or (None,)
    assert recorded == last_lease is not None


def _monday(day: date) -> date:
    return day - timedelta(days=day.weekday())


@pytest.fixture
def lived(client: TestClient, sql: psycopg.Connection, tokens: dict[str, Headers]) -> None:
    live_through_the_api(client, sql, tokens)
    spread_over_days(sql, seed=28)


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "America/New_York"])
def test_reports_of_real_histories_equal_the_trail(
    client: TestClient, sql: psycopg.Connection, tokens: dict[str, Headers], lived: None, tz: str
) -> None:
    items, events = ref.read_back(sql)
    today = datetime.now(UTC).date()
    start, end = today - timedelta(days=16), today + timedelta(days=2)
    weeks = (_monday(start), _monday(end) + timedelta(weeks=1))
    auditor = tokens["audrey"]
    for (first, last), bucket in (((start, end), "day"), (weeks, "week")):
        step = 7 if bucket == "week" else 1
        cuts = ref.edges(first, last, tz, step)
        params = {"from": first.isoformat(), "to": last.isoformat(), "tz": tz, "bucket": bucket}

        sla = _ok(client.get("/reports/sla", params=params, headers=auditor))
        expected, total = ref.sla(items, events, cuts, datetime.fromisoformat(sla["as_of"]))
        assert [_figures(b) for b in sla["buckets"]] == [_expected(*e) for e in expected]
        assert _figures(sla["total"]) == _expected(*total)
        assert sum(b["fell_due"] for b in sla["buckets"]) > 5, "the shift should spread the deadlines"

        flow = _ok(client.get("/reports/throughput", params=params, headers=auditor))
        assert [_flow(r, first, step) for r in flow["rows"]] == ref.throughput(events, cuts)
        assert {r["reviewer"] for r in flow["rows"]} == {"alice", "bob", "april"}
        # A release is not a decision (issue 42): alice's and bob's releases are counted apart.
        four = ("resolved", "submitted_for_approval", "approved", "rejected")
        assert all(r["decisions"] == sum(r[k] for k in four) for r in flow["rows"])
        assert sorted((r["reviewer"], r["released"]) for r in flow["rows"] if r["released"]) == [
            ("alice", 1),
            ("bob", 1),
        ]
        # Every decision of the history above: one each for E1, E2, E6, E7, E8 and E11, two for E3
        # and E5, four for E4 (two submissions, a rejection, an approval); the releases (E2, E9) none.
        assert sum(r["decisions"] for r in flow["rows"]) == 14

    params = {"from": start.isoformat(), "to": end.isoformat(), "tz": tz}
    stock = _ok(client.get("/reports/backlog", params=params, headers=auditor))
    cuts = ref.edges(start, end, tz)
    assert [(p["at"], tuple(p["by_age"].values())) for p in stock["points"]] == [
        (moment.isoformat(), bands)
        for _, moment, bands in ref.backlog(items, events, cuts, datetime.fromisoformat(stock["as_of"]))
    ]
    assert sum(p["open"] for p in stock["points"]) > 0
    assert stock["by"] is None and all(p["by_currency"] is None for p in stock["points"])
    split = _ok(client.get("/reports/backlog", params=params | {"by": "currency"}, headers=auditor))
    expected_split = ref.backlog_by_currency(items, events, cuts, datetime.fromisoformat(split["as_of"]))
    assert split["by"] == "currency"
    assert [
        {code: tuple(f["by_age"].values()) for code, f in p["by_currency"].items()} for p in split["points"]
    ] == expected_split
    assert all(
        f["open"] == sum(f["by_age"].values()) for p in split["points"] for f in p["by_currency"].values()
    )
    assert {code for point in expected_split for code in point} == {"USD", "EUR", "JPY"}

    exported = client.get("/reports/decisions.ndjson", params=params, headers=auditor)
    assert exported.status_code == 200, exported.text
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert lines == [_as_json(d) for d in ref.decisions(items, events, cuts[0], cuts[-1])]
    assert len(lines) == 10  # every decision made (E5's twice), reopened ones included


def test_the_throughput_json_is_the_rows_model_exactly(
    client: TestClient, db_url: str, tokens: dict[str, Headers], lived: None
) -> None:
    """PostgreSQL writes the throughput rows as JSON (db.reports.throughput_json), and the API sends
    them as written: each must be what the row model itself would send for those values, value for
    value and type for type (seconds as strings to the microsecond), the envelope's fields too."""
    today = datetime.now(UTC).date()
    for bucket, first, last, step in (
        ("day", today - timedelta(days=16), today + timedelta(days=2), 1),
        ("week", _monday(today) - timedelta(weeks=3), _monday(today) + timedelta(weeks=1), 7),
    ):
        params = {"from": first.isoformat(), "to": last.isoformat(), "tz": "Europe/Berlin", "bucket": bucket}
        response = client.get("/reports/throughput", params=params, headers=tokens["audrey"])
        body = _ok(response)
        period = reports.Period(first, last, "Europe/Berlin", step)
        rows = run(db_url, lambda c, p=period: reports.throughput(c, period=p)).rows
        expected = [
            ThroughputRowOut.model_validate(r, from_attributes=True).model_dump(mode="json") for r in rows
        ]
        assert body["rows"] == expected and len(expected) > 3, body["rows"]
        # The answer read by the response model gives itself back: no field the model lacks (a key
        # renamed in the SQL alone), none it wants missing (one renamed in the model alone), every
        # value in the model's own format.
        assert (
            ThroughputOut.model_validate_json(response.content).model_dump(mode="json", by_alias=True) == body
        )
        fields = set(ThroughputRowOut.model_fields)
        assert all(set(r) == fields for r in body["rows"]), (fields, body["rows"][0])
        assert any(r["median_lease_to_decision_s"] for r in body["rows"]), "no row has a duration"
        assert list(body) == ["from", "to", "tz", "bucket", "as_of", "reviewer", "rows"]
        assert (body["from"], body["bucket"], body["reviewer"]) == (first.isoformat(), bucket, None)
        assert response.headers["content-type"] == "application/json"


def _figures(b: dict[str, Any]) -> tuple[Any, ...]:
    return (b["fell_due"], b["on_time"], b["late"], b["open_past_due"], b["attainment"])


def _expected(fell: int, on_time: int, late: int, open_: int, attainment: Decimal | None) -> tuple[Any, ...]:
    return (fell, on_time, late, open_, None if attainment is None else str(attainment))


def _flow(r: dict[str, Any], first: date, step: int) -> dict[str, Any]:
    return {
        "k": (date.fromisoformat(r["start"]) - first).days // step + 1,
        "reviewer": r["reviewer"],
        **{
            k: r[k]
            for k in ("resolved", "submitted_for_approval", "approved", "rejected", "released", "decisions")
        },
        "median": None
        if r["median_lease_to_decision_s"] is None
        else Decimal(r["median_lease_to_decision_s"]),
        "p90": None if r["p90_lease_to_decision_s"] is None else Decimal(r["p90_lease_to_decision_s"]),
    }


def _as_json(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, datetime):
            out[key] = value.astimezone(UTC).isoformat()
        elif isinstance(value, Decimal):
            out[key] = f"{value:.2f}"
        elif key == "item_id":
            out[key] = str(value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# Periods, limits, time zones: problems, never a 500
# ---------------------------------------------------------------------------------------------

BAD_QUERIES = [
    ("/reports/sla", {"from": "2026-11-02", "to": "2026-11-02"}, "to"),  # empty
    ("/reports/sla", {"from": "2026-11-03", "to": "2026-11-02"}, "to"),  # backwards
    ("/reports/sla", {"from": "2026-11-03", "to": "2026-11-10", "bucket": "week"}, "from"),  # a Tuesday
    ("/reports/throughput", {"from": "2026-11-02", "to": "2026-11-11", "bucket": "week"}, "to"),
    ("/reports/sla", {"from": "2025-01-01", "to": "2026-01-03"}, "to"),  # 367 days
    ("/reports/backlog", {"from": "2025-01-01", "to": "2026-01-03"}, "to"),
    (
        "/reports/throughput",
        {"from": "2025-01-06", "to": "2026-01-19", "bucket": "week"},
        "to",
    ),  #
    ("/reports/sla", {"from": "2026-11-02", "to": "2026-11-09", "tz": "Mars/Olympus"}, "tz"),
    ("/reports/sla", {"from": "2026-11-02", "to": "2026-11-09", "tz": "localtime"}, "tz"),
    ("/reports/sla", {"from": "2026-11-02", "to": "2026-11-09", "tz": "UTC+3"}, "tz"),
    ("/reports/sla", {"from": "20261102", "to": "2026-11-09"}, "from"),
    ("/reports/sla", {"from": "1700000000", "to": "2026-11-09"}, "from"),
    ("/reports/sla", {"from": "2026-02-30", "to": "2026-03-09"}, "from"),
    ("/reports/sla", {"from": "1969-12-31", "to": "1970-01-09"}, "from"),
    ("/reports/sla", {"to": "2026-11-09"}, "from"),
    ("/reports/backlog", {"from": "2026-11-02", "to": "2026-11-09", "bucket": "week"}, "bucket"),
    ("/reports/backlog", {"from": "2026-11-02", "to": "2026-11-09", "by": "ledger_entity"}, "by"),
    ("/reports/sla", {"from": "2026-11-02", "to": "2026-11-09", "sort": "x"}, "sort"),
    ("/reports/decisions.csv", {"from": "2026-11-09", "to": "2026-11-02"}, "to"),
    ("/reports/decisions.ndjson", {"from": "2026-11-02", "to": "2026-11-09", "tz": "Nowhere"}, "tz"),
]


@pytest.mark.parametrize(("path", "params", "field"), BAD_QUERIES)
def test_a_bad_period_is_a_422_naming_the_parameter(
    client: TestClient, tokens: dict[str, Headers], path: str, params: dict[str, str], field: str
) -> None:
    problem = assert_problem(client.get(path, params=params, headers=tokens["ada"]), 422, "VALIDATION_ERROR")
    assert any(e["loc"][:2] == ["query", field] for e in problem["errors"]), problem


def test_the_longest_periods_are_allowed(client: TestClient, tokens: dict[str, Headers]) -> None:
    for path, params in (
        ("/reports/sla", {"from": "2024-01-01", "to": "2025-01-01"}),  # 366 days, a leap year
        ("/reports/throughput", {"from": "2024-12-30", "to": "2026-01-05", "bucket": "week"}),  # 53 weeks
        ("/reports/backlog", {"from": "2024-01-01", "to": "2025-01-01", "tz": "Pacific/Chatham"}),
    ):
        response = client.get(path, params=params, headers=tokens["ada"])
        assert response.status_code == 200, response.text
    assert len(response.json()["points"]) == 366


def test_weeks_start_on_monday_and_every_bucket_is_listed(
    client: TestClient, tokens: dict[str, Headers]
) -> None:
    params = {"from": "2026-10-19", "to": "2026-11-09", "bucket": "week", "tz": "Europe/Berlin"}
    sla = _ok(client.get("/reports/sla", params=params, headers=tokens["audrey"]))
    assert [b["start"] for b in sla["buckets"]] == ["2026-10-19", "2026-10-26", "2026-11-02"]
    assert sla["total"] == {"fell_due": 0, "on_time": 0, "late": 0, "open_past_due": 0, "attainment": None}
    assert (sla["from"], sla["to"], sla["tz"], sla["bucket"]) == (
        "2026-10-19",
        "2026-11-09",
        "Europe/Berlin",
        "week",
    )


# ---------------------------------------------------------------------------------------------
# Who may read what
# ---------------------------------------------------------------------------------------------


def test_reviewers_read_their_own_throughput_and_nothing_else(
    client: TestClient, sql: psycopg.Connection, tokens: dict[str, Headers], lived: None
) -> None:
    today = datetime.now(UTC).date()
    params = {"from": (today - timedelta(days=20)).isoformat(), "to": (today + timedelta(days=1)).isoformat()}
    everyone = _ok(client.get("/reports/throughput", params=params, headers=tokens["audrey"]))
    assert everyone["reviewer"] is None
    for who in ("alice", "bob", "april"):
        own = _ok(client.get("/reports/throughput", params=params, headers=tokens[who]))
        assert own["reviewer"] == who
        assert own["rows"] == [r for r in everyone["rows"] if r["reviewer"] == who]
        assert own["rows"], f"{who} decided something"
    for path in ("/reports/sla", "/reports/backlog", "/reports/decisions.csv", "/reports/decisions.ndjson"):
        for who in ("alice", "april", "ivan"):
            problem = assert_problem(client.get(path, params=params, headers=tokens[who]), 403, "FORBIDDEN")
            assert problem["required_roles"] == ["auditor", "admin"]
    assert_problem(client.get("/reports/throughput", params=params, headers=tokens["ivan"]), 403, "FORBIDDEN")


def test_the_desk_session_cookie_downloads_the_csv(
    client: TestClient, make_token: Callable[[str, str], str], tokens: dict[str, Headers], lived: None
) -> None:
    """The desk's download link carries no Authorization header: the session cookie is enough for a
    GET (writes need the CSRF token; a download is a read)."""
    signed_in = client.post("/session", json={"token": make_token("carla", "auditor")})
    assert signed_in.status_code == 200, signed_in.text
    today = datetime.now(UTC).date()
    params = {"from": (today - timedelta(days=20)).isoformat(), "to": (today + timedelta(days=1)).isoformat()}
    response = client.get("/reports/decisions.csv", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-disposition"] == (
        f'attachment; filename="decisions-{params["from"]}-to-{params["to"]}.csv"'
    )
    assert len(list(csv.reader(io.StringIO(response.text)))) == 1 + 10
    client.cookies.clear()
    assert_problem(client.get("/reports/decisions.csv", params=params), 401, "UNAUTHENTICATED")


# ---------------------------------------------------------------------------------------------
# The exports
# ---------------------------------------------------------------------------------------------

NASTY = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tindent", "\rreturn", 'quote " and, comma']


def test_the_csv_is_spreadsheet_safe_and_parses_back_to_the_ndjson(
    client: TestClient, tokens: dict[str, Headers]
) -> None:
    for n, text in enumerate(NASTY):
        body = item_body(ledger_entity=text, idempotency_key=f"{text}-{n}", variance_amount="-1250.50")
        item = _ok(client.post("/items", json=body, headers=tokens["ada"]))
        (held,) = _ok(client.post("/leases", json={"batch_size": 1}, headers=tokens["alice"]))["items"]
        assert held["id"] == item["id"]
        note = {"resolution": "ESCALATED", "note": text, "lease_token": held["lease_token"]}
        _ok(client.post(f"/items/{item['id']}/complete", json=note, headers=tokens["alice"]))
    today = datetime.now(UTC).date()
    params = {"from": today.isoformat(), "to": (today + timedelta(days=1)).isoformat()}
    response = client.get("/reports/decisions.csv", params=params, headers=tokens["audrey"])
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert response.headers["cache-control"] == "no-store"
    header, *rows = list(csv.reader(io.StringIO(response.text, newline="")))
    lines = [
        json.loads(line)
        for line in client.get(
            "/reports/decisions.ndjson", params=params, headers=tokens["audrey"]
        ).text.splitlines()
    ]
    assert header == list(lines[0])
    assert len(rows) == len(lines) == len(NASTY)
    for row, line in zip(rows, lines, strict=True):
        cells = dict(zip(header, row, strict=True))
        assert cells["variance_amount"] == "-1250.50" == line["variance_amount"]  # a number stays a number
        for column in ("ledger_entity", "note"):
            original = line[column]
            if original[0] in "=+-@\t\r":
                assert cells[column] == "'" + original, (column, cells[column])
            else:
                assert cells[column] == original
        assert cells["on_time"] == json.dumps(line["on_time"])  # true or false, as in the NDJSON
        assert cells["approved_by"] == "" and line["approved_by"] is None
    assert response.text.endswith("\r\n")


def test_an_export_of_several_pages_is_whole_and_in_order(
    client: TestClient, sql: psycopg.Connection, tokens: dict[str, Headers]
) -> None:
    """2,500 decisions: three pages, each read in a transaction of its own, joined without a gap
    or a repeat, even where many decisions share one instant."""
    count = 2500
    sql.execute(
        """
        WITH item AS (
            INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount,
                match_decision, source_hash, state, resolution, resolved_by, resolved_at, leased_by,
                leased_at, created_at, due_at)
            SELECT 'bulk-' || i, 'ACME', 1, 'PARTIAL', 'h', 'RESOLVED', 'MATCH_CONFIRMED', 'alice',
                   date_trunc('hour', now()) - interval '1 hour' + (i / 7) * interval '1 second',
                   'alice', now() - interval '3 hours', now() - interval '3 hours', now()
            FROM generate_series(1, %s) AS i
            RETURNING id, trace_id, resolved_at
        )
        INSERT INTO review_queue_event (item_id, event, actor, at, lease_epoch, trace_id, details)
        SELECT id, 'RESOLVED', 'alice', resolved_at, 1, trace_id,
               jsonb_build_object('resolution', 'MATCH_CONFIRMED', 'note', NULL)
        FROM item
        """,
        (count,),
    )
    today = datetime.now(UTC).date()
    params = {"from": (today - timedelta(days=1)).isoformat(), "to": (today + timedelta(days=1)).isoformat()}
    lines = [
        json.loads(line)
        for line in client.get(
            "/reports/decisions.ndjson", params=params, headers=tokens["ada"]
        ).text.splitlines()
    ]
    assert len(lines) == count
    assert len({line["event_id"] for line in lines}) == count
    keys = [(line["resolved_at"], line["event_id"]) for line in lines]
    assert keys == sorted(keys)


def test_metrics_expose_the_sla_of_the_last_seven_days(
    client: TestClient, sql: psycopg.Connection, tokens: dict[str, Headers]
) -> None:
    """The gauges behind the recording rule review_queue:sla_attainment_7d:ratio."""
    from prometheus_client.parser import text_string_to_metric_families

    now = datetime.now(UTC)

    def item(n: int, due_days_ago: float, resolved_hours_after_due: float) -> ref.History:
        due = now - timedelta(days=due_days_ago)
        life = ref.Life(random.Random(n), n, due - timedelta(hours=20), due, "ACME")
        life.now = due - timedelta(hours=19)
        life.lease("alice")
        life.now = due + timedelta(hours=resolved_hours_after_due)
        life.resolve("MATCH_CONFIRMED")
        return life.finish()

    ref.arrange(
        sql,
        [
            item(1, 3, -1),  # on time
            item(2, 3, -2),
            item(3, 6.5, -1),
            item(4, 2, +1),  # late
            item(5, 10, -1),  # fell due before the window
            item(6, -2, -40),  # not due yet
        ],
    )
    scrape = client.get("/metrics", headers=tokens["ada"])
    assert scrape.status_code == 200, scrape.text
    samples = {s.name: s.value for f in text_string_to_metric_families(scrape.text) for s in f.samples}
    assert (samples["review_queue_sla_fell_due_items"], samples["review_queue_sla_on_time_items"]) == (4, 3)


def test_the_exports_rows_are_what_decision_out_writes(
    client: TestClient, sql: psycopg.Connection, db_url: str, lived: None
) -> None:
    """The export writes its rows without a model per row; they must be exactly DecisionRowOut's."""
    from api.routes.reports import COLUMNS, _plain
    from api.schemas import DecisionRowOut
    from db import reports as db_reports
    from tests.support.reports import run

    _, events = ref.read_back(sql)
    lo, hi = min(e.at for e in events), max(e.at for e in events) + timedelta(seconds=1)
    page = run(db_url, lambda c: db_reports.decisions_page(c, lo=lo, hi=hi, after=None))
    assert len(page) == 10
    assert _plain(page) == [DecisionRowOut.model_validate(d).model_dump(mode="json") for d in page]
    assert list(_plain(page)[0]) == COLUMNS


@pytest.mark.parametrize("path", [p for p in OPENAPI["paths"] if p.startswith("/reports/")])
def test_the_period_rules_the_document_states_are_the_ones_enforced(
    client: TestClient, tokens: dict[str, Headers], path: str
) -> None:
    """Generated clients and fuzzers read a report's period rules from its `x-period`: each holds at
    its boundary (the most buckets pass, one more is a 422), and a report stating no limit has none."""
    rules = OPENAPI["paths"][path]["get"]["x-period"]
    monday = date(2024, 12, 30)

    def status(start: date, end: date, **extra: str) -> int:
        params = {"from": start.isoformat(), "to": end.isoformat(), **extra}
        return client.get(path, params=params, headers=tokens["ada"]).status_code

    assert rules["to_after_from"] is True
    assert (status(monday, monday), status(monday, monday - timedelta(days=1))) == (422, 422)
    sizes = rules.get("max_buckets", {})
    for size, most in sizes.items():
        step = timedelta(weeks=1) if size == "week" else timedelta(days=1)
        assert status(monday, monday + most * step, bucket=size) == 200, (size, most)
        assert status(monday, monday + (most + 1) * step, bucket=size) == 422, (size, most)
    if rules.get("week_starts_on") == "Monday":
        tuesday = monday + timedelta(days=1)
        assert status(tuesday, tuesday + timedelta(weeks=1), bucket="week") == 422
        assert status(monday, monday + timedelta(weeks=1), bucket="week") == 200
    if not sizes:
        assert status(monday, monday + timedelta(days=3 * 366)) == 200


def test_the_export_says_which_rate_and_base_amount_decided_four_eyes(
    client: TestClient, tokens: dict[str, Headers]
) -> None:
    """Each decision carries the rate its completion converted at and the base-currency amount it
    compared, as the trail recorded them (an approval's are its submission's); none without a rate.
    A rate set afterwards changes nothing already decided."""
    t = tokens
    _ok(client.put("/fx-rates/EUR", json={"rate": "1.0850"}, headers=t["ada"]))
    decided: dict[str, str] = {}
    for key, amount, currency in (
        ("eur-big", "9500.00", "EUR"),  # 10,307.50 USD: an approver
        ("eur-small", "-100.00", "EUR"),
        ("usd", "12.50", "USD"),
        ("jpy", "1500", "JPY"),  # no rate: an approver whatever the amount
    ):
        body = item_body(idempotency_key=key, variance_amount=amount, currency=currency)
        decided[_ok(client.post("/items", json=body, headers=t["ada"]))["id"]] = key
        (held,) = _ok(client.post("/leases", json={"batch_size": 1}, headers=t["alice"]))["items"]
        done = _ok(
            client.post(
                f"/items/{held['id']}/complete",
                json={"resolution": "APPROVED", "lease_token": held["lease_token"]},
                headers=t["alice"],
            )
        )
        if done["outcome"] == "submitted_for_approval":
            (proposal,) = _ok(
                client.post("/leases", json={"batch_size": 1, "queue": "approval"}, headers=t["april"])
            )["items"]
            approve = {"lease_token": proposal["lease_token"]}
            _ok(client.post(f"/items/{proposal['id']}/approve", json=approve, headers=t["april"]))
    _ok(client.put("/fx-rates/EUR", json={"rate": "1.2000"}, headers=t["ada"]))
    today = datetime.now(UTC).date()
    params = {"from": today.isoformat(), "to": (today + timedelta(days=1)).isoformat()}
    lines = [
        json.loads(line)
        for line in client.get(
            "/reports/decisions.ndjson", params=params, headers=t["audrey"]
        ).text.splitlines()
    ]
    got = {
        decided[d["item_id"]]: (d["approved_by"], d["currency"], d["rate"], d["base_amount"]) for d in lines
    }
    assert got == {
        "eur-big": ("april", "EUR", "1.0850", "10307.500000"),
        "eur-small": (None, "EUR", "1.0850", "-108.500000"),
        "usd": (None, "USD", "1", "12.50"),
        "jpy": ("april", "JPY", None, None),
    }
    response = client.get("/reports/decisions.csv", params=params, headers=t["audrey"])
    header, *rows = list(csv.reader(io.StringIO(response.text, newline="")))
    assert header[-2:] == ["rate", "base_amount"]  # added last: the columns before keep their places
    cells = {decided[row[1]]: dict(zip(header, row, strict=True)) for row in rows}
    assert (cells["eur-big"]["rate"], cells["eur-big"]["base_amount"]) == ("1.0850", "10307.500000")
    assert (cells["eur-small"]["base_amount"], cells["jpy"]["rate"], cells["jpy"]["base_amount"]) == (
        "-108.500000", "", "",
    )  # fmt: skip
