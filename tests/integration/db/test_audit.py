"""The hash chain on real PostgreSQL: the sealer, its commit-order hazard, the canonical encoding,
and verification catching each kind of tampering (done as the superuser, the only one who can)."""

import hashlib
import json
import threading
import time
from collections.abc import Callable
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from db import audit, chain
from tests.support import seed_items
from tests.support.audit import add_events, seal
from tests.support.postgres import libpq, with_database


def verify(db_url: str, against: tuple[int, bytes] | None = None) -> audit.VerifyResult:
    with psycopg.connect(libpq(db_url)) as conn:
        return audit.verify(conn, against=against)


def chain_rows(sql: psycopg.Connection) -> list[tuple[int, int]]:
    return [
        (int(s), int(e)) for s, e in sql.execute("SELECT seq, event_id FROM review_queue_chain ORDER BY seq")
    ]


def event_ids_by_xid(sql: psycopg.Connection) -> list[int]:
    return [int(r[0]) for r in sql.execute("SELECT id FROM review_queue_event ORDER BY xid, id")]


Tamper = Callable[..., None]


@pytest.fixture
def tamper(sql: psycopg.Connection) -> Callable[..., None]:
    """Run a statement past the append-only triggers and foreign keys, as a superuser can."""

    def run(statement: str, params: tuple[object, ...] = ()) -> None:
        with sql.transaction():
            sql.execute("SET LOCAL session_replication_role = replica")
            sql.execute(statement, params)

    return run


# ---------------------------------------------------------------------------------------------
# Sealing
# ---------------------------------------------------------------------------------------------


def test_the_sealer_chains_every_committed_event_in_xid_order(db_url: str, sql: psycopg.Connection) -> None:
    add_events(sql, 25)
    assert seal(db_url) == 25
    assert seal(db_url) == 0, "sealing again must add nothing"
    assert [e for _, e in chain_rows(sql)] == event_ids_by_xid(sql)
    assert [s for s, _ in chain_rows(sql)] == list(range(1, 26))
    result = verify(db_url)
    assert (result.broken, result.events, result.head_seq) == (None, 25, 25)
    add_events(sql, 5)
    assert seal(db_url) == 5
    assert verify(db_url).head_seq == 30


def test_the_hash_is_sha256_of_the_previous_hash_and_the_documented_encoding(
    db_url: str, sql: psycopg.Connection
) -> None:
    add_events(sql, 2, details='{"z": "é\\n", "a": [1, 2.50], "m": {"y": null, "b": true}}')
    seal(db_url)
    (item_id, trace_id, at) = sql.execute(
        "SELECT item_id::text, trace_id::text,"
        " to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        " FROM review_queue_event ORDER BY xid, id LIMIT 1"
    ).fetchone()  # type: ignore[misc]
    (first_id,), (second_id,) = sql.execute("SELECT id FROM review_queue_event ORDER BY xid, id").fetchall()
    previous = bytes(32)
    for event_id, (seq, digest) in zip(
        (first_id, second_id),
        sql.execute("SELECT seq, hash FROM review_queue_chain ORDER BY seq").fetchall(),
        strict=True,
    ):
        # Written out by hand, as docs/audit.md specifies it.
        encoding = (
            '{"actor":"alice","at":"' + at + '","details":{"a":[1,2.50],"m":{"b":true,"y":null},'
            '"z":"\\u00e9\\n"},"event":"LEASED","id":' + str(event_id) + ',"item_id":"' + item_id
            + '","lease_epoch":1,"trace_id":"' + trace_id + '"}'
        )  # fmt: skip
        if event_id == second_id:
            # Same item, a later event: only the id and time differ, take its own time.
            (at2,) = sql.execute(
                "SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
                " FROM review_queue_event WHERE id = %s",
                (event_id,),
            ).fetchone()  # type: ignore[misc]
            encoding = encoding.replace(at, at2)
        previous = hashlib.sha256(previous + encoding.encode()).digest()
        assert bytes(digest) == previous, f"seq {seq}"


