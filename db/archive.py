"""Archive: the chain's oldest range, its events and the items it leaves with none, to NDJSON files.

The range is the chain from where the live chain starts up to the last sealed event before the
cutoff, in chain order. Chain order is (xid, id), not time: a transaction that began just before
the cutoff may take its xid after one that began just after it, so the range may also hold a few
events from just after the cutoff. Every event before the cutoff is in it. The events file is the
chain's own export lines (db/chain.export_line), so `audit verify --file` checks it alone; the items
file holds each archived item as PostgreSQL's `to_jsonb` of its row (NUMERIC amounts stay exact).

Reading runs in one REPEATABLE READ snapshot, as the schema owner; the deletion is
`review_queue_archive_apply` (alembic/versions/2026_12_05_0900_archive.py), which re-checks what the
files were built on, so a change in between refuses the archive instead of losing anything; the
items go after its commit (delete_items), those that still have no event left.
"""

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

import psycopg
from psycopg.rows import TupleRow

from db.audit import EVENT_FIELDS, event_fields
from db.chain import GENESIS, Break, export_line, iter_file, verify_lines

REFUSED_SQLSTATE = "RQ010"  # review_queue_archive_apply's refusals
OPEN_ITEMS_SHOWN = 10


class ArchiveRefused(RuntimeError):
    """The range cannot be archived now; the message says why and what to do."""


class ArchiveUnknown(RuntimeError):
    """The connection failed while the archive committed: whether it did is for `audit verify
    --archive` to say, so its files are kept."""


@dataclass(frozen=True, slots=True)
class Range:
    cutoff: datetime
    first_seq: int
    through_seq: int
    previous: bytes  # the hash the range's first line links to
    through_hash: bytes
    through_xid: str
    through_id: int

    @property
    def events(self) -> int:
        return self.through_seq - self.first_seq + 1

    @property
    def name(self) -> str:
        return range_name(self.first_seq, self.through_seq)


@dataclass(frozen=True, slots=True)
class Archived:
    """A row of review_queue_archive: a range moved to files."""

    cutoff: datetime
    first_seq: int
    through_seq: int
    through_hash: bytes
    events: int
    items: int
    events_sha256: str
    items_sha256: str
    archived_at: datetime

    @property
    def name(self) -> str:
        return range_name(self.first_seq, self.through_seq)


def range_name(first_seq: int, through_seq: int) -> str:
    """FIRST-LAST in the archive's file names, zero-padded so that they sort in chain order."""
    return f"{first_seq:012d}-{through_seq:012d}"


def events_file(name: str) -> str:
    return f"events-{name}.ndjson"


def items_file(name: str) -> str:
    return f"items-{name}.ndjson"


_ARCHIVED = (
    "SELECT cutoff, first_seq, through_seq, through_hash, events, items, events_sha256, items_sha256,"
    " archived_at FROM review_queue_archive ORDER BY through_seq"
)
# The newest event before the cutoff (the month partitions before it, each read backwards on
# (xid, id)) and its place in the chain: NULL when it is not sealed yet.
_LAST_BEFORE = """
SELECT e.xid::text, e.id, c.seq, c.hash FROM review_queue_event e
LEFT JOIN review_queue_chain c ON c.event_id = e.id
WHERE e.at < %(cutoff)s ORDER BY e.xid DESC, e.id DESC LIMIT 1
"""
_OPEN = """
SELECT i.id::text FROM review_queue_item i
WHERE i.state <> 'RESOLVED' AND EXISTS (
    SELECT FROM review_queue_event e WHERE e.item_id = i.id AND (e.xid, e.id) <= (%(xid)s::xid8, %(id)s))
ORDER BY i.id LIMIT %(limit)s
"""
_EVENTS = (
    f"SELECT c.seq, c.hash, {EVENT_FIELDS} FROM review_queue_chain c"
    " JOIN review_queue_event e ON e.id = c.event_id"
    " WHERE c.seq >= %(first)s AND c.seq <= %(through)s ORDER BY c.seq"
)
# The resolved items with an event in the range and none after it: the ones the archive deletes.
_ITEMS = """
SELECT to_jsonb(i)::text FROM review_queue_item i
WHERE i.id IN (SELECT e.item_id FROM review_queue_event e WHERE (e.xid, e.id) <= (%(xid)s::xid8, %(id)s))
  AND i.state = 'RESOLVED'
  AND NOT EXISTS (
    SELECT FROM review_queue_event e WHERE e.item_id = i.id AND (e.xid, e.id) > (%(xid)s::xid8, %(id)s))
ORDER BY i.id
"""
_APPLY = (
    "SELECT review_queue_archive_apply(%(cutoff)s, %(first)s, %(previous)s, %(through)s, %(hash)s,"
    " %(items)s, %(events_sha256)s, %(items_sha256)s, %(by)s)"
)
# One archive at a time, for the whole run (plan, files, apply, items): a session lock, released
# when the connection closes, however the run ends.
_RUN_LOCK = "SELECT pg_try_advisory_lock(hashtext('review_queue.archive'))"
# An item of the file goes once it has no event left (the archive removed them all): one that was
# reopened or gained an event since the file was written keeps its live row (the file holds its
# earlier state). Its row in the SLA gauge's list of reopened items goes with it.
_DELETE_ITEMS = """
WITH gone AS (
    DELETE FROM review_queue_item i WHERE i.id = ANY(%(ids)s::uuid[]) AND i.state = 'RESOLVED'
      AND NOT EXISTS (SELECT FROM review_queue_event e WHERE e.item_id = i.id)
    RETURNING i.id
), unlisted AS (
    DELETE FROM review_queue_reopened_item r USING gone WHERE r.item_id = gone.id
)
SELECT count(*) FROM gone
"""
ITEMS_BATCH = 5_000


