"""Helpers of the browser tests: Chromium, generous deadlines, screenshots, and the desk's common
moves (enqueue, the current item, resolve)."""

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from playwright.sync_api import Page, expect

from db.tokens import hash_token
from tests.support.api import item_body
from tests.support.postgres import libpq

SHOTS = Path(__file__).resolve().parents[2] / ".screenshots"
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None)
SOON = 10_000  # ms: generous deadlines for conditions; speed is not what these tests measure
# expect() has its own default (5 s), too short for a loaded CI machine: the same deadline for both.
expect.set_options(timeout=SOON)


def chromium_or_skip() -> str:
    if CHROMIUM is None:
        if os.environ.get("REVIEW_QUEUE_REQUIRE_BROWSER"):
            pytest.fail("REVIEW_QUEUE_REQUIRE_BROWSER is set but Chromium is not installed")
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does)")
    return CHROMIUM


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def enqueue(base: str, admin: str, **fields: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{base}/items", json=item_body(**fields), headers={"Authorization": f"Bearer {admin}"}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def current(page: Page) -> Any:
    return page.get_by_role("region", name="Current item")


Tokens = Callable[[str, str], str]


def token_on(url: str, subject: str, role: str) -> str:
    # Plain psycopg: Playwright's sync API runs an event loop on this thread, so the async
    # helpers of tests/support/postgres.py (asyncio.run) cannot be used while a browser is open.
    token = "rq_" + secrets.token_urlsafe(32)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_token (subject, role, token_hash) VALUES (%s, %s, %s)",
            (subject, role, hash_token(token)),
        )
    return token


def resolve(page: Page, code: str = "MATCH_CONFIRMED") -> None:
    """Choose a code (the desk never chooses one for you) and press Resolve."""
    current(page).get_by_label("Resolution", exact=True).select_option(code)
    current(page).get_by_role("button", name="Resolve", exact=True).click()