@pytest.mark.parametrize(
    ("stored", "canonical"),
    [
        ('{"a": 1.10}', '{"a":1.10}'),
        ('{"a": 0.0000001}', '{"a":0.0000001}'),
        ('{"a": 1e2}', '{"a":100}'),
        ('{"a": 1.5e-3}', '{"a":0.0015}'),
        ('{"a": 12345678901234567890.123456789}', '{"a":12345678901234567890.123456789}'),
        ('{"a": -0.0}', '{"a":0.0}'),
        ('{"a": 1e40}', '{"a":' + "1" + "0" * 40 + "}"),
        ('{"b": 1, "a": 2, "aa": 3, "B": 4}', '{"B":4,"a":2,"aa":3,"b":1}'),
        ('{"a": "\\u0001\\u001f\\"\\\\/\\ud83d\\ude00"}', '{"a":"\\u0001\\u001f\\"\\\\/\\ud83d\\ude00"}'),
    ],
)
def test_jsonb_numbers_and_strings_round_trip_through_the_encoding(
    sql: psycopg.Connection, stored: str, canonical: str
) -> None:
    (as_jsonb,) = sql.execute("SELECT %s::jsonb::text", (stored,)).fetchone()  # type: ignore[misc]
    assert chain.canonical_details(as_jsonb) == canonical
    # An export line parsed back (numbers as Decimal) encodes to the same bytes.
    assert chain.canonical_json(json.loads(canonical, parse_float=Decimal)) == canonical
    # And it is the same jsonb value.
    assert sql.execute("SELECT %s::jsonb = %s::jsonb", (canonical, stored)).fetchone() == (True,)


def test_time_is_encoded_to_the_microsecond_in_utc(db_url: str, sql: psycopg.Connection) -> None:
    seed_items(sql, 1)
    sql.execute("SET TIME ZONE 'Asia/Kolkata'")
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, at)"
        " SELECT id, 'ENQUEUED', 'x', 0, trace_id, '2026-12-03 15:00:00.000007+05:30' FROM review_queue_item"
    )
    seal(db_url)
    event_id, item_id, trace_id = sql.execute(
        "SELECT id, item_id::text, trace_id::text FROM review_queue_event"
    ).fetchone()  # type: ignore[misc]
    encoding = (
        f'{{"actor":"x","at":"2026-12-03T09:30:00.000007Z","details":{{}},"event":"ENQUEUED",'
        f'"id":{event_id},"item_id":"{item_id}","lease_epoch":0,"trace_id":"{trace_id}"}}'
    )
    (digest,) = sql.execute("SELECT hash FROM review_queue_chain WHERE seq = 1").fetchone()  # type: ignore[misc]
    assert bytes(digest) == hashlib.sha256(bytes(32) + encoding.encode()).digest()


def test_an_open_transaction_holding_a_low_id_is_sealed_after_it_commits_never_skipped(
    db_url: str, sql: psycopg.Connection
) -> None:
    """The commit-order hazard: an open transaction takes a low identity value (and xid) while
    later transactions commit. The sealer must not seal past it; once it commits it is sealed in
    its (xid, id) place; nothing is lost and the chain verifies."""
    add_events(sql, 3)  # committed before: sealable
    with psycopg.connect(libpq(db_url)) as open_tx:  # not autocommit: stays open
        open_tx.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'RENEWED', 'slow', 1, trace_id FROM review_queue_item LIMIT 1"
        )
        (low_id,) = open_tx.execute("SELECT max(id) FROM review_queue_event").fetchone()  # type: ignore[misc]
        add_events(sql, 4)  # higher ids, committed first
        later = [int(r[0]) for r in sql.execute("SELECT id FROM review_queue_event WHERE id > %s", (low_id,))]
        assert len(later) == 4 and min(later) > low_id
        sealed = seal(db_url)
        chained = {e for _, e in chain_rows(sql)}
        assert sealed == 3, f"sealed past an open transaction: chain has {sorted(chained)}"
        assert not chained & set(later), (
            f"events committed after the open one were sealed: {chained & set(later)}"
        )
        open_tx.commit()
    assert seal(db_url) == 5
    rows = chain_rows(sql)
    assert [e for _, e in rows] == event_ids_by_xid(sql)
    assert [e for _, e in rows][3] == low_id, (
        "the open transaction's event takes its place after the first three"
    )
    assert len(rows) == sql.execute("SELECT count(*) FROM review_queue_event").fetchone()[0]  # type: ignore[index]
    assert verify(db_url).broken is None


