"""Fixtures of the browser tests: one Chromium per module, a fresh context (cookie jar) per use."""

from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Playwright, sync_playwright

from tests.support.desk import SOON, chromium_or_skip


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    executable = chromium_or_skip()
    with sync_playwright() as pw:
        pw.executable = executable  # type: ignore[attr-defined]
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """One browser per module; each test gets its own contexts (cookie jars)."""
    browser = playwright.chromium.launch(
        executable_path=playwright.executable,  # type: ignore[attr-defined]
        args=["--no-sandbox"],
    )
    yield browser
    browser.close()


@pytest.fixture
def contexts(browser: Browser) -> Iterator[Callable[[], BrowserContext]]:
    made: list[BrowserContext] = []

    def new() -> BrowserContext:
        context = browser.new_context(viewport={"width": 1100, "height": 900})
        context.set_default_timeout(SOON)
        made.append(context)
        return context

    yield new
    for context in made:
        context.close()
