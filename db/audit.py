"""The hash chain in the database: the sealer, the head, verification and the export's rows.

Chaining is a sealer's job, outside the request path (no hot row: a request only inserts its
event, as before). The sealer is the database function `review_queue_seal` (SECURITY DEFINER,
owned by the NOLOGIN role review_queue_sealer, the only one with INSERT on the chain; see the
migration 2026_12_04_0620): the service's role can ask it to seal, never write a chain row itself.
It appends, in one transaction per batch and under an advisory lock so two sealers never
interleave, the events of *finished* transactions in (xid, id) order:

- `xid < pg_snapshot_xmin(pg_current_snapshot())` means the inserting transaction has ended, so
  no event can still appear below that line: an open transaction holding a low identity value
  holds the line back, and its events are sealed after it commits, never skipped;
- everything sealed has a smaller (xid, id) than everything not yet sealed, so the chain's head
  is the sealer's watermark and the next batch is an index range scan.

The chain's order is therefore (xid, id): deterministic and never rewritten, though not exactly
commit order (two transactions may commit in the other order of their xids).

The function computes each link with the encoding db/chain.py specifies, byte for byte (checked by
tests/integration/db/test_audit.py, which verifies in Python what the database sealed); verification and
export stay here, in Python, so that they do not depend on the database's own code.
"""

import time
from dataclasses import dataclass

import psycopg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from db.chain import GENESIS, Break, EventFields, canonical_details, export_line, link

SEAL_BATCH = 1000
_LOCK_KEY = "review_queue.chain"

# The event's fields as the chain encodes them (db/chain.py): `at` in UTC to the microsecond,
# UUIDs as text, details as jsonb prints them.
EVENT_FIELDS = (
    "e.id, e.item_id::text, e.event, e.actor,"
    " to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
    " e.lease_epoch, e.trace_id::text, e.details::text"
)


def event_fields(row: tuple[object, ...]) -> EventFields:
    id_, item_id, event, actor, at, epoch, trace_id, details = row
    return EventFields(
        id=int(id_),  # type: ignore[call-overload]
        item_id=str(item_id),
        event=str(event),
        actor=str(actor),
        at=str(at),
        lease_epoch=int(epoch),  # type: ignore[call-overload]
        trace_id=str(trace_id),
        details=canonical_details(str(details)),
    )


# Where the live chain starts: the last archived seq, its hash and its event's (xid, id)
# (db/archive.py); no row before the first archive, when the chain starts at genesis.
_START = (
    "SELECT through_seq AS seq, through_hash AS hash, through_xid::text AS xid, through_event_id AS id"
    " FROM review_queue_archive ORDER BY through_seq DESC LIMIT 1"
)
# The head: the last chain row and its event's (xid, id), or the start when all of it is archived.
_HEAD = text(
    "(SELECT c.seq, c.hash, e.xid::text AS xid, e.id FROM review_queue_chain c"
    " LEFT JOIN review_queue_event e ON e.id = c.event_id ORDER BY c.seq DESC LIMIT 1)"
    f" UNION ALL ({_START}) ORDER BY seq DESC LIMIT 1"
)
_SEAL = text("SELECT review_queue_seal(:batch)")
CHAIN_BROKEN_SQLSTATE = "RQ001"  # raised by review_queue_seal when the head's event is gone


class ChainBroken(RuntimeError):
    """The chain's head points at an event that no longer exists: run `review-queue audit verify`."""


async def seal_batch(conn: AsyncConnection, *, batch: int = SEAL_BATCH) -> int | None:
    """Have the sealer append up to `batch` events to the chain in this transaction; None when
    another sealer holds the lock (it is doing the work)."""
    try:
        sealed: int | None = await conn.scalar(_SEAL, {"batch": batch})
    except DBAPIError as error:
        driver = error.orig
        if isinstance(driver, psycopg.Error) and driver.sqlstate == CHAIN_BROKEN_SQLSTATE:
            raise ChainBroken(driver.diag.message_primary or str(driver)) from error
        raise
    return sealed


@dataclass(frozen=True, slots=True)
class SealLag:
    unsealed: int
    oldest_unsealed_age_s: float


# The watermark: the chain head's event.
_MARK = text(
    "SELECT xid, id FROM ((SELECT c.seq, e.xid::text AS xid, e.id FROM review_queue_chain c"
    " JOIN review_queue_event e ON e.id = c.event_id ORDER BY c.seq DESC LIMIT 1)"
    f" UNION ALL (SELECT seq, xid, id FROM ({_START}) s)) m ORDER BY seq DESC LIMIT 1"
)
# Events above the watermark, an index range scan on (xid, id). The watermark is sent as values,
# not read in the same statement: only then does the planner see that the range is the trail's few
# newest events (a value it cannot see is estimated at a third of the table, and scanned whole).
_LAG = text(
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(e.at)), 0)"
    " FROM review_queue_event e WHERE (e.xid, e.id) > (CAST(:xid AS xid8), :id)"
)


