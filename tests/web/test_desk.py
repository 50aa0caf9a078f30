"""The reviewer desk in a real browser: Debian's Chromium driven by Playwright, against
`review-queue serve` on a fresh database. Elements are found by role and accessible name.

Skipped where Chromium is missing, unless REVIEW_QUEUE_REQUIRE_BROWSER=1 (set by .ci/run), where
that is a failure. Screenshots of the main screens go to .screenshots/ (git-ignored).
"""

import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from db.migrations import upgrade_head
from db.tokens import hash_token
from tests.api.helpers import item_body
from tests.conftest import OwnPostgres, libpq, start_server, stop_server
from tests.support import backdate_lease

pytest.importorskip("playwright")
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    Request,
    Route,
    expect,
    sync_playwright,
)

SHOTS = Path(__file__).resolve().parents[2] / ".screenshots"
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None)
SOON = 10_000  # ms: generous deadlines for conditions; speed is not what these tests measure


def _chromium_or_skip() -> str:
    if CHROMIUM is None:
        if os.environ.get("REVIEW_QUEUE_REQUIRE_BROWSER"):
            pytest.fail("REVIEW_QUEUE_REQUIRE_BROWSER is set but Chromium is not installed")
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does)")
    return CHROMIUM


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    executable = _chromium_or_skip()
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


@contextmanager
def desk(db_url: str, **env: str) -> Iterator[str]:
    process, base = start_server({"DATABASE_URL": db_url, **env})
    try:
        yield base
    finally:
        stop_server(process)


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


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/desk/")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def enqueue(base: str, admin: str, **fields: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{base}/items", json=item_body(**fields), headers={"Authorization": f"Bearer {admin}"}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def notice(page: Page, text: str) -> Any:
    return page.get_by_role("status").filter(has_text=text)


def current(page: Page) -> Any:
    return page.get_by_role("region", name="Current item")


def events_of(sql: psycopg.Connection, item_id: str) -> list[tuple[str, str, Any]]:
    return sql.execute(
        "SELECT event, actor, details FROM review_queue_event WHERE item_id = %s ORDER BY id", (item_id,)
    ).fetchall()


Tokens = Callable[[str, str], str]


def _token_on(url: str, subject: str, role: str) -> str:
    # Plain psycopg: Playwright's sync API runs an event loop on this thread, so the async
    # helpers of tests/conftest.py (asyncio.run) cannot be used while a browser is open.
    token = "rq_" + secrets.token_urlsafe(32)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_token (subject, role, token_hash) VALUES (%s, %s, %s)",
            (subject, role, hash_token(token)),
        )
    return token


@pytest.fixture
def make_token(db_url: str) -> Tokens:
    return lambda subject, role: _token_on(db_url, subject, role)


def resolve(page: Page, code: str = "MATCH_CONFIRMED") -> None:
    """Choose a code (the desk never chooses one for you) and press Resolve."""
    page.get_by_label("Resolution").select_option(code)
    page.get_by_role("button", name="Resolve").click()


