"""`review-queue audit`: the audit trail's hash chain: seal, head, verify, export."""

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.ext.asyncio import AsyncConnection

from api.logs import configure_logging
from api.settings import get_settings
from cli.common import command_group, in_transaction, resolved_url
from db.engine import libpq_url

audit_app = command_group("The audit trail's hash chain: seal, head, verify, export.")


@audit_app.command("seal")
def audit_seal(
    once: Annotated[
        bool, typer.Option("--once", help="Seal what is ready and exit (the default).", show_default=False)
    ] = True,
) -> None:
    """Chain every event of a finished transaction now.

    The reclaimer does it every interval."""
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    count = asyncio.run(reclaimer.seal_once(settings, resolved_url(settings)))
    typer.echo(f"sealed {count}")


@audit_app.command("head")
def audit_head() -> None:
    """Print the chain's head as SEQ:HASH, to store outside the database."""
    from db import audit, chain

    seq, digest = in_transaction(audit.head)
    typer.echo(chain.format_head(seq, digest))


@audit_app.command("verify")
def audit_verify(
    against: Annotated[
        str | None, typer.Option(help="SEQ:HASH from `audit head`: the history up to it must be unchanged.")
    ] = None,
    file: Annotated[
        str | None, typer.Option(help="Verify this export instead, with no database access.")
    ] = None,
    archive: Annotated[
        Path | None,
        typer.Option(
            help="The directory of `review-queue archive`'s files: verify them and the live chain as one."
        ),
    ] = None,
) -> None:
    """Recompute the chain; exit 1 naming the first broken seq.

    Exit 0 when intact. With --file, a file that holds no line at all exits 1 too: nothing was
    verified. After an archive, the live chain starts where the archive's files end: --archive
    checks the files too, from genesis."""
    import time

    from db import chain

    try:
        head = chain.parse_head(against) if against else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--against") from None
    if file is not None:
        started = time.perf_counter()
        result = chain.verify_lines(chain.iter_file(file), against=head)
        if result.events == 0 and result.broken is None:
            # An empty file proves nothing; "intact" would read as a clean audit.
            typer.echo(f"NOTHING VERIFIED: {file} holds no export lines", err=True)
            raise typer.Exit(1)
        seconds, events, broken = time.perf_counter() - started, result.events, result.broken
        scope = "no events"
        if result.last_seq is not None and result.last_hash is not None:
            last = chain.format_head(result.last_seq, result.last_hash)
            scope = f"seq {result.first_seq}..{result.last_seq}, head {last}"
    else:
        import psycopg

        from db import archive as archives
        from db import audit

        started = time.perf_counter()
        with psycopg.connect(libpq_url(resolved_url(get_settings())), autocommit=True) as conn:
            files, filed, broken, strays = [], 0, None, []
            if archive is not None:
                files = archives.archived(conn)
                filed, broken = archives.verify_files(files, archive, against=head)
                strays = archives.unlisted(files, archive)
            live_against = head if head is None or not files or head[0] > files[-1].through_seq else None
            outcome = audit.verify(conn, against=live_against)
        joined = (files[-1].through_seq, files[-1].through_hash) if files else (0, chain.GENESIS)
        if archive is not None and broken is None and (outcome.start_seq, outcome.start_hash) != joined:
            broken = chain.Break(
                outcome.start_seq, "missing", "the live chain does not start where the files end (run again)"
            )
        seconds, events, broken = (
            time.perf_counter() - started,
            filed + outcome.events,
            broken or outcome.broken,
        )
        scope = f"head {chain.format_head(outcome.head_seq, outcome.head_hash)}"
        if strays:
            typer.echo(f"not archived (no archived range lists them): {', '.join(strays)}", err=True)
        if outcome.start_seq:
            where = f"{len(files)} archive files and " if archive is not None else ""
            scope += f"; {where}the live chain from seq {outcome.start_seq + 1}"
    rate = events / seconds if seconds > 0 else 0.0
    typer.echo(f"verified {events} events in {seconds:.2f} s ({rate:,.0f} events/s); {scope}")
    if broken is not None:
        typer.echo(f"BROKEN at {broken}", err=True)
        raise typer.Exit(1)
    typer.echo("intact" + (f", and matches {against}" if against else ""))


@audit_app.command("export")
def audit_export(
    file: Annotated[str, typer.Option(help="Write the NDJSON here.")],
    first: Annotated[int, typer.Option("--from", min=1, help="First seq.")] = 1,
    last: Annotated[int | None, typer.Option("--to", min=1, help="Last seq (default: the head).")] = None,
) -> None:
    """Write the chain from --from to --to as NDJSON, like the API.

    The same lines as GET /audit/export."""
    from db import audit

    upto = last if last is not None else 2**63 - 1

    with open(file, "wb") as out:

        async def write(conn: AsyncConnection) -> int:
            # One transaction, one snapshot, for every page: no pool to keep free here, and an
            # archive that commits meanwhile does not move the chain's start under the export.
            await audit.one_snapshot(conn)
            at: audit.ExportPosition | None = await audit.export_start(conn, first=first, last=upto)
            size = 0
            while at is not None:
                chunk, at = await audit.export_page(conn, at=at)
                out.write(chunk)
                size += chunk.count(b"\n")
            return size

        count = in_transaction(write)
    typer.echo(f"exported {count} events to {file}")
