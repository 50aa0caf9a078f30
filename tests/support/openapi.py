"""The OpenAPI document as the app serves it, loaded once per test process."""

from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from tests.support.postgres import make_settings


def _served_openapi() -> dict[str, Any]:
    # The document as the app serves it. Serving it needs no database, so no lifespan runs here.
    client = TestClient(create_app(make_settings("postgresql+psycopg://openapi@127.0.0.1:1/unused")))
    try:
        response = client.get("/openapi.json")
    finally:
        client.close()
    response.raise_for_status()
    document: dict[str, Any] = response.json()
    return document


OPENAPI = _served_openapi()