async def seal_lag(conn: AsyncConnection) -> SealLag:
    mark = (await conn.execute(_MARK)).one_or_none()
    xid, id_ = mark if mark is not None else ("0", 0)
    count, age = (await conn.execute(_LAG, {"xid": xid, "id": id_})).one()
    return SealLag(unsealed=int(count), oldest_unsealed_age_s=float(age))


async def head(conn: AsyncConnection) -> tuple[int, bytes]:
    row = (await conn.execute(_HEAD)).one_or_none()
    return (0, GENESIS) if row is None else (row.seq, bytes(row.hash))


# ---------------------------------------------------------------------------------------------
# Verification against the database: synchronous psycopg and a server-side cursor, so a million
# events stream through in seconds with bounded memory.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyResult:
    events: int  # live events verified: head_seq - start_seq
    head_seq: int
    head_hash: bytes
    seconds: float
    broken: Break | None
    start_seq: int = 0  # the last archived seq: the live chain links to its hash (0: genesis)
    start_hash: bytes = GENESIS


_WALK = (
    f"SELECT c.seq, c.event_id, c.hash, e.xid::text, {EVENT_FIELDS} FROM review_queue_chain c"
    " LEFT JOIN review_queue_event e ON e.id = c.event_id ORDER BY c.seq"
)
# An event inside the sealed range that the chain does not list: written after the fact.
_INSERTED = (
    "SELECT e.id, (SELECT min(c.seq) FROM review_queue_chain c JOIN review_queue_event s"
    "  ON s.id = c.event_id WHERE (s.xid, s.id) > (e.xid, e.id))"
    " FROM review_queue_event e"
    " WHERE (e.xid, e.id) < (%(xid)s::xid8, %(id)s)"
    " AND NOT EXISTS (SELECT FROM review_queue_chain c WHERE c.event_id = e.id)"
    " ORDER BY e.xid, e.id LIMIT 1"
)


def _key(row: tuple[object, ...] | None) -> tuple[int, int] | None:
    """The (xid, id) of a walk row whose event exists; converted only when needed."""
    if row is None or row[3] is None:
        return None
    return (int(str(row[3])), int(row[4]))  # type: ignore[call-overload]


def verify(
    conn: psycopg.Connection[tuple[object, ...]], *, against: tuple[int, bytes] | None = None
) -> VerifyResult:
    """Recompute the live chain from its start (seq 1, or after the last archived seq) and name
    the first broken seq, if any. A stored head inside the archived range is the archive files'
    to check (`audit verify --archive`): here it is a break of its own kind."""
    started = time.perf_counter()
    previous, expected = GENESIS, 1
    last: tuple[object, ...] | None = None  # the last row that verified
    broken: Break | None = None
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # A database restored from before the archive's revision (2026_12_05_0900) verifies too.
        archives = conn.execute("SELECT to_regclass('review_queue_archive') IS NOT NULL").fetchone()
        start = conn.execute(_START).fetchone() if archives and archives[0] else None
        if start is not None:
            previous, expected = bytes(start[1]), int(start[0]) + 1  # type: ignore[call-overload]
        start_seq, start_hash = expected - 1, previous
        if against is not None and against[0] < start_seq:
            broken = Break(
                against[0], "archived", f"seq {against[0]} is archived (verify the files with --archive)"
            )
        elif against is not None and against[0] == start_seq and against[1] != start_hash:
            broken = Break(against[0], "rewritten", "the archive's last hash is not the stored head's")
        # Binary rows: no text parsing of ints and bytea on the hot loop.
        with conn.cursor(name="review_queue_audit_verify", binary=True) as cursor:
            cursor.itersize = 10_000
            cursor.execute(_WALK)
            rows = iter(cursor)
            row = next(rows, None)
            while row is not None and broken is None:
                following = next(rows, None)
                seq, event_id, digest, xid = row[0], row[1], row[2], row[3]
                if seq != expected:
                    broken = Break(expected, "missing", f"no chain entry for seq {expected} (next is {seq})")
                    break
                if xid is None:
                    broken = Break(seq, "missing", f"event {event_id} sealed at seq {seq} is gone")
                    break
                computed = link(previous, event_fields(row[4:]))
                if computed != digest:
                    key, last_key, next_key = _key(row), _key(last), _key(following)
                    assert key is not None
                    if (last_key is not None and key < last_key) or (next_key is not None and key > next_key):
                        broken = Break(seq, "out of order", f"event {event_id} is not in its sealed place")
                    else:
                        broken = Break(
                            seq, "modified", f"event {event_id} no longer hashes to the sealed hash"
                        )
                    break
                if against is not None and seq == against[0] and computed != against[1]:
                    broken = Break(seq, "rewritten", f"hash {computed.hex()} is not the stored head's")
                    break
                previous, last, expected = computed, row, expected + 1
                row = following
        # Below the last verified event, or below the archive's last one when none is live.
        last_key = _key(last) or ((int(str(start[2])), int(str(start[3]))) if start is not None else None)
        if last_key is not None:
            found = conn.execute(_INSERTED, {"xid": str(last_key[0]), "id": last_key[1]}).fetchone()
            # Its seq: the first chained after it, or the next one when none is live.
            at = int(str(found[1])) if found is not None and found[1] is not None else expected
            if found is not None and (broken is None or at <= broken.seq):
                broken = Break(at, "inserted", f"event {found[0]} is not in the chain it sits in")
    if broken is None and against is not None and against[0] >= expected:
        broken = Break(against[0], "missing", f"the chain ends at seq {expected - 1}, before the stored head")
    return VerifyResult(
        expected - 1 - start_seq,
        expected - 1,
        previous,
        time.perf_counter() - started,
        broken,
        start_seq,
        start_hash,
    )


