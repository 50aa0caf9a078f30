"""What a failover's errors look like to a client, without a database: the exceptions the driver
raises are thrown from a route of a bare app with the service's error handlers (api/errors.py).
The end-to-end case, a real server turned read-only, is tests/system/test_multi_host.py."""

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from psycopg import errors as pg
from sqlalchemy.exc import DBAPIError

from api.errors import install_error_handlers
from tests.support.api import assert_problem


def _raising(error: BaseException) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/write")
    async def write() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("wrapped", [False, True], ids=["from psycopg", "through SQLAlchemy"])
def test_a_read_only_server_is_a_503_database_unavailable_never_a_500(wrapped: bool) -> None:
    """SQLSTATE 25006: the old primary being demoted, or a standby. psycopg files it under
    InternalError, not OperationalError: only its own rule in db/errors.py makes it a 503."""
    refused: BaseException = pg.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")
    if wrapped:
        refused = DBAPIError("UPDATE review_queue_item ...", {}, refused)  # type: ignore[arg-type]
    assert isinstance(pg.ReadOnlySqlTransaction(), psycopg.InternalError)
    answer = _raising(refused).post("/write")
    assert_problem(answer, 503, "DATABASE_UNAVAILABLE")
    assert "read-only" in answer.json()["detail"] and answer.headers["retry-after"] == "1"


def test_an_unclassified_error_is_still_a_500() -> None:
    """The control: the handler does not turn every failure into a 503."""
    assert_problem(_raising(RuntimeError("a bug")).post("/write"), 500, "INTERNAL_ERROR")