def test_keyboard_alone_signs_in_leases_resolves_and_advances(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    token, admin = make_token("alice", "reviewer"), make_token("ada", "admin")
    with desk(db_url) as base:
        first = enqueue(base, admin, ledger_entity="ACME-CORP", variance_amount="1234567890123456.78")
        second = enqueue(base, admin, ledger_entity="GLOBEX", variance_amount="-0.10")
        page = contexts().new_page()
        page.goto(f"{base}/desk/")
        # Keyboard only: the token field has focus, Enter submits.
        expect(page.get_by_label("Token")).to_be_focused()
        page.keyboard.type(token)
        page.keyboard.press("Enter")
        expect(page.get_by_role("button", name="Sign out")).to_be_visible()
        page.keyboard.press("n")
        region = current(page)
        expect(region).to_contain_text("ACME-CORP")
        # Exactly as the API gives it: all digits, two decimals, never through a float.
        expect(region.get_by_test_id("amount")).to_have_text("1234567890123456.78")
        expect(region).to_contain_text(first["source_hash"])
        expect(region).to_contain_text(first["trace_id"])
        expect(region.get_by_role("list", name="Event history")).to_contain_text("LEASED by alice")
        assert page.get_by_test_id("amount").evaluate("e => getComputedStyle(e).textAlign") == "right"
        shot(page, "desk-item")

        page.keyboard.press("Escape")  # leave the Resolution field the lease focused
        page.keyboard.press("?")
        expect(page.get_by_role("dialog", name="Keyboard shortcuts")).to_contain_text("Ctrl+Enter")
        page.keyboard.press("Escape")
        # The choices are the catalogue's active codes, in its order: the key is WRITE_OFF's place.
        codes = [
            c["code"]
            for c in httpx.get(f"{base}/resolutions", headers={"Authorization": f"Bearer {admin}"}).json()[
                "resolutions"
            ]
        ]
        expect(page.get_by_label("Resolution").locator("option")).to_have_count(len(codes) + 1)
        # No code is chosen for you: resolving without one asks for it and sends nothing.
        page.keyboard.press("Control+Enter")
        expect(notice(page, "Choose a resolution first")).to_be_visible()
        assert [e[0] for e in events_of(sql, first["id"])] == ["ENQUEUED", "LEASED"]
        page.keyboard.press("Escape")
        expect(page.get_by_label("Resolution")).to_contain_text(
            "Write-off (WRITE_OFF): note required, approver from 1000.00"
        )
        page.keyboard.press(str(codes.index("WRITE_OFF") + 1))
        page.keyboard.press("e")
        expect(page.get_by_label("Note")).to_be_focused()
        page.keyboard.type("FX rounding")
        page.keyboard.press("Control+Enter")  # resolve and advance, one keystroke
        expect(region).to_contain_text("GLOBEX")
        expect(region.get_by_test_id("amount")).to_have_text("-0.10")
        # WRITE_OFF needs an approver from 1,000.00 on: the desk submitted it and moved on.
        row = sql.execute(
            "SELECT state, proposed_resolution, proposed_note, prepared_by FROM review_queue_item"
            " WHERE id = %s",
            (first["id"],),
        ).fetchone()
        assert row == ("AWAITING_APPROVAL", "WRITE_OFF", "FX rounding", "alice")
        assert sql.execute(
            "SELECT leased_by FROM review_queue_item WHERE id = %s", (second["id"],)
        ).fetchone() == ("alice",)

        # The token is nowhere a script could read it: only an HttpOnly cookie holds the session.
        assert page.evaluate("() => localStorage.length + sessionStorage.length") == 0
        assert token not in page.evaluate("() => document.cookie + document.documentElement.outerHTML")
        (cookie,) = page.context.cookies()
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")

        # Signing out ends the session on the server, not only in this browser.
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_label("Token")).to_be_visible()
        replay = httpx.get(f"{base}/session", cookies={cookie["name"]: cookie["value"]})
        assert replay.status_code == 401, replay.text


