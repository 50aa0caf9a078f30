"""The desk's sign-in through the company's identity provider, in a real browser: Debian's Chromium
(Playwright) on `review-queue serve`, and a real OpenID Connect provider (oidc-provider under Node,
tests/support/oidc_provider.py) whose own login and consent pages the test fills in as a person would.

The provider is at localhost and the desk at 127.0.0.1: different sites, as in production, so the
cookies' SameSite settings are exercised for real. Skipped without Chromium or without Node and the
provider, unless REVIEW_QUEUE_REQUIRE_BROWSER / REVIEW_QUEUE_REQUIRE_OIDC make that a failure.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from tests.support.oidc_provider import PROVIDER_NAME, RealProvider
from tests.support.servers import free_port, start_server, stop_server

pytest.importorskip("playwright")
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.desk import SOON, current, enqueue, resolve, shot, token_on


@contextmanager
def oidc_desk(db_url: str, provider: RealProvider) -> Iterator[str]:
    """`review-queue serve` with sign-in through the provider; its base URL (REVIEW_QUEUE_PUBLIC_URL)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    client = provider.register_desk(base)
    env = provider.environment(provider.service_settings(base, client))
    process, started = start_server({"DATABASE_URL": db_url, **env}, port=port)
    assert started == base
    try:
        yield base
    finally:
        stop_server(process)


def sign_in_at_provider(page: Page, base: str, login: str) -> None:
    """From the desk's sign-in page through the provider's own login (any password) and consent."""
    page.goto(f"{base}/desk/")
    expect(page.get_by_label("Token")).to_be_visible()  # the token sign-in stays
    page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
    page.get_by_placeholder("Enter any login").fill(login)
    page.get_by_placeholder("and password").fill("correct horse")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()  # the provider's consent page


def test_a_reviewer_signs_in_with_the_provider_leases_resolves_and_signs_out_of_both(
    db_url: str,
    oidc_provider: RealProvider,
    sql: psycopg.Connection,
    contexts: Callable[[], BrowserContext],
) -> None:
    admin = token_on(db_url, "ada", "admin")
    with oidc_desk(db_url, oidc_provider) as base:
        item = enqueue(base, admin, ledger_entity="GLOBEX", variance_amount="-12.50")
        page = contexts().new_page()
        sign_in_at_provider(page, base, "rita")
        # Back in the desk, as the provider's preferred_username (lower-cased) with the mapped role.
        expect(page.get_by_text("rita.reviewer (reviewer)")).to_be_visible()
        assert page.url == f"{base}/desk/"
        shot(page, "desk-oidc-signed-in")
        page.get_by_role("button", name="Next item").click()
        expect(current(page)).to_contain_text("GLOBEX")
        resolve(page)
        expect(page.get_by_role("status")).to_contain_text("Resolved GLOBEX", timeout=SOON)
        row = sql.execute("SELECT state, resolved_by FROM review_queue_item WHERE id = %s", (item["id"],))
        assert row.fetchone() == ("RESOLVED", "rita.reviewer")
        (session,) = [c for c in page.context.cookies() if c["name"] == "rq_session"]
        assert (session["httpOnly"], session["sameSite"]) == (True, "Strict")

        # Signing out ends the desk session and, at the provider's own page, the provider's.
        page.get_by_role("button", name="Sign out").click()
        page.get_by_role("button", name="Yes, sign me out").click()
        expect(page.get_by_label("Token")).to_be_visible()
        assert page.url == f"{base}/desk/"
        assert sql.execute("SELECT count(*) FROM oidc_session").fetchone() == (0,)
        page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
        expect(page.get_by_placeholder("Enter any login")).to_be_visible()  # asked again


@pytest.mark.parametrize(
    ("login", "sentence"),
    [
        ("nora", "Your account is in none of the groups that give access to the reviewer desk"),
        ("max", "Your account is in groups whose roles cannot be combined"),
    ],
)
def test_someone_without_a_role_is_refused_with_a_sentence(
    db_url: str,
    oidc_provider: RealProvider,
    sql: psycopg.Connection,
    contexts: Callable[[], BrowserContext],
    login: str,
    sentence: str,
) -> None:
    with oidc_desk(db_url, oidc_provider) as base:
        page = contexts().new_page()
        sign_in_at_provider(page, base, login)
        expect(page.get_by_role("alert")).to_contain_text(sentence)
        expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
        assert page.url == f"{base}/desk/"  # the code is gone from the address: a reload says nothing
        assert sql.execute("SELECT count(*) FROM oidc_session").fetchone() == (0,)
        shot(page, f"desk-oidc-refused-{login}")


def test_cancelling_at_the_provider_is_explained(
    db_url: str,
    oidc_provider: RealProvider,
    contexts: Callable[[], BrowserContext],
) -> None:
    with oidc_desk(db_url, oidc_provider) as base:
        page = contexts().new_page()
        page.goto(f"{base}/desk/")
        page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
        page.get_by_role("link", name="Cancel").click()
        expect(page.get_by_role("alert")).to_contain_text("You cancelled the sign-in")


def test_without_a_provider_the_desk_offers_only_the_token(
    db_url: str,
    contexts: Callable[[], BrowserContext],
) -> None:
    process, base = start_server({"DATABASE_URL": db_url})
    try:
        page = contexts().new_page()
        page.goto(f"{base}/desk/")
        expect(page.get_by_label("Token")).to_be_focused()
        expect(page.get_by_role("link", name="Sign in with")).to_have_count(0)
    finally:
        stop_server(process)
