"""`review-queue archive`: move the chain's oldest range, its events and the items it leaves with
none, to NDJSON files, then delete them from the database (db/archive.py)."""

import getpass
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, BinaryIO

import psycopg
import typer
from psycopg.rows import TupleRow

from api.settings import get_settings
from cli.common import owner_url
from db import archive as archives
from db.chain import iter_file, verify_lines
from db.engine import libpq_url


def default_cutoff(now: datetime, retain_days: int) -> datetime:
    """The first of the month (UTC) at or before now - retain_days."""
    edge = now.astimezone(UTC) - timedelta(days=retain_days)
    return datetime(edge.year, edge.month, 1, tzinfo=UTC)


def parse_cutoff(value: str, *, now: datetime, retain_days: int) -> datetime:
    try:
        day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise typer.BadParameter(f"not a date (YYYY-MM-DD): {value!r}", param_hint="--before") from None
    if day.day != 1:
        raise typer.BadParameter(
            f"{value} is not the first of a month: the trail is kept in months", param_hint="--before"
        )
    if day > now.astimezone(UTC) - timedelta(days=retain_days):
        raise typer.BadParameter(
            f"{value} is within REVIEW_QUEUE_RETAIN_RESOLVED_DAYS ({retain_days} days): the latest cutoff"
            f" is {default_cutoff(now, retain_days):%Y-%m-%d}",
            param_hint="--before",
        )
    return day


def archive(
    to: Annotated[Path, typer.Option(help="The directory the files go to (created if missing).")],
    before: Annotated[
        str | None,
        typer.Option(
            help="The cutoff, the first of a month (YYYY-MM-01, UTC). Default: the latest one"
            " REVIEW_QUEUE_RETAIN_RESOLVED_DAYS allows."
        ),
    ] = None,
) -> None:
    """Move the history before a month to files, out of the database.

    Writes events-FIRST-LAST.ndjson (the chain's export lines, up to the last event before the
    cutoff) and items-FIRST-LAST.ndjson (the resolved items left with no event), verifies them,
    and only then deletes them, in one transaction that checks nothing changed in between. Nothing
    open is archived. `review-queue audit verify --archive DIR` checks the files and the live chain
    as one. Runs as the schema owner (REVIEW_QUEUE_MIGRATION_DATABASE_URL)."""
    settings = get_settings()
    url = libpq_url(owner_url(settings))
    with psycopg.connect(url) as conn:
        now = archives.database_now(conn)
    cutoff = (
        parse_cutoff(before, now=now, retain_days=settings.retain_resolved_days)
        if before is not None
        else default_cutoff(now, settings.retain_resolved_days)
    )
    try:
        done = archive_to(url, cutoff, to, archived_by=getpass.getuser())
    except archives.ArchiveRefused as refused:
        typer.echo(f"review-queue archive: refused, nothing deleted: {refused}", err=True)
        raise typer.Exit(1) from None
    except archives.ArchiveUnknown as unknown:
        typer.echo(f"review-queue archive: {unknown}", err=True)
        raise typer.Exit(1) from None
    if done.items_finished:
        typer.echo(f"deleted {done.items_finished} items an interrupted archive had left")
    if done.span is None:
        typer.echo(f"nothing before {cutoff:%Y-%m-%d} is live: nothing archived")
        return
    span, kept = done.span, done.items_in_file - done.items_deleted
    typer.echo(
        f"archived seq {span.first_seq}..{span.through_seq}"
        f" ({done.events} events, {done.items_deleted} items) before {cutoff:%Y-%m-%d} to {to};"
        f" the live chain starts after seq {span.through_seq}"
        + (f"; {kept} items of the file stay live (they changed after it was written)" if kept else "")
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    span: archives.Range | None  # None: nothing before the cutoff was live
    events: int  # removed from the database
    items_in_file: int
    items_deleted: int  # the file's items with no event left (the others stay live)
    items_finished: int  # items of the archive before, left by an interrupted run and deleted now


def archive_to(url: str, cutoff: datetime, to: Path, *, archived_by: str) -> Outcome:
    """The archive before `cutoff` into `to`, as the schema owner at `url`. ArchiveRefused, with
    nothing deleted and no file left, when it cannot be done now. Files are created, never
    overwritten, and only the files this run created are removed when it fails."""
    to.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(url) as conn:
        archives.run_lock(conn)
        finished = _finish_previous(conn, to)
        created: list[Path] = []
        committing: archives.Range | None = None  # the range whose commit was asked for
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                span = archives.plan(conn, cutoff)
                if span is None:
                    return Outcome(None, 0, 0, 0, finished)
                with _create(to / archives.events_file(span.name), created) as out:
                    events_sha256 = archives.write_events(conn, span, out)
                with _create(to / archives.items_file(span.name), created) as out:
                    items, items_sha256 = archives.write_items(conn, span, out)
            _check(to, span)
            with conn.transaction():
                removed = archives.apply(
                    conn,
                    span,
                    items=items,
                    events_sha256=events_sha256,
                    items_sha256=items_sha256,
                    archived_by=archived_by,
                )
                committing = span  # what fails from here may have committed
        except BaseException as error:
            # Only a COMMIT that got no answer may have happened; one the server refused did not.
            if committing is not None and (conn.broken or not isinstance(error, psycopg.Error)):
                raise archives.ArchiveUnknown(
                    f"the run ended while the archive of seq {committing.first_seq}..{committing.through_seq}"
                    f" committed ({type(error).__name__}: {error}); its files in {to} are kept:"
                    f" `review-queue audit verify --archive {to}` says whether it is archived (a file it"
                    " does not list is not: remove it and run again)"
                ) from error
            # Files of an archive that did not happen would read as one.
            for path in created:
                path.unlink(missing_ok=True)
            raise
        deleted = archives.delete_items(conn, to / archives.items_file(span.name))
    return Outcome(span, removed, items, deleted, finished)


def _create(path: Path, created: list[Path]) -> BinaryIO:
    """A new file, never one that is there: a file of that name is not this database's archive
    (its archived ranges start after the last one), so it belongs to someone else."""
    try:
        handle = path.open("xb")
    except FileExistsError:
        raise archives.ArchiveRefused(
            f"{path} is already there and is no archive of this database: it is left from a run"
            " that did not commit, or another database's; move it away and run again"
        ) from None
    created.append(path)
    return handle


def _finish_previous(conn: psycopg.Connection[TupleRow], to: Path) -> int:
    """The items an interrupted run left (its deletion of items comes after its commit): those of
    the last archive's items file, when it is in `to` and is the file archived."""
    done = archives.archived(conn)
    conn.rollback()
    if not done:
        return 0
    path = to / archives.items_file(done[-1].name)
    if not path.is_file() or archives.file_sha256(path) != done[-1].items_sha256:
        return 0
    return archives.delete_items(conn, path)


def _check(to: Path, span: archives.Range) -> None:
    """Both files on disk (fsync), and the events file a chain that verifies alone, from the live
    chain's start to the range's end: what is about to be deleted is readable back."""
    events = to / archives.events_file(span.name)
    for path in (events, to / archives.items_file(span.name)):
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
    check = verify_lines(iter_file(str(events)), against=(span.through_seq, span.through_hash))
    if check.broken is not None:
        raise archives.ArchiveRefused(f"{events} does not verify: {check.broken}")
    if (check.first_seq, check.first_prev, check.events) != (span.first_seq, span.previous, span.events):
        raise archives.ArchiveRefused(f"{events} does not hold seq {span.first_seq}..{span.through_seq}")