def test_an_approver_approves_and_rejects_proposals_in_the_approvals_view(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    alice, april, admin = (
        make_token("alice", "reviewer"),
        make_token("april", "approver"),
        make_token("ada", "admin"),
    )
    with desk(db_url) as base:
        big = [enqueue(base, admin, ledger_entity=f"BIG-{n}", variance_amount="25000.00") for n in range(2)]
        preparer = contexts().new_page()
        sign_in(preparer, base, alice)
        # A plain reviewer has no Approvals view.
        expect(preparer.get_by_role("region", name="Approvals")).to_have_count(0)
        preparer.get_by_role("button", name="Next item").click()
        for n in range(2):  # resolving moves on to the next item by itself
            expect(current(preparer)).to_contain_text(f"BIG-{n}")
            preparer.get_by_label("Resolution").select_option("WRITE_OFF")
            preparer.get_by_label("Note").fill(f"write-off {n}")
            preparer.get_by_role("button", name="Resolve").click()
            expect(notice(preparer, f"Submitted BIG-{n} 25000.00 as WRITE_OFF for approval")).to_be_visible()
        states = sql.execute("SELECT DISTINCT state FROM review_queue_item").fetchall()
        assert states == [("AWAITING_APPROVAL",)], states

        preparer.close()  # its desk would take the rejected item back at once (it is first in line)
        checker = contexts().new_page()
        sign_in(checker, base, april)
        approvals = checker.get_by_role("region", name="Approvals")
        approvals.get_by_role("button", name="Lease a proposal").click()
        proposal = approvals.get_by_role("term").filter(has_text="Prepared by")
        expect(proposal).to_be_visible()
        expect(approvals).to_contain_text("BIG-0")
        expect(approvals).to_contain_text("write-off 0")
        expect(approvals.get_by_label("Proposal")).to_contain_text("alice")
        shot(checker, "desk-approvals")
        approvals.get_by_role("button", name="Approve").click()
        expect(approvals).to_contain_text("Approved BIG-0 25000.00: resolved as WRITE_OFF by alice.")
        row = sql.execute(
            "SELECT state, resolution, resolved_by, approved_by FROM review_queue_item WHERE id = %s",
            (big[0]["id"],),
        ).fetchone()
        assert row == ("RESOLVED", "WRITE_OFF", "alice", "april")

        # The second one is rejected with a reason: PENDING again, the reason in its trail.
        approvals.get_by_role("button", name="Lease a proposal").click()
        expect(approvals).to_contain_text("BIG-1")
        approvals.get_by_role("button", name="Reject").click()
        expect(approvals).to_contain_text("Please give a reason to reject.")
        approvals.get_by_label("Reject reason").fill("wrong entity")
        approvals.get_by_role("button", name="Reject").click()
        expect(approvals).to_contain_text("Rejected BIG-1 25000.00: back in the queue (wrong entity).")
        assert sql.execute(
            "SELECT state FROM review_queue_item WHERE id = %s", (big[1]["id"],)
        ).fetchone() == ("PENDING",)
        event, actor, details = events_of(sql, big[1]["id"])[-1]
        assert (event, actor, details["reason"], details["prepared_by"]) == (
            "REJECTED",
            "april",
            "wrong entity",
            "alice",
        )

        # Nothing else waits: the view says so.
        approvals.get_by_role("button", name="Lease a proposal").click()
        expect(approvals).to_contain_text("No proposal is waiting for you.")


def test_two_reviewers_never_see_the_same_item(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    with desk(db_url) as base:
        for n in range(6):
            enqueue(base, admin, ledger_entity=f"ENTITY-{n}")
        pages = {}
        for who in ("alice", "bob"):
            pages[who] = contexts().new_page()
            sign_in(pages[who], base, make_token(who, "reviewer"))
        seen: dict[str, list[str]] = {"alice": [], "bob": []}
        for page in pages.values():
            page.get_by_role("button", name="Next item").click()
        for _ in range(3):
            for who, page in pages.items():
                expect(current(page)).to_contain_text("ENTITY-")
                entity = re.search(r"ENTITY-\d", current(page).inner_text()).group(0)  # type: ignore[union-attr]
                seen[who].append(entity)
                resolve(page)  # resolves, then leases the next
                expect(current(page)).not_to_contain_text(entity)
        assert not set(seen["alice"]) & set(seen["bob"]), seen
        assert len(set(seen["alice"]) | set(seen["bob"])) == 6


def test_a_reviewer_of_one_ledger_entity_leases_only_its_items(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    with desk(db_url) as base:
        older = enqueue(base, admin, ledger_entity="ACME-CORP")  # first in line for anyone else
        globex = enqueue(base, admin, ledger_entity="GLOBEX")
        page = contexts().new_page()
        sign_in(page, base, make_token("gina", "reviewer"))
        page.get_by_label("Only ledger entity").fill("GLOBEX")
        page.get_by_role("button", name="Next item").click()
        expect(current(page).get_by_test_id("amount")).to_be_visible()
        expect(current(page)).to_contain_text("GLOBEX")
        held = sql.execute(
            "SELECT idempotency_key FROM review_queue_item WHERE leased_by = 'gina'"
        ).fetchall()
        assert held == [(globex["idempotency_key"],)]
        assert sql.execute(
            "SELECT state FROM review_queue_item WHERE id = %s", (older["id"],)
        ).fetchone() == ("PENDING",)


def test_reload_keeps_items_and_a_stale_tab_says_what_happened(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin, token = make_token("ada", "admin"), make_token("alice", "reviewer")
    with desk(db_url) as base:
        item = enqueue(base, admin, ledger_entity="RELOADED")
        context = contexts()
        tab = context.new_page()
        sign_in(tab, base, token)
        tab.get_by_role("button", name="Next item").click()
        expect(current(tab)).to_contain_text("RELOADED")
        tab.reload()
        expect(current(tab)).to_contain_text("RELOADED")  # found with GET /items?leased_by=me
        expect(notice(tab, "you hold 1 item")).to_be_visible()

        # The lease lapses, is reclaimed and leased again, by alice herself in another tab.
        backdate_lease(sql, item["id"])
        reclaimed = httpx.post(f"{base}/admin/reclaim", headers={"Authorization": f"Bearer {admin}"})
        assert reclaimed.json()["reclaimed"] == 1
        other = context.new_page()
        other.goto(f"{base}/desk/")
        other.get_by_role("button", name="Next item").click()
        expect(current(other)).to_contain_text("RELOADED")

        resolve(tab)
        expect(notice(tab, "taken back and leased again")).to_be_visible()
        expect(current(tab)).not_to_contain_text("RELOADED")
        shot(tab, "desk-stale-tab")
        assert "LEASE_NOT_HELD" not in tab.content()  # a sentence, never a raw problem document
        state = sql.execute("SELECT state, lease_epoch FROM review_queue_item WHERE id = %s", (item["id"],))
        assert state.fetchone() == ("ASSIGNED", 2)


def test_a_lease_taken_right_after_sign_in_is_not_welcomed_back_as_an_old_one(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    # Sign-in asks which items the reviewer already holds. A lease sent before that answer was
    # found by it: "Welcome back: you hold 1 item" for an item just taken, and a renewal (seen
    # once in CI, on a loaded machine). Here that answer is held back until the lease has had
    # every chance to go first.
    admin, token = make_token("ada", "admin"), make_token("alice", "reviewer")
    with desk(db_url) as base:
        item = enqueue(base, admin, ledger_entity="JUST-TAKEN")
        page = contexts().new_page()
        held: list[Route] = []
        page.route("**/items?state=ASSIGNED*", lambda route: held.append(route))
        leases: list[Request] = []
        page.on("request", lambda r: leases.append(r) if r.url.endswith("/leases") else None)
        sign_in(page, base, token)
        while not held:  # sign-in's question, on hold
            page.wait_for_timeout(20)
        page.get_by_role("button", name="Next item").click()
        page.wait_for_timeout(500)  # long enough for a lease sent now to be on the wire
        if leases:
            leases[0].response()  # its answer first, as on the loaded machine
        held[0].continue_()
        page.unroute("**/items?state=ASSIGNED*")
        expect(current(page)).to_contain_text("JUST-TAKEN")
        page.wait_for_load_state("networkidle")
        expect(page.get_by_text("Welcome back")).to_have_count(0)
        assert [e[0] for e in events_of(sql, item["id"])] == ["ENQUEUED", "LEASED"]


def test_release_with_a_reason(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    with desk(db_url) as base:
        item = enqueue(base, admin)
        page = contexts().new_page()
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        expect(current(page)).to_contain_text(item["source_hash"])
        page.get_by_label("Release reason").fill("needs the FX desk")
        page.get_by_role("button", name="Release", exact=True).click()
        expect(notice(page, "back to the queue")).to_be_visible()
        assert events_of(sql, item["id"])[-1] == ("RELEASED", "alice", {"reason": "needs the FX desk"})
        assert sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (item["id"],)).fetchone() == (
            "PENDING",
        )


def test_an_empty_queue_is_explained_and_work_appears_without_a_reload(
    db_url: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    with desk(db_url) as base:
        held = enqueue(base, admin)
        bob = httpx.post(
            f"{base}/leases", json={}, headers={"Authorization": f"Bearer {make_token('bob', 'reviewer')}"}
        )
        assert [i["id"] for i in bob.json()["items"]] == [held["id"]]
        page = contexts().new_page()
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        queue = page.get_by_role("region", name="Queue")
        expect(queue).to_contain_text(
            "Nothing pending. 1 item is with other reviewers; the next lease expires in"
        )
        expect(queue).to_contain_text("Waiting for work")
        shot(page, "desk-empty-queue")
        arrived = enqueue(base, admin, ledger_entity="JUST-ARRIVED")
        # The promise: on the waiting page within 2 s, no reload.
        expect(current(page)).to_contain_text("JUST-ARRIVED", timeout=2_000)
        assert arrived["id"]


def test_countdown_renew_and_idle_release(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    lease_s, idle_s = 3, 6
    env = {
        "REVIEW_QUEUE_LOCK_TIMEOUT_MS": str(lease_s * 1000),
        "REVIEW_QUEUE_UI_IDLE_RELEASE_TEST_S": str(idle_s),
    }
    with desk(db_url, **env) as base:
        item = enqueue(base, admin)
        page = contexts().new_page()
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        timer = page.get_by_role("timer")
        expect(timer).to_have_text(re.compile(r"^\d s left$"))

        # Active: keys pressed now and then. The lease is renewed before it can lapse.
        started = time.monotonic()
        while time.monotonic() - started < 2 * lease_s:
            page.keyboard.press("Shift")
            time.sleep(0.3)
        renewals = [e for e in events_of(sql, item["id"]) if e[0] == "RENEWED"]
        assert len(renewals) >= 2, events_of(sql, item["id"])
        assert sql.execute(
            "SELECT state, leased_by FROM review_queue_item WHERE id = %s", (item["id"],)
        ).fetchone() == (
            "ASSIGNED",
            "alice",
        )
        expect(timer).not_to_have_text("expired")

        # Idle: after idle_s without a key or a click, the desk releases the item with reason idle.
        expect(notice(page, "without activity")).to_be_visible(timeout=(idle_s + lease_s) * 1000 + SOON)
        assert events_of(sql, item["id"])[-1] == ("RELEASED", "alice", {"reason": "idle"})
        shot(page, "desk-idle-released")


def test_admin_sees_stats_reclaims_and_looks_up_an_audit_trail(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    with desk(db_url) as base:
        items = [enqueue(base, admin, idempotency_key=f"ADM-{n}") for n in range(3)]
        bob = {"Authorization": f"Bearer {make_token('bob', 'reviewer')}"}
        httpx.post(f"{base}/leases", json={"batch_size": 2}, headers=bob)
        backdate_lease(sql, items[0]["id"])
        page = contexts().new_page()
        sign_in(page, base, admin)
        region = page.get_by_role("region", name="Admin")
        expect(region.get_by_role("table", name="Items by state")).to_contain_text("ASSIGNED2")
        expect(region.get_by_role("table", name="Open leases per reviewer")).to_contain_text("bob2")
        expect(region).to_contain_text("Oldest pending:")
        expect(region).to_contain_text("Overdue: 0")
        expect(region.get_by_role("table", name="Open items by age")).to_contain_text("0-1d3")
        shot(page, "desk-admin")
        region.get_by_role("button", name="Reclaim now").click()
        expect(region).to_contain_text("Reclaimed 1 expired lease.")
        expect(region.get_by_role("table", name="Open leases per reviewer")).to_contain_text("bob1")

        region.get_by_label("Item id or idempotency key").fill("ADM-0")
        region.get_by_role("button", name="Look up").click()
        trail = region.get_by_role("list", name="Audit trail")
        expect(trail).to_contain_text("ENQUEUED by ada")
        expect(trail).to_contain_text("RECLAIMED by ada")
        region.get_by_label("Item id or idempotency key").fill(items[1]["id"])
        region.get_by_role("button", name="Look up").click()
        expect(trail).to_contain_text("LEASED by bob")


def test_the_due_time_is_shown_and_overdue_items_are_marked_in_words(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    token, admin = make_token("alice", "reviewer"), make_token("ada", "admin")
    with desk(db_url) as base:
        enqueue(base, admin, ledger_entity="ON-TIME", due_at="2999-01-01T00:00:00Z")
        enqueue(base, admin, ledger_entity="LATE-CO", due_at="2020-01-01T00:00:00Z")
        page = contexts().new_page()
        sign_in(page, base, token)
        page.keyboard.press("n")
        region = current(page)
        expect(region).to_contain_text("LATE-CO")  # earliest due first
        due = region.get_by_test_id("due")
        expect(due).to_contain_text("Overdue")
        expect(due).to_contain_text("was due")
        assert "overdue" in (due.get_attribute("class") or "")
        shot(page, "desk-overdue")
        resolve(page)
        expect(region).to_contain_text("ON-TIME")
        expect(due).to_contain_text("(in ")
        expect(due).not_to_contain_text("Overdue")
        assert "overdue" not in (due.get_attribute("class") or "")
        page.get_by_role("button", name="Sign out").click()

        sign_in(page, base, admin)
        stats = page.get_by_role("region", name="Admin")
        expect(stats).to_contain_text("Overdue: 0")  # the late item was resolved
        sql.execute("UPDATE review_queue_item SET due_at = now() - interval '2 hours'")
        stats.get_by_role("button", name="Refresh").click()
        expect(stats).to_contain_text("Overdue: 1 (the most overdue by 2 h")
        expect(stats.get_by_role("table", name="Overdue items per ledger entity")).to_contain_text("ON-TIME1")


XSS = '<img src=x onerror="window.__pwned=1">'


def test_script_and_markup_from_ingest_stay_inert_under_a_strict_csp(
    db_url: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    with desk(db_url) as base:
        page_response = httpx.get(f"{base}/desk/")
        csp = page_response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert "<script>" not in page_response.text  # no inline script to allow
        enqueue(
            base,
            admin,
            ledger_entity=XSS,
            source_hash="<script>window.__pwned=2</script>",
            idempotency_key='"><svg onload=window.__pwned=3>',
        )
        page = contexts().new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        region = current(page)
        expect(region).to_contain_text(XSS)  # shown as the text it is
        expect(region).to_contain_text("<script>window.__pwned=2</script>")
        page.get_by_label("Note").fill('<b onmouseover="window.__pwned=4">bold</b>')
        page.get_by_label("Release reason").fill("<iframe src=javascript:window.__pwned=5>")
        page.get_by_role("button", name="Release", exact=True).click()
        expect(notice(page, "back to the queue")).to_be_visible()
        page.get_by_role("button", name="Next item").click()
        expect(region.get_by_role("list", name="Event history")).to_contain_text("<iframe src=javascript:")
        assert page.evaluate("() => window.__pwned") is None
        assert page.locator("img, svg, iframe, b[onmouseover]").count() == 0
        assert dialogs == []
        # The CSP is enforced: an inline script injected anyway does not run.
        page.evaluate(
            "() => { const s = document.createElement('script'); s.textContent = 'window.__pwned = 6';"
            " document.body.append(s); }"
        )
        assert page.evaluate("() => window.__pwned") is None
        shot(page, "desk-xss-inert")


def test_the_matchers_context_is_shown_as_text_with_only_web_links_clickable(
    db_url: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    context = {
        "account": "2100-AP",
        "counterparty": XSS,
        "value_dates": ["2026-11-30", "2026-12-01"],
        "statement": "https://bank.example/statements/8841",
        "sneaky": "javascript:window.__pwned=7",
    }
    with desk(db_url) as base:
        enqueue(base, admin, context=context)
        page = contexts().new_page()
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        shown = current(page).get_by_label("Context")
        expect(shown).to_contain_text("2100-AP")
        expect(shown).to_contain_text(XSS)  # the text it is, not an image
        expect(shown).to_contain_text('["2026-11-30","2026-12-01"]')
        links = shown.get_by_role("link")
        expect(links).to_have_count(1)
        assert links.get_attribute("href") == context["statement"]
        assert links.get_attribute("rel") == "noopener noreferrer"
        expect(shown).to_contain_text("javascript:window.__pwned=7")
        assert page.locator("img").count() == 0
        assert page.evaluate("() => window.__pwned") is None
        shot(page, "desk-context")


@pytest.fixture
def own_pg() -> Iterator[OwnPostgres]:
    """conftest's own_postgres, made on a worker thread: its migration runs asyncio.run, which
    cannot run on this thread while Playwright's event loop does."""
    with ThreadPoolExecutor(1) as worker:
        own = worker.submit(_own_postgres).result()
        yield own
        worker.submit(own.start).result()
        worker.submit(own.server.cleanup).result()


def _own_postgres() -> OwnPostgres:
    own = OwnPostgres(Path(tempfile.mkdtemp(prefix="rq-own-")))
    upgrade_head(own.url)
    return own


def test_a_database_outage_shows_a_banner_and_the_desk_recovers(
    own_pg: OwnPostgres, contexts: Callable[[], BrowserContext]
) -> None:
    own_postgres, url = own_pg, own_pg.url
    token, admin = _token_on(url, "alice", "reviewer"), _token_on(url, "ada", "admin")
    with desk(url) as base:
        page = contexts().new_page()
        sign_in(page, base, token)
        own_postgres.stop()
        page.get_by_role("button", name="Next item").click()
        banner = page.get_by_role("alert")
        expect(banner).to_contain_text("Database unavailable, retrying")
        shot(page, "desk-database-down")
        own_postgres.start()
        expect(banner).to_be_hidden(timeout=30_000)
        enqueue(base, admin, ledger_entity="AFTER-OUTAGE")
        expect(current(page)).to_contain_text("AFTER-OUTAGE", timeout=30_000)


def test_the_desk_is_served_at_the_root_too(db_url: str) -> None:
    with desk(db_url) as base:
        response = httpx.get(f"{base}/", follow_redirects=True)
    assert response.url.path == "/desk/"
    assert "Reviewer desk" in response.text


def test_the_figures_changed_while_you_were_reviewing(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin, ingest = make_token("ada", "admin"), make_token("ivan", "ingest")
    with desk(db_url) as base:
        item = enqueue(
            base, admin, ledger_entity="REVISED-CO", variance_amount="12.50", source_hash="sha256:old"
        )
        page = contexts().new_page()
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        region = current(page)
        expect(region.get_by_test_id("amount")).to_have_text("12.50")

        # The matcher re-runs while alice looks at the item.
        revised = httpx.post(
            f"{base}/items/{item['id']}/revisions",
            json={"variance_amount": "99.10", "source_hash": "sha256:new", "match_decision": "MATCHED"},
            headers={"Authorization": f"Bearer {ingest}"},
        )
        assert revised.status_code == 200, revised.text
        resolve(page)
        changed = region.get_by_role("alert", name="Figures changed")
        expect(changed).to_contain_text("The figures changed while you were reviewing")
        table = changed.get_by_role("table", name="Changed figures")
        expect(table).to_contain_text("Variance amount12.5099.10")
        expect(table).to_contain_text("Source hashsha256:oldsha256:new")
        expect(region.get_by_test_id("amount")).to_have_text("99.10")
        expect(region.get_by_role("list", name="Event history")).to_contain_text("REVISED by ivan")
        shot(page, "desk-figures-changed")
        assert "SOURCE_CHANGED" not in page.content()
        # Nothing was resolved on the old figures.
        assert [e[0] for e in events_of(sql, item["id"])] == ["ENQUEUED", "LEASED", "REVISED"]

        # Deciding again, on the new figures, goes through (with the new lease token).
        resolve(page)
        expect(notice(page, "Resolved REVISED-CO 99.10")).to_be_visible()
        expect(region.get_by_role("alert", name="Figures changed")).to_have_count(0)
        row = sql.execute(
            "SELECT state, resolved_by, variance_amount::text FROM review_queue_item WHERE id = %s",
            (item["id"],),
        ).fetchone()
        assert row == ("RESOLVED", "alice", "99.10")


def test_a_revision_is_noticed_by_the_heartbeat_before_resolving(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin, ingest = make_token("ada", "admin"), make_token("ivan", "ingest")
    lease_s = 3
    with desk(db_url, REVIEW_QUEUE_LOCK_TIMEOUT_MS=str(lease_s * 1000)) as base:
        item = enqueue(base, admin, variance_amount="5.00")
        page = contexts().new_page()
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        expect(current(page).get_by_test_id("amount")).to_have_text("5.00")
        httpx.post(
            f"{base}/items/{item['id']}/revisions",
            json={"variance_amount": "6.00", "source_hash": "sha256:again"},
            headers={"Authorization": f"Bearer {ingest}"},
        )
        # Active reviewer: the renewals go on, and the first one after the revision shows it.
        deadline = time.monotonic() + SOON / 1000 + 2 * lease_s
        alert = current(page).get_by_role("alert", name="Figures changed")
        while alert.count() == 0 and time.monotonic() < deadline:
            page.keyboard.press("Shift")
            time.sleep(0.3)
        expect(alert).to_contain_text("5.006.00")
        assert sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (item["id"],)).fetchone() == (
            "ASSIGNED",
        )


def test_admin_releases_a_reviewers_items_and_reassigns_one(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    make_token("bob", "reviewer")
    with desk(db_url) as base:
        items = [enqueue(base, admin, idempotency_key=f"OVR-{n}") for n in range(3)]
        carol = {"Authorization": f"Bearer {make_token('carol', 'reviewer')}"}
        httpx.post(f"{base}/leases", json={"batch_size": 3}, headers=carol)
        page = contexts().new_page()
        sign_in(page, base, admin)
        region = page.get_by_role("region", name="Admin")
        expect(region.get_by_role("table", name="Open leases per reviewer")).to_contain_text("carol3")

        region.get_by_label("Item id or idempotency key").fill("OVR-0")
        # A refresh of the panel's numbers (as any re-render) keeps what is being typed: without
        # that, the look-up below would send nothing (this failed in CI once, on a loaded machine).
        region.get_by_role("button", name="Refresh").click()
        expect(region.get_by_label("Item id or idempotency key")).to_have_value("OVR-0")
        region.get_by_role("button", name="Look up").click()
        # The look-up's answer (the item's trail) before the controls that depend on it.
        expect(region.get_by_role("list", name="Audit trail")).to_contain_text("LEASED by carol")
        region.get_by_label("Override reason").fill("carol is on leave")
        region.get_by_label("Reassign to").fill("bob")
        region.get_by_role("button", name="Reassign").click()
        expect(region).to_contain_text("Reassigned the item to bob.")
        expect(region.get_by_role("list", name="Audit trail")).to_contain_text("REASSIGNED by ada")
        expect(region.get_by_role("list", name="Audit trail")).to_contain_text("carol → bob")

        region.get_by_label("Override reason").fill("carol is on leave")
        region.get_by_label("Reviewer", exact=True).fill("carol")
        region.get_by_role("button", name="Release their items").click()
        expect(region).to_contain_text("Released 2 items of carol.")
        shot(page, "desk-admin-override")
        states = dict(
            sql.execute("SELECT idempotency_key, coalesce(leased_by, state) FROM review_queue_item")
        )
        assert states == {"OVR-0": "bob", "OVR-1": "PENDING", "OVR-2": "PENDING"}
        assert [e[:2] for e in events_of(sql, items[1]["id"])][-1] == ("RELEASED", "ada")


# --- the Reports view (web/reports.js) ------------------------------------------------------


def _api_rows(base: str, token: str, path: str, params: dict[str, str]) -> Any:
    response = httpx.get(f"{base}{path}", params=params, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def _table(page: Page, name: str) -> list[list[str]]:
    """A data table, found by its accessible name (its caption), as the text of its body cells."""
    rows = page.get_by_role("table", name=name, exact=True).locator("tbody tr")
    return [[c.strip() for c in row.locator("th, td").all_inner_texts()] for row in rows.all()]


def _percent(attainment: str | None) -> str:
    return "–" if attainment is None else f"{float(attainment) * 100:.1f} %"


def test_the_reports_view_draws_the_charts_with_tables_of_the_apis_numbers(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    import random
    from datetime import UTC, date, datetime, timedelta

    from tests import reports_support as ref

    rng = random.Random(28)
    now = datetime.now(UTC)
    gaps = [timedelta(minutes=m) for m in (3, 20, 90, 600)] + [timedelta(days=1)]
    histories = []
    for n in range(60):
        created = now - timedelta(days=rng.uniform(9, 55))
        due = created + timedelta(hours=rng.choice([24, 72, 120]))
        entity = rng.choice(["ACME", "GLOBEX"])
        histories.append(
            ref.live(rng, n, created_at=created, due_at=due, entity=entity, gaps=gaps, max_steps=6)
        )
    ref.arrange(sql, histories)
    auditor, reviewer = make_token("audrey", "auditor"), make_token("alice", "reviewer")
    first, last, tz = date.today() - timedelta(days=56), date.today() - timedelta(days=1), "Europe/Berlin"
    monday = first - timedelta(days=first.weekday())
    after = last - timedelta(days=last.weekday()) + timedelta(weeks=1)
    weeks = {"from": monday.isoformat(), "to": after.isoformat(), "tz": tz, "bucket": "week"}
    days = {"from": first.isoformat(), "to": (last + timedelta(days=1)).isoformat(), "tz": tz}
    with desk(db_url) as base:
        page = contexts().new_page()
        sign_in(page, base, auditor)
        reports = page.get_by_role("region", name="Reports")
        expect(reports.get_by_role("figure")).to_have_count(3)  # drawn for the default period first
        reports.get_by_label("From").fill(first.isoformat())
        reports.get_by_label("To (last day)").fill(last.isoformat())
        reports.get_by_label("Time zone").fill(tz)
        reports.get_by_role("button", name="Show reports").click()
        expect(reports.get_by_role("figure", name=re.compile(r"^SLA attainment per week \(weeks from "
                                                             + weeks["from"]))).to_be_visible()  # fmt: skip

        sla = _api_rows(base, auditor, "/reports/sla", weeks)
        expected_sla = [
            [b["start"], str(b["fell_due"]), str(b["on_time"]), str(b["late"]), str(b["open_past_due"]),
             _percent(b["attainment"])]
            for b in sla["buckets"]
        ]  # fmt: skip
        t = sla["total"]
        expected_sla.append(["Total", *(str(t[k]) for k in ("fell_due", "on_time", "late", "open_past_due")),
                             _percent(t["attainment"])])  # fmt: skip
        assert _table(page, "SLA attainment per week") == expected_sla
        assert sum(b["fell_due"] for b in sla["buckets"]) > 20

        throughput = _api_rows(base, auditor, "/reports/throughput", weeks)
        outcomes = ("resolved", "submitted_for_approval", "approved", "rejected", "released", "decisions")
        totals: dict[str, list[int]] = {}
        for row in throughput["rows"]:
            sums = totals.setdefault(row["reviewer"], [0] * len(outcomes))
            for i, key in enumerate(outcomes):
                sums[i] += row[key]
        assert _table(page, "Throughput per reviewer") == [
            [who, *map(str, sums)] for who, sums in sorted(totals.items())
        ]
        assert len(totals) >= 3

        backlog = _api_rows(base, auditor, "/reports/backlog", days)
        assert _table(page, "Backlog by age") == [
            [p["start"], *(str(p["by_age"][band]) for band in backlog["bands"]), str(p["open"])]
            for p in backlog["points"]
        ]
        assert len(backlog["points"]) == 56
        # Each chart is an image with a text alternative, drawn as SVG: no canvas, nothing fetched.
        assert reports.locator("svg[role=img]").count() == 3
        assert reports.locator("svg rect").count() > 20
        SHOTS.mkdir(exist_ok=True)
        reports.screenshot(path=str(SHOTS / "reports.png"))  # docs/reports.png is a copy of it

        # The download authenticates with the session cookie alone, like every call of the page.
        link = reports.get_by_role("link", name="Download decisions (CSV)")
        assert link.get_attribute("href") == "/reports/decisions.csv?" + "&".join(
            f"{k}={v.replace('/', '%2F')}" for k, v in days.items()
        )
        with page.expect_download() as downloading:
            link.click()
        content = Path(downloading.value.path()).read_bytes()
        exported = httpx.get(
            f"{base}/reports/decisions.csv", params=days, headers={"Authorization": f"Bearer {auditor}"}
        )
        assert content == exported.content and content.count(b"\r\n") > 10

        # A bad period is a sentence, not a broken page.
        reports.get_by_label("Time zone").fill("Mars/Olympus")
        reports.get_by_role("button", name="Show reports").click()
        expect(reports.get_by_role("status")).to_contain_text("Please check tz")
        expect(reports.get_by_role("figure")).to_have_count(0)

        other = contexts().new_page()
        sign_in(other, base, reviewer)
        expect(other.get_by_role("region", name="Current item")).to_be_visible()
        expect(other.get_by_role("region", name="Reports")).to_have_count(0)