def database_now(conn: psycopg.Connection[TupleRow]) -> datetime:
    """The database's clock: the cutoff's retention is counted on it, as every decision of the service."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def run_lock(conn: psycopg.Connection[TupleRow]) -> None:
    """This session's hold on the archive, until it closes; ArchiveRefused when another run has it."""
    row = conn.execute(_RUN_LOCK).fetchone()
    conn.commit()
    if not (row and row[0]):
        raise ArchiveRefused("another `review-queue archive` is running on this database: wait for it")


def archived(conn: psycopg.Connection[TupleRow]) -> list[Archived]:
    return [
        Archived(
            cutoff=r[0],
            first_seq=int(r[1]),
            through_seq=int(r[2]),
            through_hash=bytes(r[3]),
            events=int(r[4]),
            items=int(r[5]),
            events_sha256=str(r[6]),
            items_sha256=str(r[7]),
            archived_at=r[8],
        )
        for r in conn.execute(_ARCHIVED)
    ]


def plan(conn: psycopg.Connection[TupleRow], cutoff: datetime) -> Range | None:
    """The range an archive before `cutoff` moves (None: nothing before it is live), or why not."""
    done = archived(conn)
    start_seq, previous = (done[-1].through_seq, done[-1].through_hash) if done else (0, GENESIS)
    last = conn.execute(_LAST_BEFORE, {"cutoff": cutoff}).fetchone()
    if last is None:
        return None
    xid, id_, seq, digest = last
    if seq is None:
        raise ArchiveRefused(
            f"event {id_} (before {cutoff:%Y-%m-%d}) is not sealed yet: run `review-queue audit seal`"
            " (a transaction still open since before the cutoff holds the sealer back)"
        )
    open_items = [
        str(r[0])
        for r in conn.execute(_OPEN, {"xid": str(xid), "id": id_, "limit": OPEN_ITEMS_SHOWN})
    ]  # fmt: skip
    if open_items:
        raise ArchiveRefused(
            "nothing open is archived, and these items are not RESOLVED but have events before the"
            f" cutoff: {', '.join(open_items)}{' (and more)' if len(open_items) == OPEN_ITEMS_SHOWN else ''};"
            " resolve them, or archive before an earlier month"
        )
    return Range(
        cutoff=cutoff,
        first_seq=start_seq + 1,
        through_seq=int(seq),
        previous=previous,
        through_hash=bytes(digest),
        through_xid=str(xid),
        through_id=int(id_),
    )


def _stream(
    conn: psycopg.Connection[TupleRow], name: str, query: str, params: dict[str, object]
) -> Iterator[TupleRow]:
    with conn.cursor(name=name, binary=False) as cursor:
        cursor.itersize = 10_000
        cursor.execute(query, params)
        yield from cursor


def write_events(conn: psycopg.Connection[TupleRow], r: Range, out: IO[bytes]) -> str:
    """The range's export lines to `out`; their sha256. Raises if a seq is not where it belongs."""
    digest, previous, expected = hashlib.sha256(), r.previous, r.first_seq
    for row in _stream(
        conn, "review_queue_archive_events", _EVENTS, {"first": r.first_seq, "through": r.through_seq}
    ):
        seq, link = int(row[0]), bytes(row[1])
        if seq != expected:
            raise ArchiveRefused(f"the chain has no seq {expected}: run `review-queue audit verify`")
        line = export_line(seq, previous, link, event_fields(row[2:]))
        out.write(line)
        digest.update(line)
        previous, expected = link, expected + 1
    if expected != r.through_seq + 1:
        raise ArchiveRefused(f"the chain ends at seq {expected - 1}, before {r.through_seq}")
    return digest.hexdigest()