def test_a_transaction_whose_xid_order_differs_from_its_id_order_is_sealed_in_xid_order(
    db_url: str, sql: psycopg.Connection
) -> None:
    """T1 takes its transaction id first but inserts its event after T2 (a higher xid, a lower
    event id) committed: the chain follows (xid, id), so T1's event comes first, and the sealer's
    watermark never passes an event it has not sealed."""
    add_events(sql, 1)
    with psycopg.connect(libpq(db_url)) as t1:
        (xid_1,) = t1.execute("SELECT pg_current_xact_id()::text").fetchone()  # type: ignore[misc]
        add_events(sql, 1)  # T2: commits with the higher xid and the lower id
        (id_2, xid_2) = sql.execute(
            "SELECT id, xid::text FROM review_queue_event ORDER BY id DESC LIMIT 1"
        ).fetchone()  # type: ignore[misc]
        (id_1,) = t1.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'RENEWED', 't1', 1, trace_id FROM review_queue_item LIMIT 1 RETURNING id"
        ).fetchone()  # type: ignore[misc]
        t1.commit()
    assert int(xid_1) < int(xid_2) and id_1 > id_2, "the arrangement failed: nothing to tell apart"
    assert seal(db_url) == 3
    assert [e for _, e in chain_rows(sql)][1:] == [id_1, id_2]
    add_events(sql, 1)
    assert seal(db_url) == 1, "the next seal must find exactly the one new event"
    assert verify(db_url).broken is None


def test_the_tests_seal_waits_for_an_older_transaction_of_another_database(
    db_url: str, server_url: str, sql: psycopg.Connection
) -> None:
    """The harness, not the product: the sealer rightly waits for every older transaction on the
    server, and the tests share servers, so `seal()` first waits out other databases' transactions
    (the CI failure this guards: 0 sealed of 3, a mutation run's transaction open elsewhere)."""
    with psycopg.connect(libpq(with_database(server_url, "postgres"))) as elsewhere:
        elsewhere.execute("SELECT pg_current_xact_id()")  # an xid older than the events below
        add_events(sql, 3)
        committer = threading.Timer(1.0, elsewhere.commit)
        committer.start()
        started = time.monotonic()
        assert seal(db_url) == 3
        committer.join()
    assert time.monotonic() - started >= 0.9, "sealed while the older transaction was open"


def test_a_rolled_back_event_leaves_no_gap(db_url: str, sql: psycopg.Connection) -> None:
    add_events(sql, 2)
    with psycopg.connect(libpq(db_url)) as aborted:
        aborted.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'RENEWED', 'gone', 1, trace_id FROM review_queue_item LIMIT 1"
        )
        add_events(sql, 2)
        aborted.rollback()
    assert seal(db_url) == 4
    assert verify(db_url).broken is None


def test_two_sealers_at_once_never_interleave(db_url: str, sql: psycopg.Connection) -> None:
    add_events(sql, 10)
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT i.id, 'RENEWED', 'bulk-' || g, 1, i.trace_id FROM review_queue_item i,"
        " generate_series(1, 2500) g"
    )
    total = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()[0]  # type: ignore[index]
    counts: list[int] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        counts.append(seal(db_url))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    counts.append(seal(db_url))  # whatever a sealer that found the lock taken left
    assert sum(counts) == total, counts
    result = verify(db_url)
    assert (result.broken, result.events) == (None, total)


