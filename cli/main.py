"""The `review-queue` command: serve, migrate, tokens, reclaim."""

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncConnection

from api.settings import Settings, get_settings
from cli import reclaimer
from db import tokens
from db.engine import create_engine, database_url, set_transaction_timeouts
from db.migrations import upgrade_head

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
token_app = typer.Typer(no_args_is_help=True, help="Create, revoke and list API tokens.")
app.add_typer(token_app, name="token")

T = TypeVar("T")


class Role(StrEnum):
    reviewer = "reviewer"
    ingest = "ingest"
    admin = "admin"


def resolved_url(settings: Settings) -> str:
    return database_url(settings.database_url, settings.data_dir)


def in_transaction(fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Run fn in one committed transaction on a short-lived engine."""
    settings = get_settings()

    async def run() -> T:
        engine = create_engine(resolved_url(settings), pool_size=1, max_overflow=0)
        try:
            async with engine.begin() as conn:
                await set_transaction_timeouts(
                    conn,
                    lock_timeout_ms=settings.pg_lock_timeout_ms,
                    statement_timeout_ms=settings.statement_timeout_ms,
                )
                return await fn(conn)
        finally:
            await engine.dispose()

    return asyncio.run(run())


@app.command()
def migrate() -> None:
    """Bring the schema to the newest migration (alembic upgrade head)."""
    upgrade_head(resolved_url(get_settings()))
    typer.echo("schema is at head")


@token_app.command("create")
def token_create(
    subject: Annotated[str, typer.Option(help="Who the token speaks for; written to leased_by.")],
    role: Annotated[Role, typer.Option(help="reviewer, ingest or admin.")],
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
    settings = get_settings()
    count = asyncio.run(reclaimer.drain_once(settings, resolved_url(settings)))
    typer.echo(f"reclaimed {count}")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default PORT or 8000).")] = None,
    workers: Annotated[int | None, typer.Option(help="Uvicorn worker processes.")] = None,
) -> None:
    """Migrate, then serve the API (with dev tokens printed when on the embedded database)."""
    import uvicorn

    from cli import devtokens

    settings = get_settings()
    url = resolved_url(settings)
    upgrade_head(url)
    if settings.database_url is None:
        devtokens.ensure_and_print(settings, host or settings.host, port or settings.port)
    # Workers (and any child process) must reach the same database without starting
    # their own embedded server.
    os.environ["DATABASE_URL"] = url
    get_settings.cache_clear()
    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit
    # instead lets atexit stop the embedded server when this was its last user.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        workers=workers or settings.workers,
        log_level="warning",
        timeout_graceful_shutdown=20,
    )


def main() -> None:
    app()
