"""make bench-instructions: what one POST /items/{id}/complete costs the API process, in CPU
instructions, without the noise of a shared machine.

The completion goes through the whole ASGI application (middleware, authentication, validation,
the one-round-trip transaction against a real PostgreSQL, the audit event, the log lines, the
response) but not through a socket: no HTTP client, no uvicorn. Under valgrind (callgrind) the
instructions the process executed are counted; the count moves by about 1-2 % between runs of the
same code, where wall-clock and CPU time on this machine move by up to 50 %. So it answers "did
this change make the request cheaper" in one run each, before `make bench` says what that is
worth in latency. Kernel time (the socket writes, PostgreSQL's own work) is not counted.

    make bench-instructions                     # CPU time only (valgrind not needed)
    make bench-instructions ARGS="--valgrind"   # instructions too (needs valgrind on PATH)
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from api.app import create_app
from api.schemas import encode_lease_token
from api.settings import Settings, get_settings
from bench.harness import SEED_PENDING, fresh_database, reviewer_tokens, run_sql
from cli.common import owner_url
from db import queue
from db.engine import OneRoundTrip, create_engine

app = typer.Typer(add_completion=False)
WHAT = "POST /items/{id}/complete through the ASGI app"
WARMUP = 50  # enough for psycopg to prepare the statements and the pool to fill


def _callgrind(*command: str) -> None:
    # Ask the valgrind running this process to zero or dump its counters; callgrind_control waits
    # for the answer, so the counts start and stop at these calls.
    control = ["callgrind_control", *command, str(os.getpid())]
    subprocess.run(control, capture_output=True, check=True)  # noqa: S603 - valgrind's own tool


async def _drive(url: str, token: str, requests: int, counted: bool) -> float:
    """Complete `requests` held items through the app; the process CPU seconds they took."""
    engine = create_engine(url)
    held: list[queue.Item] = []
    try:
        while len(held) < requests + WARMUP:
            leased = await queue.lease_items(
                OneRoundTrip(engine, lock_timeout_ms=1000, statement_timeout_ms=10_000),
                reviewer="bench-0",
                batch_size=200,
                lease_duration=timedelta(hours=1),
                cap=10**6,
            )
            assert leased, "the database ran out of items"
            held += leased
    finally:
        await engine.dispose()
    # The token's lookup is cached for token_cache_s (5 s by default): under valgrind the measured
    # loop takes a minute or more, longer the busier the machine, so with the default it would
    # count a dozen or more extra lookups (a transaction each) depending on the machine's load.
    # Kept for the whole loop, as at production speed where one lookup per 5 s is negligible.
    application = create_app(Settings(database_url=url, token_cache_s=300))

    async def complete(item: queue.Item) -> None:
        assert item.lease_nonce is not None
        token_ = encode_lease_token(item.id, item.lease_nonce)
        body = json.dumps({"resolution": "APPROVED", "lease_token": token_})
        path = f"/items/{item.id}/complete"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"bench"),
                (b"authorization", f"Bearer {token}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body.encode(), "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        await application(scope, receive, send)
        assert sent[0]["status"] == 200, sent

    async with application.router.lifespan_context(application):
        for item in held[:WARMUP]:
            await complete(item)
        if counted:
            _callgrind("--zero")
        started = time.process_time()
        for item in held[WARMUP : WARMUP + requests]:
            await complete(item)
        cpu = time.process_time() - started
        if counted:
            _callgrind("--dump=measured")
    return cpu


@app.command()
def main(
    requests: Annotated[int, typer.Option(help="Completions measured (after 50 to warm up).")] = 300,
    valgrind: Annotated[
        bool, typer.Option("--valgrind", help="Also count instructions, under valgrind's callgrind.")
    ] = False,
    inner: Annotated[str | None, typer.Option(hidden=True)] = None,  # "URL TOKEN", set by the outer run
) -> None:
    # The request's own log lines are part of its cost; where they go is not.
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the whole process
    if inner is not None:
        url, token = inner.split(" ")
        cpu = asyncio.run(_drive(url, token, requests, counted=True))
        typer.echo(f"{cpu / requests * 1e6:.0f}", err=True)
        return
    url = fresh_database(owner_url(get_settings()), "rq_bench_instructions")
    run_sql(url, SEED_PENDING, {"prefix": "i-", "entity": "ACME-CORP", "count": requests + 400}, vacuum=True)
    (token,) = reviewer_tokens(url, 1)
    if not valgrind:
        cpu = asyncio.run(_drive(url, token, requests, counted=False))
        typer.echo(f"{WHAT}: {cpu / requests * 1e6:.0f} us of CPU per request", err=True)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--valgrind needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
        command += ["-m", "bench.instructions", "--requests", str(requests), "--inner", f"{url} {token}"]
        run = subprocess.run(  # noqa: S603 - fixed arguments
            command,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if run.returncode != 0:
            raise SystemExit(f"the run under valgrind failed:\n{run.stderr[-3000:]}")
        (dump,) = Path(scratch).glob("callgrind.out.*")  # the one dump of the measured loop
        lines = dump.read_text().splitlines()
        totals = next(line for line in lines if line.startswith(("summary:", "totals:")))
    per_request = int(totals.split()[1]) / requests
    typer.echo(f"{WHAT}: {per_request / 1e6:.2f} M instructions per request", err=True)


if __name__ == "__main__":
    app()