def test_the_service_role_cannot_change_the_chain(db_url: str, sql: psycopg.Connection) -> None:
    add_events(sql, 2)
    seal(db_url)
    with psycopg.connect(libpq(db_url), autocommit=True) as service:
        for statement in (
            "UPDATE review_queue_chain SET hash = sha256('x')",
            "DELETE FROM review_queue_chain",
            "TRUNCATE review_queue_chain",
            "ALTER TABLE review_queue_chain DISABLE TRIGGER review_queue_chain_no_change",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                service.execute(statement)
    # Not even the owner, through the trigger.
    for statement in ("UPDATE review_queue_chain SET seq = seq", "DELETE FROM review_queue_chain"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            sql.execute(statement)
    assert verify(db_url).broken is None


# ---------------------------------------------------------------------------------------------
# Tampering
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def sealed(db_url: str, sql: psycopg.Connection) -> list[tuple[int, int]]:
    """Twelve sealed events; returns [(seq, event_id)]."""
    add_events(sql, 12)
    assert seal(db_url) == 12
    assert verify(db_url).broken is None
    return chain_rows(sql)


def event_at(rows: list[tuple[int, int]], seq: int) -> int:
    return dict(rows)[seq]


def test_verify_names_a_modified_event(db_url: str, sealed: list[tuple[int, int]], tamper: Tamper) -> None:
    tamper("UPDATE review_queue_event SET details = '{\"n\": 2}' WHERE id = %s", (event_at(sealed, 7),))
    broken = verify(db_url).broken
    assert broken is not None and (broken.seq, broken.kind) == (7, "modified"), broken


def test_verify_names_a_deleted_event(db_url: str, sealed: list[tuple[int, int]], tamper: Tamper) -> None:
    tamper("DELETE FROM review_queue_event WHERE id = %s", (event_at(sealed, 5),))
    broken = verify(db_url).broken
    assert broken is not None and (broken.seq, broken.kind) == (5, "missing"), broken


def test_verify_names_a_deleted_event_and_its_chain_entry(
    db_url: str, sealed: list[tuple[int, int]], tamper
) -> None:
    tamper("DELETE FROM review_queue_chain WHERE seq = 5")
    tamper("DELETE FROM review_queue_event WHERE id = %s", (event_at(sealed, 5),))
    broken = verify(db_url).broken
    assert broken is not None and (broken.seq, broken.kind) == (5, "missing"), broken


def test_verify_names_a_forged_event_inserted_into_the_sealed_range(
    db_url: str,
    sql: psycopg.Connection,
    sealed: list[tuple[int, int]],
    tamper: Tamper,
) -> None:
    # Forged to sit between seq 8 and seq 9 (the xid of seq 8's event, a larger id).
    tamper(
        "INSERT INTO review_queue_event (id, item_id, event, actor, lease_epoch, trace_id, xid)"
        " OVERRIDING SYSTEM VALUE"
        " SELECT e.id + 100000, e.item_id, 'RESOLVED', 'mallory', 1, e.trace_id, e.xid"
        " FROM review_queue_event e WHERE e.id = %s",
        (event_at(sealed, 8),),
    )
    broken = verify(db_url).broken
    assert broken is not None and (broken.seq, broken.kind) == (9, "inserted"), broken


def test_verify_names_two_swapped_events(db_url: str, sealed: list[tuple[int, int]], tamper: Tamper) -> None:
    # The chain lists events 4 and 6 the other way round (hashes left where they were).
    a, b = event_at(sealed, 4), event_at(sealed, 6)
    tamper("UPDATE review_queue_chain SET event_id = -event_id WHERE seq IN (4, 6)")
    tamper(
        "UPDATE review_queue_chain SET event_id = CASE seq WHEN 4 THEN %s ELSE %s END WHERE seq IN (4, 6)",
        (b, a),
    )
    broken = verify(db_url).broken
    assert broken is not None and (broken.seq, broken.kind) == (4, "out of order"), broken


def test_a_consistent_rewrite_passes_verify_but_not_verify_against_a_stored_head(
    db_url: str,
    sql: psycopg.Connection,
    sealed: list[tuple[int, int]],
    tamper: Tamper,
) -> None:
    stored = verify(db_url)
    head = (stored.head_seq, stored.head_hash)
    assert verify(db_url, against=head).broken is None
    # A superuser changes a decision and re-seals the whole chain consistently.
    tamper("UPDATE review_queue_event SET actor = 'mallory' WHERE id = %s", (event_at(sealed, 3),))
    tamper("DELETE FROM review_queue_chain")
    assert seal(db_url) == 12
    assert verify(db_url).broken is None, "a consistent rewrite is invisible without a stored head"
    broken = verify(db_url, against=head).broken
    assert broken is not None and (broken.seq, broken.kind) == (12, "rewritten"), broken


def test_verify_against_a_head_beyond_the_chain_fails(db_url: str, sealed: list[tuple[int, int]]) -> None:
    broken = verify(db_url, against=(13, bytes(32))).broken
    assert broken is not None and (broken.seq, broken.kind) == (13, "missing"), broken


def test_the_sealer_stops_at_a_chain_whose_head_event_is_gone(
    db_url: str,
    sql: psycopg.Connection,
    sealed: list[tuple[int, int]],
    tamper: Tamper,
) -> None:
    tamper("DELETE FROM review_queue_event WHERE id = %s", (event_at(sealed, 12),))
    add_events(sql, 1)
    with pytest.raises(audit.ChainBroken, match="seq 12"):
        seal(db_url)
    assert len(chain_rows(sql)) == 12


# ---------------------------------------------------------------------------------------------
# The database's sealer and the Python verifier agree on every byte
# ---------------------------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)  # jsonb: no NUL
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_TEXT, children, max_size=3),
    max_leaves=10,
)


