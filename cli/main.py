"""The `review-queue` command: serve, migrate, tokens, reclaim."""

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncConnection

from api.logs import configure_logging
from api.settings import Settings, get_settings
from db import tokens
from db.engine import create_engine, database_url, libpq_url, migration_url, transaction
from db.migrations import upgrade_head

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
token_app = typer.Typer(no_args_is_help=True, help="Create, revoke and list API tokens.")
app.add_typer(token_app, name="token")
audit_app = typer.Typer(
    no_args_is_help=True, help="The audit trail's hash chain: seal, head, verify, export."
)
app.add_typer(audit_app, name="audit")

T = TypeVar("T")


class Role(StrEnum):
    reviewer = "reviewer"
    ingest = "ingest"
    auditor = "auditor"
    admin = "admin"


def resolved_url(settings: Settings) -> str:
    return database_url(settings.database_url, settings.data_dir)


def owner_url(settings: Settings) -> str:
    return migration_url(settings.migration_database_url, settings.database_url, settings.data_dir)


def migrate_to_head(settings: Settings) -> None:
    upgrade_head(owner_url(settings), app_role=settings.app_role)


def in_transaction(fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Run fn in one committed transaction on a short-lived engine."""
    settings = get_settings()

    async def run() -> T:
        engine = create_engine(resolved_url(settings), pool_size=1, max_overflow=0)
        try:
            async with transaction(
                engine,
                lock_timeout_ms=settings.pg_lock_timeout_ms,
                statement_timeout_ms=settings.statement_timeout_ms,
            ) as conn:
                return await fn(conn)
        finally:
            await engine.dispose()

    return asyncio.run(run())


@app.command()
def migrate() -> None:
    """Bring the schema to the newest migration (alembic upgrade head)."""
    migrate_to_head(get_settings())
    typer.echo("schema is at head")


@token_app.command("create")
def token_create(
    subject: Annotated[str, typer.Option(help="Who the token speaks for; written to leased_by.")],
    role: Annotated[Role, typer.Option(help="reviewer, ingest, auditor or admin.")],
) -> None:
    """Create a token. It is printed once, alone on the last line, and never stored."""
    token = in_transaction(lambda conn: tokens.create_token(conn, subject=subject, role=role.value))
    typer.echo(f"created a {role.value} token for {subject}:")
    typer.echo(token)


@token_app.command("revoke")
def token_revoke(subject: Annotated[str, typer.Option(help="Revoke every token of this subject.")]) -> None:
    """Revoke all of a subject's tokens."""
    count = in_transaction(lambda conn: tokens.revoke_tokens(conn, subject=subject))
    typer.echo(f"revoked {count} token(s) of {subject}")


@token_app.command("list")
def token_list() -> None:
    """List tokens (never the secrets)."""
    for info in in_transaction(tokens.list_tokens):
        state = f"revoked {info.revoked_at:%Y-%m-%d %H:%M}" if info.revoked_at else "active"
        typer.echo(
            f"{info.id:>5}  {info.subject:<24} {info.role:<9} {info.created_at:%Y-%m-%d %H:%M}  {state}"
        )


@app.command()
def reclaim(
    once: Annotated[bool, typer.Option("--once", help="Run one drain and exit (the default).")] = True,
) -> None:
    """Return expired leases to the queue now, draining batch after batch; prints how many."""
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    count = asyncio.run(reclaimer.drain_once(settings, resolved_url(settings)))
    typer.echo(f"reclaimed {count}")


@app.command("reclaimer")
def reclaimer_loop() -> None:
    """Reclaim expired leases every REVIEW_QUEUE_RECLAIM_INTERVAL_S until SIGTERM/SIGINT."""
    # A stop signal before the loop installs its own handlers (while the embedded server starts,
    # say) is still a clean stop, not a KeyboardInterrupt traceback and exit 130.
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(reclaimer.run_forever(settings, resolved_url(settings), stop))


@audit_app.command("seal")
def audit_seal(
    once: Annotated[bool, typer.Option("--once", help="Seal what is ready and exit (the default).")] = True,
) -> None:
    """Chain every event of a finished transaction now (the reclaimer does it every interval)."""
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
) -> None:
    """Recompute the chain; exit 0 when intact, 1 naming the first broken sequence number."""
    import time

    from db import chain

    try:
        head = chain.parse_head(against) if against else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--against") from None
    if file is not None:
        started = time.perf_counter()
        result = chain.verify_lines(chain.iter_file(file), against=head)
        seconds, events, broken = time.perf_counter() - started, result.events, result.broken
        scope = "no events"
        if result.last_seq is not None and result.last_hash is not None:
            last = chain.format_head(result.last_seq, result.last_hash)
            scope = f"seq {result.first_seq}..{result.last_seq}, head {last}"
    else:
        import psycopg

        from db import audit

        with psycopg.connect(libpq_url(resolved_url(get_settings()))) as conn:
            outcome = audit.verify(conn, against=head)
        seconds, events, broken = outcome.seconds, outcome.events, outcome.broken
        scope = f"head {chain.format_head(outcome.head_seq, outcome.head_hash)}"
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
    """Write the chain from --from to --to as NDJSON, as GET /audit/export does."""
    from db import audit

    upto = last if last is not None else 2**63 - 1

    with open(file, "wb") as out:

        async def write(conn: AsyncConnection) -> int:
            previous = await audit.link_into(conn, first=first)
            size = 0
            async for chunk in audit.export_ndjson(conn, first=first, last=upto, previous=previous):
                out.write(chunk)
                size += chunk.count(b"\n")
            return size

        count = in_transaction(write)
    typer.echo(f"exported {count} events to {file}")


