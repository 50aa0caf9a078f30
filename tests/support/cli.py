"""The `review-queue` commands in-process: Typer's CliRunner runs the `app` the script runs (a
process per call cost about 2 s of CPU for its imports; tests/system/test_cli.py runs the script
itself, for what only `main()` and a process show)."""

import asyncio
import logging
import subprocess

from typer.testing import CliRunner, Result

from api.settings import get_settings
from cli.main import app
from db import tokens
from db.engine import create_engine


def invoke(db_url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    """`review-queue ARGS` with DATABASE_URL=db_url and `env` over this process's environment."""
    # Settings are cached per process: the command reads this test's DATABASE_URL, and leaves
    # nothing of it to the next. So with logging: a command configures it to write to the runner's
    # stdout, which is closed once the command returns.
    get_settings.cache_clear()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return CliRunner().invoke(
            app, list(args), env={"DATABASE_URL": db_url, **(env or {})}, prog_name="review-queue"
        )
    finally:
        get_settings.cache_clear()
        root.handlers = handlers
        root.setLevel(level)


def completed(result: Result, *args: str) -> "subprocess.CompletedProcess[str]":
    """An in-process run as the script's would read: its exit status, stdout and stderr. An
    exception that escaped the command is re-raised: run as the script, it would be a traceback."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["review-queue", *args], result.exit_code, result.stdout, result.stderr
    )


def principal(db_url: str, token: str) -> tokens.Principal | None:
    """Whom the service takes `token` for."""

    async def run() -> tokens.Principal | None:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with engine.connect() as conn:
                return await tokens.find_principal(conn, token=token)
        finally:
            await engine.dispose()

    return asyncio.run(run())