@settings(
    max_examples=20,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(details=st.lists(st.dictionaries(_TEXT, _JSON, max_size=4), min_size=1, max_size=8), actor=_TEXT)
def test_the_database_seals_exactly_what_the_python_verifier_computes(
    db_url: str, sql: psycopg.Connection, details: list[dict[str, object]], actor: str
) -> None:
    """review_queue_seal (SQL) computes the links; audit verify (Python) recomputes them: any
    difference in the canonical encoding (key order, escapes, numbers) would be a broken chain."""
    if sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == (0,):
        seed_items(sql, 1)
    for value in details:
        text = json.dumps(value)
        (in_sql, as_jsonb) = sql.execute(
            "SELECT review_queue_canonical_json(%s::jsonb), %s::jsonb::text", (text, text)
        ).fetchone()  # type: ignore[misc]
        assert in_sql == chain.canonical_details(as_jsonb), text
        sql.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details)"
            " SELECT id, 'LEASED', %s, 1, trace_id, %s::jsonb FROM review_queue_item",
            (actor or "a", text),
        )
    seal(db_url)
    (events, sealed) = sql.execute(
        "SELECT (SELECT count(*) FROM review_queue_event), (SELECT count(*) FROM review_queue_chain)"
    ).fetchone()  # type: ignore[misc]
    assert sealed == events
    assert verify(db_url).broken is None


def test_an_export_whose_first_line_links_to_anything_but_genesis_is_broken() -> None:
    """seq 1 starts the chain: its prev_hash must be 32 zero bytes. A file that starts at seq 1
    linking elsewhere (a chain cut from another, re-numbered) is refused even though each line's
    hash is consistent with its own prev_hash."""
    event = chain.EventFields(
        id=1,
        item_id="5f0c2d1e-0000-4000-8000-000000000001",
        event="ENQUEUED",
        actor="ingest",
        at="2026-12-03T09:30:00.000007Z",
        lease_epoch=0,
        trace_id="9a1e0000-0000-4000-8000-000000000002",
        details="{}",
    )
    for previous, broken in ((chain.GENESIS, False), (b"\x01" * 32, True)):
        line = chain.export_line(1, previous, chain.link(previous, event), event)
        result = chain.verify_lines([line])
        if broken:
            assert result.broken is not None and (result.broken.seq, result.broken.kind) == (1, "modified")
        else:
            assert result.broken is None and result.events == 1
