"""`review-queue migrate` and `review-queue serve`: the schema, then the API and its workers."""

import contextlib
import os
import signal
import sys
from typing import Annotated

import typer

from api.settings import get_settings
from cli.common import migrate_to_head, resolved_url
from db.engine import libpq_url


def migrate() -> None:
    """Bring the schema to head (alembic upgrade head)."""
    migrate_to_head(get_settings())
    typer.echo("schema is at head")


def _check_port_free(host: str, port: int) -> None:
    """Fail before anything is printed or started when the port is taken (a second `make run`)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a port in TIME_WAIT after a restart still counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            typer.echo(
                f"review-queue: cannot listen on {host}:{port}: {error.strerror or error}. Is another"
                f" review-queue (make run) running? Stop it, or choose another port: PORT={port + 1}"
                " make run (or serve --port).",
                err=True,
            )
            raise SystemExit(1) from None


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default PORT or 8000).")] = None,
    workers: Annotated[int | None, typer.Option(help="Uvicorn worker processes.")] = None,
    with_reclaimer: Annotated[
        bool, typer.Option("--reclaimer/--no-reclaimer", help="Run the reclaimer as a child process.")
    ] = True,
    with_deliverer: Annotated[
        bool, typer.Option("--deliverer/--no-deliverer", help="Run the webhook deliverer as a child process.")
    ] = True,
) -> None:
    """Migrate, then serve the API beside a reclaimer and a deliverer.

    On the embedded database, dev tokens are printed first."""
    import shutil
    import subprocess
    import tempfile

    import uvicorn

    from api import webhook_secret
    from cli import devtokens

    settings = get_settings()
    host, port = host or settings.host, port or settings.port
    _check_port_free(host, port)
    migrate_to_head(settings)
    url = resolved_url(settings)
    _warn_if_privileged(url)
    if settings.database_url is None:
        devtokens.ensure_and_print(url, settings.data_dir, host, port)
    # Workers and the reclaimer child must reach the same database without starting their own
    # embedded server, and write their counters where one /metrics scrape sums them all.
    os.environ["DATABASE_URL"] = url
    # The embedded database's webhook key (kept in the data directory), for the workers and the
    # deliverer, which now see a DATABASE_URL.
    if (key := webhook_secret.keys(settings)) is not None:
        os.environ["REVIEW_QUEUE_WEBHOOK_KEY"] = key
    metrics_dir = None
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="review-queue-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    get_settings.cache_clear()
    _raise_open_file_limit()
    children = [
        subprocess.Popen([sys.executable, "-m", "cli", command])  # noqa: S603 - our own commands
        for command, wanted in (("reclaimer", with_reclaimer), ("deliverer", with_deliverer))
        if wanted
    ]
    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit
    # instead runs the cleanup below and lets atexit stop the embedded server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(
            "api.app:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers or settings.workers,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=20,
            proxy_headers=bool(settings.forwarded_allow_ips),
            forwarded_allow_ips=settings.forwarded_allow_ips or None,
        )
    finally:
        for child in children:
            child.terminate()
        for child in children:
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