# ---------------------------------------------------------------------------------------------
# Export: the chain in order, in pages of short transactions, each line with the link into it.
# ---------------------------------------------------------------------------------------------

EXPORT_PAGE = 1000  # lines a page reads: about 500 KB, in one short transaction


@dataclass(frozen=True, slots=True)
class ExportPosition:
    """Where an export stands between two pages."""

    after: int  # the last seq exported (the seq before the range, at the start)
    last: int  # the last seq to export: what was asked for, capped at the head when it began
    previous: bytes  # the hash of seq `after`: what the next line links to


_EXPORT_START = text(
    "SELECT (SELECT hash FROM review_queue_chain WHERE seq = :before) AS previous,"
    " (SELECT max(seq) FROM review_queue_chain) AS head,"
    f" s.seq AS start_seq, s.hash AS start_hash FROM (SELECT) one LEFT JOIN ({_START}) s ON true"
)
_PAGE = text(
    f"SELECT c.seq, c.hash, {EVENT_FIELDS} FROM review_queue_chain c"
    " JOIN review_queue_event e ON e.id = c.event_id"
    " WHERE c.seq > :after AND c.seq <= :last ORDER BY c.seq LIMIT :limit"
)


_ONE_SNAPSHOT = text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
# Before the snapshot is taken (LOCK takes none): an archive drops whole months of the trail, which
# no snapshot keeps, so the trail is held until this transaction ends.
_HOLD_TRAIL = text("LOCK TABLE review_queue_event IN ACCESS SHARE MODE")
_ARCHIVED_THROUGH = text("SELECT coalesce(max(through_seq), 0) FROM review_queue_archive")


async def one_snapshot(conn: AsyncConnection) -> None:
    """The rest of this transaction reads one snapshot of the chain and its events: an export's
    start and the pages read in it agree, and an archive waits for it. Before its first query."""
    await conn.execute(_ONE_SNAPSHOT)
    await conn.execute(_HOLD_TRAIL)


class ExportArchived(RuntimeError):
    """The chain's start moved past the export's position (`review-queue archive` ran meanwhile)."""


async def export_start(conn: AsyncConnection, *, first: int, last: int) -> ExportPosition:
    """Where an export of seq `first` to `last` starts: the hash the range links to (32 zeros for
    seq 1), and its end, capped at the head now. Seqs already archived (db/archive.py) are in the
    archive's files: an export asked to start among them starts after the last one.

    The pages that follow each read in a transaction of their own, and together they are the
    chain as it stood here, as one snapshot would have read it: the chain is append-only (a
    trigger refuses UPDATE, DELETE and TRUNCATE), seqs are given in order under the sealer's lock
    (every seq up to the head read here is committed, anything sealed later is above it), and each
    page is a keyset range on seq (the primary key) below the cap.
    """
    row = (await conn.execute(_EXPORT_START, {"before": first - 1})).one()
    if row.start_seq is not None and first - 1 <= row.start_seq:
        # The seqs up to the start are archived: the export begins where the live chain does.
        return ExportPosition(
            after=row.start_seq, last=min(last, row.head or row.start_seq), previous=bytes(row.start_hash)
        )
    previous = GENESIS if first <= 1 or row.previous is None else bytes(row.previous)
    return ExportPosition(after=first - 1, last=min(last, row.head or 0), previous=previous)


async def _missing(conn: AsyncConnection, seq: int) -> None:
    """Every seq up to the export's cap was committed when it began. One missing since was archived
    meanwhile: the export stops (ExportArchived). Otherwise its event is gone, and the lines go on
    without it, for verification to name."""
    if seq <= (await conn.scalar(_ARCHIVED_THROUGH) or 0):
        raise ExportArchived(f"seq {seq} was archived during the export")


async def export_page(
    conn: AsyncConnection, *, at: ExportPosition, limit: int = EXPORT_PAGE
) -> tuple[bytes, ExportPosition | None]:
    """The export's next lines after `at` as NDJSON (db/chain.export_line), and where the page
    after starts (None: the export is complete)."""
    rows = (await conn.execute(_PAGE, {"after": at.after, "last": at.last, "limit": limit})).all()
    lines, seq, previous = [], at.after, at.previous
    for row in rows:
        if int(row[0]) != seq + 1:
            await _missing(conn, seq + 1)
        seq, digest = int(row[0]), bytes(row[1])
        lines.append(export_line(seq, previous, digest, event_fields(tuple(row[2:]))))
        previous = digest
    if len(rows) < limit and seq < at.last:
        await _missing(conn, seq + 1)
    done = len(rows) < limit or seq >= at.last
    return b"".join(lines), None if done else ExportPosition(after=seq, last=at.last, previous=previous)
