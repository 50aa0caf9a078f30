"""The background workers: `reclaim` (one drain), `reclaimer` and `deliverer` (loops)."""

import asyncio
import signal
from typing import Annotated

import typer

from api.logs import configure_logging
from api.settings import get_settings
from cli.common import resolved_url


def reclaim(
    once: Annotated[
        bool, typer.Option("--once", help="Run one drain and exit (the default).", show_default=False)
    ] = True,
) -> None:
    """Return expired leases to the queue now; print how many.

    Drains batch after batch until none is left."""
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    count = asyncio.run(reclaimer.drain_once(settings, resolved_url(settings)))
    typer.echo(f"reclaimed {count}")


def reclaimer_loop() -> None:
    """Reclaim expired leases every interval until SIGTERM or SIGINT.

    The interval is REVIEW_QUEUE_RECLAIM_INTERVAL_S."""
    # A stop signal before the loop installs its own handlers (while the embedded server starts,
    # say) is still a clean stop, not a KeyboardInterrupt traceback and exit 130.
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(reclaimer.run_forever(settings, resolved_url(settings), stop))


def deliverer_loop() -> None:
    """Deliver webhooks from the change feed until SIGTERM or SIGINT.

    Any number may run: each claims a subscription at a time."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from cli import deliverer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(deliverer.run_forever(settings, resolved_url(settings), stop))
