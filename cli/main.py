"""The `review-queue` command: serve, migrate, tokens, reclaim, deliver webhooks, archive."""

import sys

import psycopg
import typer
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SATimeoutError

from api.settings import Settings, get_settings, hide_password
from cli.admin import admin_app
from cli.archive import archive
from cli.audit import audit_app
from cli.common import command_group
from cli.resolutions import resolutions_app
from cli.serve import migrate, serve
from cli.stats import stats
from cli.tokens import token_app
from cli.webhooks import webhooks_app
from cli.workers import deliverer_loop, reclaim, reclaimer_loop
from db import urls
from db.errors import DatabaseUnavailable
from db.migrations import MigrationRefused

app = command_group(__doc__)
# The order of registration is the order `review-queue --help` lists them in.
app.command()(migrate)
app.command()(reclaim)
app.command("reclaimer")(reclaimer_loop)
app.command("deliverer")(deliverer_loop)
app.command()(stats)
app.command()(archive)
app.command()(serve)
app.add_typer(token_app, name="token")
app.add_typer(audit_app, name="audit")
app.add_typer(resolutions_app, name="resolutions")
app.add_typer(admin_app, name="admin")
app.add_typer(webhooks_app, name="webhooks")


def _database_target(settings: Settings) -> str:
    if settings.database_url is None:
        return f"the embedded PostgreSQL in {settings.data_dir / 'pg'}"
    try:
        target = urls.parse(settings.database_url)
    except ValueError:
        return hide_password(settings.database_url)
    return f"PostgreSQL at {', '.join(target.servers)} (database {target.database or target.user or '?'})"


def database_failure(error: BaseException, settings: Settings) -> str | None:
    """One line for an operator when `error` means the database could not be used, else None."""
    driver = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    if isinstance(driver, psycopg.errors.UndefinedTable):
        return (
            f"review-queue: {_database_target(settings)} has no review-queue schema ({driver}); run"
            " `review-queue migrate` (or make migrate) first, or check DATABASE_URL."
        )
    if not isinstance(driver, psycopg.OperationalError | DatabaseUnavailable | SATimeoutError):
        return None
    reason = next((line.strip() for line in str(driver).splitlines() if line.strip()), type(driver).__name__)
    return (
        f"review-queue: cannot use {_database_target(settings)}: {reason}. Check that the server is"
        " running and reachable from here and that DATABASE_URL (host, port, user, password, database)"
        " is right; REVIEW_QUEUE_LOG_LEVEL=DEBUG shows the traceback."
    )


def main() -> None:
    try:
        app()
    except MigrationRefused as error:
        typer.echo(f"review-queue: the migration stopped: {error}", err=True)
        sys.exit(1)
    except Exception as error:
        settings = get_settings()
        message = database_failure(error, settings)
        if message is None or settings.log_level == "DEBUG":
            raise
        typer.echo(message, err=True)
        sys.exit(1)