@app.command()
def stats() -> None:
    """Print queue depth, age and leases in flight."""
    from datetime import timedelta

    from db import stats as queue_stats

    settings = get_settings()

    async def read(conn: AsyncConnection) -> tuple[queue_stats.QueueGauges, int, dict[str, int]]:
        gauges = await queue_stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
        return gauges, await queue_stats.resolved_count(conn), await queue_stats.open_leases_by_reviewer(conn)

    gauges, resolved, by_reviewer = in_transaction(read)
    age = f"{gauges.oldest_pending_age_s:.1f} s" if gauges.oldest_pending_age_s is not None else "-"
    rows = [
        ("pending", str(gauges.pending)),
        ("assigned", f"{gauges.assigned} of max_inflight {settings.max_inflight}"),
        ("resolved", str(resolved)),
        ("quarantined", str(gauges.quarantined)),
        ("oldest pending age", age),
        ("expired, not reclaimed", str(gauges.expired_unreclaimed)),
        ("past the reclaim grace", str(gauges.reclaimable)),
    ]
    rows += [(f"  leased by {reviewer}", str(count)) for reviewer, count in by_reviewer.items()]
    for label, value in rows:
        typer.echo(f"{label:<26} {value}")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default PORT or 8000).")] = None,
    workers: Annotated[int | None, typer.Option(help="Uvicorn worker processes.")] = None,
    with_reclaimer: Annotated[
        bool, typer.Option("--reclaimer/--no-reclaimer", help="Run the reclaimer as a child process.")
    ] = True,
) -> None:
    """Migrate, then serve the API beside a reclaimer (dev tokens printed on the embedded database)."""
    import shutil
    import subprocess
    import tempfile

    import uvicorn

    from cli import devtokens

    settings = get_settings()
    migrate_to_head(settings)
    url = resolved_url(settings)
    _warn_if_privileged(url)
    if settings.database_url is None:
        devtokens.ensure_and_print(settings, host or settings.host, port or settings.port)
    # Workers and the reclaimer child must reach the same database without starting their own
    # embedded server, and write their counters where one /metrics scrape sums them all.
    os.environ["DATABASE_URL"] = url
    metrics_dir = None
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="review-queue-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    get_settings.cache_clear()
    _raise_open_file_limit()
    child = subprocess.Popen([sys.executable, "-m", "cli", "reclaimer"]) if with_reclaimer else None
    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit
    # instead runs the cleanup below and lets atexit stop the embedded server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(
            "api.app:create_app",
            factory=True,
            host=host or settings.host,
            port=port or settings.port,
            workers=workers or settings.workers,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=20,
            proxy_headers=bool(settings.forwarded_allow_ips),
            forwarded_allow_ips=settings.forwarded_allow_ips or None,
        )
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=20)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _warn_if_privileged(url: str) -> None:
    """The audit trail's append-only promise holds against the application role only."""
    import psycopg

    with psycopg.connect(libpq_url(url)) as conn:
        superuser, owner = conn.execute(
            "SELECT rolsuper, pg_has_role(current_user, (SELECT tableowner FROM pg_tables"
            " WHERE tablename = 'review_queue_event'), 'MEMBER') FROM pg_roles WHERE rolname = current_user"
        ).fetchone() or (False, False)
    if superuser or owner:
        typer.echo(
            "warning: DATABASE_URL's role owns the tables or is a superuser, so it could edit the audit"
            " trail; serve as an application role (docs/security.md)",
            err=True,
        )


def _raise_open_file_limit() -> None:
    # uvicorn never closes a connection that has not sent a complete request head, so idle or
    # half-open sockets last until the client goes; the open-file limit is the ceiling. Take the
    # hard limit (production runs behind a proxy with header timeouts: docs/security.md).
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )


def main() -> None:
    app()
