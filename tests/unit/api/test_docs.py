"""/docs and /redoc come entirely from the service itself: no CDN, so they work offline and under a
Content-Security-Policy of 'self'."""

import re

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.support.postgres import make_settings

ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}


@pytest.fixture
def docs_client() -> TestClient:
    # The pages need no database (and no token).
    return TestClient(create_app(make_settings("postgresql+psycopg://docs@127.0.0.1:1/unused")))


@pytest.mark.parametrize(
    ("page", "script"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")]
)
def test_the_docs_reference_only_same_origin_urls_and_serve_them(
    docs_client: TestClient, page: str, script: str
) -> None:
    response = docs_client.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "http://" not in html and "https://" not in html and "//" not in html.replace("://", ""), html
    urls = re.findall(r"""(?:src|href|spec-url)=["']([^"']+)["']|url: ?["']([^"']+)["']""", html)
    referenced = {a or b for a, b in urls}
    assert f"/docs/assets/{script}" in referenced and "/openapi.json" in referenced, referenced
    for url in referenced:
        assert url.startswith("/") and not url.startswith("//"), f"{page} references {url}"
        asset = docs_client.get(url)
        assert asset.status_code == 200, (url, asset.status_code)
        suffix = url[url.rfind(".") :]
        assert asset.headers["content-type"].startswith(ASSET_TYPES[suffix]), (url, asset.headers)
        assert len(asset.content) > 1000, url


def test_swagger_ui_asks_no_validator_badge(docs_client: TestClient) -> None:
    assert '"validatorUrl": null' in docs_client.get("/docs").text


def test_a_missing_asset_is_a_problem_404(docs_client: TestClient) -> None:
    response = docs_client.get("/docs/assets/nope.js")
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"