def write_items(conn: psycopg.Connection[TupleRow], r: Range, out: IO[bytes]) -> tuple[int, str]:
    """The items the archive deletes, one `to_jsonb` line each, to `out`: how many, and the sha256."""
    digest, count = hashlib.sha256(), 0
    params = {"xid": r.through_xid, "id": r.through_id}
    for (row,) in _stream(conn, "review_queue_archive_items", _ITEMS, params):
        line = str(row).encode() + b"\n"
        out.write(line)
        digest.update(line)
        count += 1
    return count, digest.hexdigest()


def apply(
    conn: psycopg.Connection[TupleRow],
    r: Range,
    *,
    items: int,
    events_sha256: str,
    items_sha256: str,
    archived_by: str,
) -> int:
    """Delete the range's events and chain rows and move the chain's start (in the caller's
    transaction): the events removed. ArchiveRefused when the database no longer matches the files.
    The items go afterwards (delete_items)."""
    params = {
        "cutoff": r.cutoff,
        "first": r.first_seq,
        "previous": r.previous,
        "through": r.through_seq,
        "hash": r.through_hash,
        "items": items,
        "events_sha256": events_sha256,
        "items_sha256": items_sha256,
        "by": archived_by,
    }
    try:
        row = conn.execute(_APPLY, params).fetchone()
    except psycopg.errors.LockNotAvailable:
        raise ArchiveRefused(
            "the trail is in use (an export or another long transaction holds a month to be dropped):"
            " run again"
        ) from None
    except psycopg.Error as error:
        if error.sqlstate == REFUSED_SQLSTATE:
            raise ArchiveRefused(error.diag.message_primary or str(error)) from None
        raise
    return int(row[0]) if row else 0


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_files(
    rows: list[Archived], directory: Path, *, against: tuple[int, bytes] | None = None
) -> tuple[int, Break | None]:
    """Every archive's files in `directory`, as review_queue_archive lists them: each the file that
    was archived (sha256), its events file a chain that verifies on its own, and each linked to the
    one before, from genesis. The events verified, and the first break."""
    previous, expected, total = GENESIS, 1, 0
    for row in rows:
        path, items = directory / events_file(row.name), directory / items_file(row.name)
        for each, sha in ((path, row.events_sha256), (items, row.items_sha256)):
            if not each.is_file():
                return total, Break(row.first_seq, "missing", f"{each} is not there")
            if file_sha256(each) != sha:
                return total, Break(row.first_seq, "modified", f"{each} is not the file archived (sha256)")
        inside = against if against is not None and row.first_seq <= against[0] <= row.through_seq else None
        result = verify_lines(iter_file(str(path)), against=inside)
        if result.broken is not None:
            return total, result.broken
        if (result.first_seq, result.first_prev) != (expected, previous):
            return total, Break(expected, "missing", f"{path} does not continue the archive before it")
        if (result.last_seq, result.last_hash) != (row.through_seq, row.through_hash):
            return total, Break(row.through_seq, "modified", f"{path} does not end where the archive did")
        previous, expected, total = row.through_hash, row.through_seq + 1, total + result.events
    return total, None


def unlisted(rows: list[Archived], directory: Path) -> list[str]:
    """The archive-named files in `directory` that no archived range lists: left by a run that did
    not commit (or another database's), never part of the record."""
    listed = {name(row.name) for row in rows for name in (events_file, items_file)}
    found = sorted(p.name for name in (events_file, items_file) for p in directory.glob(name("*")))
    return [each for each in found if each not in listed]


def item_ids(path: Path) -> Iterator[list[str]]:
    """The ids of an items file, in batches of ITEMS_BATCH."""
    batch: list[str] = []
    with path.open("rb") as handle:
        for line in handle:
            batch.append(str(json.loads(line)["id"]))
            if len(batch) == ITEMS_BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def delete_items(conn: psycopg.Connection[TupleRow], path: Path) -> int:
    """Delete the items of an applied archive's items file that have no event left, a batch per
    transaction (row locks held briefly); how many. Safe to run again: what is gone stays gone."""
    deleted = 0
    for ids in item_ids(path):
        with conn.transaction():
            row = conn.execute(_DELETE_ITEMS, {"ids": ids}).fetchone()
            deleted += int(row[0]) if row else 0
    return deleted
