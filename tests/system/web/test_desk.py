"""The reviewer desk in a real browser: Debian's Chromium driven by Playwright, against
`review-queue serve` on a fresh database. Elements are found by role and accessible name.

Skipped where Chromium is missing, unless REVIEW_QUEUE_REQUIRE_BROWSER=1 (set by .ci/run), where
that is a failure. Screenshots of the main screens go to .screenshots/ (git-ignored).
"""

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import psycopg
import pytest

from db.migrations import upgrade_head
from tests.support import TESTS, backdate_lease, wait_for
from tests.support.postgres import libpq
from tests.support.servers import OwnPostgres, serving

pytest.importorskip("playwright")
from playwright.sync_api import Browser, BrowserContext, Locator, Page, Request, Route, expect

from tests.support.desk import SHOTS, SOON, Tokens, current, enqueue, resolve, shot, token_on


def desk(db_url: str, **env: str) -> AbstractContextManager[str]:
    """A desk process of the test's own, for settings (`REVIEW_QUEUE_…`) or a database the worker's
    shared server does not have."""
    return serving({"DATABASE_URL": db_url, **env})


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/desk/")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def notice(page: Page, text: str) -> Any:
    return page.get_by_role("status").filter(has_text=text)


def events_of(sql: psycopg.Connection, item_id: str) -> list[tuple[str, str, Any]]:
    return sql.execute(
        "SELECT event, actor, details FROM review_queue_event WHERE item_id = %s ORDER BY id", (item_id,)
    ).fetchall()


@pytest.fixture
def make_token(db_url: str) -> Tokens:
    return lambda subject, role: token_on(db_url, subject, role)


def view(page: Page, name: str) -> None:
    """Open one of the desk's views from the header's navigation."""
    page.get_by_role("navigation", name="Views").get_by_role("link", name=name, exact=True).click()


def test_keyboard_alone_signs_in_leases_resolves_and_advances(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    token, admin = make_token("alice", "reviewer"), make_token("ada", "admin")
    base = live_server
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
    # Every digit the API gives, grouped by thousands, never through a float.
    expect(region.get_by_test_id("amount")).to_have_text("1,234,567,890,123,456.78")
    expect(region).to_contain_text(first["source_hash"])
    expect(region).to_contain_text(first["trace_id"])
    expect(region.get_by_role("list", name="Event history")).to_contain_text("LEASED by alice")
    assert page.get_by_test_id("amount").evaluate("e => getComputedStyle(e).textAlign") == "right"
    shot(page, "desk-item")

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
    expect(region.get_by_label("Resolution", exact=True).locator("option")).to_have_count(len(codes) + 1)
    # No code is chosen for you: resolving without one asks for it and sends nothing.
    page.keyboard.press("Control+Enter")
    expect(notice(page, "Choose a resolution first")).to_be_visible()
    assert [e[0] for e in events_of(sql, first["id"])] == ["ENQUEUED", "LEASED"]
    page.keyboard.press("Escape")
    expect(region.get_by_label("Resolution", exact=True)).to_contain_text(
        "Write-off (WRITE_OFF): note required, approver from 1000.00"
    )
    # A code without a threshold of its own says where materiality starts (issue 23).
    expect(region.get_by_label("Resolution", exact=True)).to_contain_text(
        "Approved as is (APPROVED): approver from 10000.00"
    )
    page.keyboard.press(str(codes.index("WRITE_OFF") + 1))
    page.keyboard.press("e")
    expect(region.get_by_label("Note", exact=True)).to_be_focused()
    page.keyboard.type("FX rounding")
    page.keyboard.press("Control+Enter")  # resolve and advance, one keystroke
    expect(region).to_contain_text("GLOBEX")
    expect(region.get_by_test_id("amount")).to_have_text("-0.10")  # the sign kept
    # WRITE_OFF needs an approver from 1,000.00 on: the desk submitted it and moved on.
    row = sql.execute(
        "SELECT state, proposed_resolution, proposed_note, prepared_by FROM review_queue_item WHERE id = %s",
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    alice, april, admin = (
        make_token("alice", "reviewer"),
        make_token("april", "approver"),
        make_token("ada", "admin"),
    )
    base = live_server
    big = [enqueue(base, admin, ledger_entity=f"BIG-{n}", variance_amount="25000.00") for n in range(2)]
    preparer = contexts().new_page()
    sign_in(preparer, base, alice)
    # A plain reviewer has no Approvals view.
    expect(preparer.get_by_role("region", name="Approvals")).to_have_count(0)
    preparer.get_by_role("button", name="Next item").click()
    for n in range(2):  # resolving moves on to the next item by itself
        expect(current(preparer)).to_contain_text(f"BIG-{n}")
        current(preparer).get_by_label("Resolution", exact=True).select_option("WRITE_OFF")
        current(preparer).get_by_label("Note", exact=True).fill(f"write-off {n}")
        current(preparer).get_by_role("button", name="Resolve", exact=True).click()
        expect(notice(preparer, f"Submitted BIG-{n} 25,000.00 as WRITE_OFF for approval")).to_be_visible()
    states = sql.execute("SELECT DISTINCT state FROM review_queue_item").fetchall()
    assert states == [("AWAITING_APPROVAL",)], states

    preparer.close()  # its desk would take the rejected item back at once (it is first in line)
    checker = contexts().new_page()
    sign_in(checker, base, april)
    view(checker, "Approvals")
    approvals = checker.get_by_role("region", name="Approvals")
    approvals.get_by_role("button", name="Lease a proposal").click()
    proposal = approvals.get_by_role("term").filter(has_text="Prepared by")
    expect(proposal).to_be_visible()
    expect(approvals).to_contain_text("BIG-0")
    expect(approvals).to_contain_text("write-off 0")
    expect(approvals.get_by_label("Proposal")).to_contain_text("alice")
    shot(checker, "desk-approvals")
    approvals.get_by_role("button", name="Approve").click()
    expect(approvals).to_contain_text("Approved BIG-0 25,000.00: resolved as WRITE_OFF by alice.")
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
    expect(approvals).to_contain_text("Rejected BIG-1 25,000.00: back in the queue (wrong entity).")
    assert sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (big[1]["id"],)).fetchone() == (
        "PENDING",
    )
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    base = live_server
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    base = live_server
    older = enqueue(base, admin, ledger_entity="ACME-CORP")  # first in line for anyone else
    globex = enqueue(base, admin, ledger_entity="GLOBEX")
    page = contexts().new_page()
    sign_in(page, base, make_token("gina", "reviewer"))
    page.get_by_label("Only ledger entity").fill("GLOBEX")
    page.get_by_role("button", name="Next item").click()
    expect(current(page).get_by_test_id("amount")).to_be_visible()
    expect(current(page)).to_contain_text("GLOBEX")
    held = sql.execute("SELECT idempotency_key FROM review_queue_item WHERE leased_by = 'gina'").fetchall()
    assert held == [(globex["idempotency_key"],)]
    assert sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (older["id"],)).fetchone() == (
        "PENDING",
    )


def test_reload_keeps_items_and_a_stale_tab_says_what_happened(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin, token = make_token("ada", "admin"), make_token("alice", "reviewer")
    base = live_server
    item = enqueue(base, admin, ledger_entity="RELOADED")
    context = contexts()
    tab = context.new_page()
    sign_in(tab, base, token)
    tab.get_by_role("button", name="Next item").click()
    expect(current(tab)).to_contain_text("RELOADED")
    tab.reload()
    expect(current(tab)).to_contain_text("RELOADED")  # found with GET /items?leased_by=me
    expect(notice(tab, "you hold 1 item")).to_be_visible()

    # The lease lapses, is reclaimed and leased again, by alice herself in another tab. (The
    # tab may still be renewing after the reload: a renewal between the two statements makes
    # the lease current again, so lapse it again until the reclaim takes it.)
    def lapse_and_reclaim() -> bool:
        backdate_lease(sql, item["id"])
        answer = httpx.post(f"{base}/admin/reclaim", headers={"Authorization": f"Bearer {admin}"})
        return bool(answer.json()["reclaimed"] == 1)

    wait_for(lapse_and_reclaim, 30)
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    # Sign-in asks which items the reviewer already holds. A lease sent before that answer was
    # found by it: "Welcome back: you hold 1 item" for an item just taken, and a renewal (seen
    # once in CI, on a loaded machine). Here that answer is held back until the lease has had
    # every chance to go first.
    admin, token = make_token("ada", "admin"), make_token("alice", "reviewer")
    base = live_server
    item = enqueue(base, admin, ledger_entity="JUST-TAKEN")
    page = contexts().new_page()
    held: list[Route] = []
    page.route("**/items?state=ASSIGNED*", lambda route: held.append(route))
    leases: list[Request] = []
    page.on("request", lambda r: leases.append(r) if r.url.endswith("/leases") else None)
    sign_in(page, base, token)
    until_routed(page, held, "sign-in's question")  # on hold
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    base = live_server
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
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    base = live_server
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


def test_waiting_for_work_stops_when_the_reviewer_is_away(
    db_url: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    """An empty queue makes the desk wait for work (long polls, one after another); once nobody has
    touched the page for the idle time it stops asking, so an unattended tab leases nothing."""
    idle_s = 3
    with desk(db_url, REVIEW_QUEUE_UI_IDLE_RELEASE_TEST_S=str(idle_s)) as base:
        page = contexts().new_page()

        def short_polls(route: Route, request: Request) -> None:
            # Each long poll lasts 1 s instead of 20, so the loop comes round to its idle check soon.
            body = request.post_data_json if request.method == "POST" else None
            if isinstance(body, dict) and body.get("wait_s"):
                route.continue_(post_data=json.dumps({**body, "wait_s": 1}))
            else:
                route.continue_()

        page.route("**/leases", short_polls)
        sign_in(page, base, make_token("alice", "reviewer"))
        page.get_by_role("button", name="Next item").click()
        queue = page.get_by_role("region", name="Queue")
        expect(queue).to_contain_text("Waiting for work")
        # No key, click or scroll from here on.
        expect(page.get_by_text("Stopped waiting for work while you were away")).to_be_visible(
            timeout=idle_s * 1000 + 6 * SOON
        )
        expect(queue).not_to_contain_text("Waiting for work")
        enqueue(base, make_token("ada", "admin"), ledger_entity="WHILE-AWAY")
        # Back at the desk: Next item carries on, and leases what arrived meanwhile.
        page.get_by_role("button", name="Next item").click()
        expect(current(page)).to_contain_text("WHILE-AWAY")


def test_admin_sees_stats_reclaims_and_looks_up_an_audit_trail(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    base = live_server
    items = [enqueue(base, admin, idempotency_key=f"ADM-{n}") for n in range(3)]
    bob = {"Authorization": f"Bearer {make_token('bob', 'reviewer')}"}
    httpx.post(f"{base}/leases", json={"batch_size": 2}, headers=bob)
    backdate_lease(sql, items[0]["id"])
    page = contexts().new_page()
    sign_in(page, base, admin)
    view(page, "Admin")
    region = page.get_by_role("region", name="Admin")
    expect(region.get_by_role("table", name="Items by state")).to_contain_text("ASSIGNED2")
    expect(region.get_by_role("table", name="Open leases per reviewer")).to_contain_text("bob2")
    expect(region).to_contain_text("Oldest pending:")
    expect(region).to_contain_text("Overdue: 0")
    expect(region.get_by_role("table", name="Open items by age")).to_contain_text("0-1d3")
    expect(region.get_by_role("table", name="Open items per currency")).to_contain_text("USD3")
    expect(region).to_contain_text("Waiting without an exchange rate (each needs an approver): 0")
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    token, admin = make_token("alice", "reviewer"), make_token("ada", "admin")
    base = live_server
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
    view(page, "Admin")
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
    # No release cool-off: the released item comes straight back to show its trail.
    with desk(db_url, REVIEW_QUEUE_RELEASE_COOLDOWN_S="0") as base:
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
        region.get_by_label("Note", exact=True).fill('<b onmouseover="window.__pwned=4">bold</b>')
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
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    context = {
        "account": "2100-AP",
        "counterparty": XSS,
        "value_dates": ["2026-11-30", "2026-12-01"],
        "statement": "https://bank.example/statements/8841",
        "sneaky": "javascript:window.__pwned=7",
    }
    base = live_server
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
    token, admin = token_on(url, "alice", "reviewer"), token_on(url, "ada", "admin")
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


def _read_only(url: str, on: bool) -> None:
    """What the service sees of a failover: its server turns read-only (the demoted primary, every
    session ended; new ones are read-only), then takes writes again (the new leader)."""
    # Its own session writable: the database's default is what is switched.
    with psycopg.connect(libpq(url), autocommit=True, options="-c default_transaction_read_only=off") as sql:
        if on:
            sql.execute("ALTER DATABASE postgres SET default_transaction_read_only = on")
            sql.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = 'postgres' AND pid <> pg_backend_pid()"
            )
        else:
            sql.execute("ALTER DATABASE postgres RESET default_transaction_read_only")


def test_a_leader_gone_read_only_shows_the_banner_and_the_desk_carries_on(
    own_pg: OwnPostgres, contexts: Callable[[], BrowserContext]
) -> None:
    """Not a server that is down but one that answers read-only, as the old primary does while the
    standby is promoted: every write is a 503 DATABASE_UNAVAILABLE, the desk says so and retries,
    and once writes are taken again it carries on with no reload: the resolution it was retrying
    goes through with the lease held across."""
    url = own_pg.url
    token, admin = token_on(url, "alice", "reviewer"), token_on(url, "ada", "admin")
    with desk(url) as base:
        page = contexts().new_page()
        held = enqueue(base, admin, ledger_entity="HELD-ACROSS")
        sign_in(page, base, token)
        page.get_by_role("button", name="Next item").click()
        expect(current(page)).to_contain_text("HELD-ACROSS")
        _read_only(url, on=True)
        resolve(page)
        banner = page.get_by_role("alert")
        expect(banner).to_contain_text("Database unavailable, retrying")
        shot(page, "desk-database-read-only")
        _read_only(url, on=False)
        expect(banner).to_be_hidden(timeout=30_000)
        with psycopg.connect(libpq(url)) as sql:
            state = "SELECT state FROM review_queue_item WHERE id = %s"
            wait_for(lambda: sql.execute(state, (held["id"],)).fetchone() == ("RESOLVED",), 30)


def test_the_desk_is_served_at_the_root_too(live_server: str) -> None:
    base = live_server
    response = httpx.get(f"{base}/", follow_redirects=True)
    assert response.url.path == "/desk/"
    assert "Reviewer desk" in response.text


def test_the_figures_changed_while_you_were_reviewing(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin, ingest = make_token("ada", "admin"), make_token("ivan", "ingest")
    base = live_server
    item = enqueue(base, admin, ledger_entity="REVISED-CO", variance_amount="12.50", source_hash="sha256:old")
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
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    make_token("bob", "reviewer")
    base = live_server
    items = [enqueue(base, admin, idempotency_key=f"OVR-{n}") for n in range(3)]
    carol = {"Authorization": f"Bearer {make_token('carol', 'reviewer')}"}
    httpx.post(f"{base}/leases", json={"batch_size": 3}, headers=carol)
    page = contexts().new_page()
    sign_in(page, base, admin)
    view(page, "Admin")
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
    states = dict(sql.execute("SELECT idempotency_key, coalesce(leased_by, state) FROM review_queue_item"))
    assert states == {"OVR-0": "bob", "OVR-1": "PENDING", "OVR-2": "PENDING"}
    assert [e[:2] for e in events_of(sql, items[1]["id"])][-1] == ("RELEASED", "ada")


# --- issue 24: the reviewer's workplace ----------------------------------------------------------

AXE = TESTS / "node_modules" / "axe-core" / "axe.min.js"
DOCS_SHOT = Path(__file__).resolve().parents[3] / "docs" / "desk.png"


def _axe_or_skip() -> Path:
    if not AXE.exists():
        if os.environ.get("REVIEW_QUEUE_REQUIRE_AXE"):
            pytest.fail(f"REVIEW_QUEUE_REQUIRE_AXE is set but {AXE} is missing (npm ci in tests/)")
        pytest.skip("axe-core is not installed (cd tests && npm ci; .ci/run does)")
    return AXE


def assert_accessible(page: Page, where: str) -> None:
    """axe-core (loaded by the test as an init script, never served) finds nothing serious."""
    found = page.evaluate(
        """async () => (await axe.run(document)).violations
            .filter((v) => v.impact === "serious" || v.impact === "critical")
            .map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(" ")).slice(0, 3).join(", ")}`)"""
    )
    assert found == [], f"{where}: {found}"


def get_item(base: str, token: str, item_id: str) -> dict[str, Any]:
    response = httpx.get(f"{base}/items/{item_id}", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_note_typed_with_the_keyboard_alone_is_resolved_with_the_item(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """n, a digit, e, the note, Ctrl+Enter: the note is on the item (it was lost: focus sat on the
    Resolution list after the lease, where `e` and the typing went)."""
    admin, token = make_token("ada", "admin"), make_token("alice", "reviewer")
    base = live_server
    item = enqueue(base, admin, ledger_entity="KEYS-CO")
    enqueue(base, admin, ledger_entity="NEXT-CO")
    codes = [
        c["code"]
        for c in httpx.get(f"{base}/resolutions", headers={"Authorization": f"Bearer {admin}"}).json()[
            "resolutions"
        ]
    ]
    page = contexts().new_page()
    sign_in(page, base, token)
    page.keyboard.press("n")
    expect(current(page)).to_contain_text("KEYS-CO")
    page.keyboard.press(str(codes.index("MATCH_CONFIRMED") + 1))
    page.keyboard.press("e")
    page.keyboard.type("Confirmed with the bank, ref 8841")
    page.keyboard.press("Control+Enter")
    expect(current(page)).to_contain_text("NEXT-CO")
    resolved = get_item(base, admin, item["id"])
    assert (resolved["state"], resolved["resolution"], resolved["resolution_note"]) == (
        "RESOLVED",
        "MATCH_CONFIRMED",
        "Confirmed with the bank, ref 8841",
    )


def test_a_refused_decision_marks_its_field_and_keeps_what_was_typed(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin, token = make_token("ada", "admin"), make_token("alice", "reviewer")
    root = {"Authorization": f"Bearer {admin}"}
    base = live_server
    item = enqueue(base, admin, ledger_entity="REFUSED-CO")
    page = contexts().new_page()
    sign_in(page, base, token)
    page.keyboard.press("n")
    region = current(page)
    expect(region).to_contain_text("REFUSED-CO")
    note, code = region.get_by_label("Note", exact=True), region.get_by_label("Resolution", exact=True)
    # ESCALATED requires a note: the service refuses it without one.
    code.select_option("ESCALATED")
    region.get_by_role("button", name="Resolve", exact=True).click()
    expect(note).to_have_attribute("aria-invalid", "true")
    expect(region.get_by_text("Escalated (ESCALATED) needs a note.")).to_be_visible()
    expect(code).to_have_value("ESCALATED")
    # The code is deactivated while the reviewer writes: refused at the Resolution list, note kept.
    deactivated = httpx.put(
        f"{base}/resolutions/ESCALATED",
        json={"label": "Escalated", "requires_note": True, "active": False},
        headers=root,
    )
    assert deactivated.status_code == 200, deactivated.text
    note.fill("to the FX desk")
    expect(note).not_to_have_attribute("aria-invalid", "true")
    region.get_by_role("button", name="Resolve", exact=True).click()
    expect(code).to_have_attribute("aria-invalid", "true")
    expect(region.get_by_text("is no longer an active resolution code")).to_be_visible()
    expect(note).to_have_value("to the FX desk")
    assert get_item(base, admin, item["id"])["state"] == "ASSIGNED"


def test_a_released_item_goes_to_the_other_reviewer(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    """Release then Next: alice gets the next item, bob gets the one she released, in its place."""
    admin = make_token("ada", "admin")
    base = live_server
    first = enqueue(base, admin, ledger_entity="FIRST-CO")
    enqueue(base, admin, ledger_entity="SECOND-CO")
    alice, bob = contexts().new_page(), contexts().new_page()
    sign_in(alice, base, make_token("alice", "reviewer"))
    sign_in(bob, base, make_token("bob", "reviewer"))
    alice.keyboard.press("n")
    expect(current(alice)).to_contain_text("FIRST-CO")
    alice.keyboard.press("x")
    expect(notice(alice, "It goes to other reviewers for the next 15 min")).to_be_visible()
    alice.keyboard.press("n")
    expect(current(alice)).to_contain_text("SECOND-CO")
    bob.keyboard.press("n")
    expect(current(bob)).to_contain_text("FIRST-CO")
    row = sql.execute("SELECT leased_by, attempts FROM review_queue_item WHERE id = %s", (first["id"],))
    assert row.fetchone() == ("bob", 2)


def test_the_approver_sees_the_evidence_and_a_rejection_comes_back_with_a_banner(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    context = {
        "currency": "EUR",
        "statement": "https://bank.example/statements/8841",
        "sneaky": "javascript:alert(1)",
    }
    base = live_server
    item = enqueue(
        base,
        admin,
        ledger_entity="EVIDENCE-CO",
        variance_amount="-25000.00",
        currency="EUR",
        context=context,
    )
    preparer = contexts().new_page()
    sign_in(preparer, base, make_token("alice", "reviewer"))
    preparer.keyboard.press("n")
    expect(current(preparer).get_by_test_id("amount")).to_have_text("-25,000.00")
    expect(current(preparer).get_by_test_id("currency")).to_have_text("EUR")
    resolve_with = current(preparer)
    resolve_with.get_by_label("Resolution", exact=True).select_option("WRITE_OFF")
    resolve_with.get_by_label("Note", exact=True).fill("bank charges, see statement")
    resolve_with.get_by_role("button", name="Resolve", exact=True).click()
    expect(notice(preparer, "Submitted EVIDENCE-CO -25,000.00 as WRITE_OFF")).to_be_visible()

    checker = contexts().new_page()
    sign_in(checker, base, make_token("april", "approver"))
    view(checker, "Approvals")
    approvals = checker.get_by_role("region", name="Approvals")
    expect(approvals.get_by_test_id("waiting")).to_have_text("1 proposal is waiting for an approver.")
    approvals.get_by_role("button", name="Lease a proposal").click()
    expect(approvals.get_by_test_id("amount")).to_have_text("-25,000.00")
    proposal = approvals.get_by_label("Proposal")
    expect(proposal).to_contain_text("alice")
    expect(proposal).to_contain_text("bank charges, see statement")
    expect(proposal).to_contain_text("Needs an approver from 1,000.00")
    expect(approvals.get_by_role("timer")).to_have_text(re.compile(r"\d+ s left"))
    links = approvals.get_by_label("Context").get_by_role("link")
    expect(links).to_have_count(1)
    assert links.get_attribute("href") == context["statement"]
    trail = approvals.get_by_role("list", name="Event history")
    expect(trail).to_contain_text("SUBMITTED_FOR_APPROVAL by alice")
    expect(trail).to_contain_text("LEASED by april")
    shot(checker, "desk-approval-evidence")
    approvals.get_by_label("Reject reason").fill("needs the bank's confirmation")
    approvals.get_by_role("button", name="Reject").click()
    expect(approvals).to_contain_text("back in the queue")

    # Back with alice: the rejection is a banner on the item, not only a line of its history.
    preparer.keyboard.press("n")
    banner = current(preparer).get_by_role("alert", name="Proposal rejected")
    expect(banner).to_contain_text("Rejected by april: needs the bank's confirmation")
    view(preparer, "Items")
    mine = preparer.get_by_role("table", name="My decisions")
    expect(mine).to_contain_text("Submitted for approval as WRITE_OFF")
    expect(mine).to_contain_text("EVIDENCE-CO -25,000.00")
    assert get_item(base, admin, item["id"])["leased_by"] == "alice"


def test_comments_and_a_rejected_proposal_back_to_its_preparer_first_with_the_rejection_in_my_decisions(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    """Issue 42 in the desk: the approver asks in a comment, rejects, and the preparer's next item is
    that proposal (ahead of an earlier deadline), with the comment in its history; they answer in a
    comment. Comments change nothing but the trail."""
    admin = make_token("ada", "admin")
    base = live_server
    item = enqueue(
        base,
        admin,
        ledger_entity="COMMENT-CO",
        variance_amount="-25000.00",
        due_at="2031-01-01T00:00:00Z",
    )
    preparer = contexts().new_page()
    sign_in(preparer, base, make_token("alice", "reviewer"))
    preparer.keyboard.press("n")
    work = current(preparer)
    work.get_by_label("Resolution", exact=True).select_option("WRITE_OFF")
    work.get_by_label("Note", exact=True).fill("bank charges")
    work.get_by_role("button", name="Resolve", exact=True).click()
    expect(notice(preparer, "Submitted COMMENT-CO -25,000.00 as WRITE_OFF")).to_be_visible()
    preparer.close()  # or its waiting lease would take the next item enqueued
    earlier = enqueue(base, admin, ledger_entity="EARLIER-CO", due_at="2030-01-01T00:00:00Z")

    checker = contexts().new_page()
    sign_in(checker, base, make_token("april", "approver"))
    view(checker, "Approvals")
    approvals = checker.get_by_role("region", name="Approvals")
    approvals.get_by_role("button", name="Lease a proposal").click()
    approvals.get_by_role("textbox", name="Comment").fill("Which statement shows the charges?")
    approvals.get_by_role("button", name="Add comment").click()
    trail = approvals.get_by_role("list", name="Event history")
    expect(trail).to_contain_text("COMMENTED by april · “Which statement shows the charges?”")
    assert get_item(base, admin, item["id"])["state"] == "AWAITING_APPROVAL"
    preparer = contexts().new_page()
    sign_in(preparer, base, make_token("alice", "reviewer"))
    count = preparer.get_by_role("banner").get_by_role("link", name=re.compile("rejected"))
    expect(count).to_be_hidden()
    approvals.get_by_label("Reject reason").fill("attach the statement")
    approvals.get_by_role("button", name="Reject").click()
    expect(approvals).to_contain_text("back in the queue")

    # alice's desk counts it without a reload (the decisions refresh every 15 s).
    expect(count).to_have_text("1 proposal rejected", timeout=30_000)
    # Back with alice: her rejected proposal first, though EARLIER-CO is due sooner.
    preparer.keyboard.press("n")
    work = current(preparer)
    expect(work.get_by_role("alert", name="Proposal rejected")).to_contain_text(
        "Rejected by april: attach the statement"
    )
    history = work.get_by_role("list", name="Event history")
    expect(history).to_contain_text("COMMENTED by april · “Which statement shows the charges?”")
    work.get_by_role("textbox", name="Comment").fill("Statement 8841, page 2.")
    work.get_by_role("button", name="Add comment").click()
    expect(history).to_contain_text("COMMENTED by alice · “Statement 8841, page 2.”")
    assert get_item(base, admin, item["id"])["leased_by"] == "alice"
    assert get_item(base, admin, earlier["id"])["state"] == "PENDING"
    # My decisions: who rejected it and why, on its row, and what it is now; looked at, the count goes.
    view(preparer, "Items")
    row = preparer.get_by_role("table", name="My decisions").get_by_role("row").filter(has_text="COMMENT-CO")
    expect(row).to_contain_text("Submitted for approval as WRITE_OFF")
    expect(row).to_contain_text("Rejected by april: attach the statement")
    expect(row).to_contain_text("Assigned")
    expect(count).to_be_hidden()
    comments = [(a, d["text"]) for e, a, d in events_of(sql, item["id"]) if e == "COMMENTED"]
    assert comments == [
        ("april", "Which statement shows the charges?"),
        ("alice", "Statement 8841, page 2."),
    ]


def until_routed(page: Page, seen: list[Any], what: str) -> None:
    """Wait until a route handler has run: it runs only inside a Playwright call, so the wait is
    Playwright's own, not a sleep."""
    for _ in range(200):
        if seen:
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"{what} was not seen")


class Held:
    """The page's requests to `url`, held back from it: seen as they are sent, answered by the API
    when the test says (`answer`), delivered to the page when it says (`deliver`). The route handler
    only records: a fetch inside it counted against until_routed's wait, so in a loaded CI a slow
    answer read as a request never sent (2026-12-08)."""

    def __init__(self, page: Page, url: str | Callable[[str], bool]) -> None:
        self.page, self.url = page, url
        self.routes: list[Route] = []
        self.answers: list[Any] = []
        page.route(url, lambda route: self.routes.append(route))

    def seen(self, what: str) -> None:
        until_routed(self.page, self.routes, what)

    def answer(self) -> list[Any]:
        """The API's answers to the requests held so far, asked now."""
        self.answers += [route.fetch() for route in self.routes[len(self.answers) :]]
        return self.answers

    def deliver(self) -> None:
        for route, response in zip(self.routes, self.answer(), strict=True):
            route.fulfill(response=response)
        self.page.unroute(self.url)


def _my_approvals(url: str) -> bool:
    return "state=AWAITING_APPROVAL&leased_by=me" in url


def approver_opening_approvals(page: Page, base: str, token: str) -> tuple[Held, list[str]]:
    """An approver signs in and opens the approvals view, whose first look at the proposals they
    hold is answered by the API at once and held back from the page: the look, and the leases the
    page sends from then on."""
    looks = Held(page, _my_approvals)
    sign_in(page, base, token)
    view(page, "Approvals")
    looks.seen("the view's look at my approvals")
    looks.answer()
    leases: list[str] = []
    page.route("**/leases", lambda route: (leases.append(route.request.url), route.continue_()))
    return looks, leases


def test_a_lease_clicked_while_the_view_still_loads_waits_for_it_and_stays_shown(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """The approvals view's first look at the proposals I hold and a lease cross: the look is
    answered before the lease (nothing held) and delivered after it. The lease waits for the look,
    and the proposal leased stays on the desk (before, the look's late answer took it off: the
    approver held a proposal the desk did not show; seen in CI, 2026-12-07)."""
    from tests.support.approval import submitted

    def auth(who: str, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(who, role)}"}

    base, admin = live_server, make_token("ada", "admin")
    with httpx.Client(base_url=base, timeout=30) as http:
        item_id, _ = submitted(http, auth, ledger_entity="CROSSED-CO")  # type: ignore[arg-type]
    checker = contexts().new_page()
    looks, leases = approver_opening_approvals(checker, base, make_token("april", "approver"))
    assert looks.answers[0].json()["items"] == []
    approvals = checker.get_by_role("region", name="Approvals")
    approvals.get_by_role("button", name="Lease a proposal").click()
    checker.wait_for_timeout(1_000)  # the old desk sent its lease at once
    assert leases == [], "a lease was sent before the view's look at my approvals was delivered"
    looks.deliver()
    trail = approvals.get_by_role("list", name="Event history")
    expect(trail).to_contain_text("LEASED by april")
    approvals.get_by_role("textbox", name="Comment").fill("Crossed reads")
    approvals.get_by_role("button", name="Add comment").click()
    expect(trail).to_contain_text("COMMENTED by april · “Crossed reads”")
    expect(approvals.get_by_role("button", name="Lease a proposal")).to_be_hidden()
    assert get_item(base, admin, item_id)["leased_by"] == "april"


def test_a_lease_clicked_while_the_view_still_loads_shows_the_proposal_already_held(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """The same crossing when the approver already holds a proposal (leased in another tab): once
    the look is delivered the desk shows the one held and leases no other (ungated, the click
    leased a second proposal at once)."""
    from tests.support.approval import submitted

    def auth(who: str, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {make_token(who, role)}"}

    base, admin = live_server, make_token("ada", "admin")
    with httpx.Client(base_url=base, timeout=30) as http:
        held_id, _ = submitted(http, auth, ledger_entity="HELD-CO")  # type: ignore[arg-type]
        other_id, _ = submitted(http, auth, ledger_entity="OTHER-CO")  # type: ignore[arg-type]
        leased = http.post(
            "/leases", json={"queue": "approval", "item_id": held_id}, headers=auth("april", "approver")
        )
        assert leased.status_code == 200, leased.text
    checker = contexts().new_page()
    looks, leases = approver_opening_approvals(checker, base, make_token("april", "approver"))
    assert [item["id"] for item in looks.answers[0].json()["items"]] == [held_id]
    approvals = checker.get_by_role("region", name="Approvals")
    approvals.get_by_role("button", name="Lease a proposal").click()
    looks.deliver()
    expect(approvals).to_contain_text("HELD-CO")
    expect(approvals.get_by_role("button", name="Lease a proposal")).to_be_hidden()
    checker.wait_for_timeout(1_000)  # a lease sent after the look would show by now
    assert leases == [], "the desk leased another proposal while one was held"
    assert get_item(base, admin, other_id)["leased_by"] is None


def test_a_comment_sent_while_the_trail_is_still_loading_stays_in_the_history(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """The review view reads the trail of the item it shows again (`n` while holding it) and a
    comment crosses that read: the read is answered before the comment and delivered after it. The
    comment stays in the history (before, the late read replaced the history without it; seen once
    in a loaded run)."""
    base = live_server
    enqueue(base, make_token("ada", "admin"), ledger_entity="CROSSED-CO")
    page = contexts().new_page()
    sign_in(page, base, make_token("alice", "reviewer"))
    page.keyboard.press("n")
    work = current(page)
    history = work.get_by_role("list", name="Event history")
    expect(history).to_contain_text("LEASED by alice")
    reads = Held(page, "**/items/*/events")
    page.keyboard.press("n")  # holding an item: it is shown again, its trail read anew
    reads.seen("the trail's second read")
    reads.answer()  # before the comment
    work.get_by_role("textbox", name="Comment").fill("Crossed reads")
    work.get_by_role("button", name="Add comment").click()
    expect(history).to_contain_text("COMMENTED by alice · “Crossed reads”")
    # The history the late read will replace, marked: its render makes a new one.
    history.evaluate("list => { list.dataset.beforeTheRead = 'yes'; }")
    reads.deliver()
    expect(work.locator("[data-before-the-read]")).to_have_count(0)
    expect(history).to_contain_text("LEASED by alice")
    expect(history).to_contain_text("COMMENTED by alice · “Crossed reads”")


def test_lease_this_item_while_holding_another_shows_the_item_just_leased(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """Issue 42, a small thing seen: the item asked for is the one shown; the one held before waits
    behind it."""
    admin = make_token("ada", "admin")
    base = live_server
    enqueue(base, admin, ledger_entity="HELD-FIRST", due_at="2030-01-01T00:00:00Z")
    enqueue(base, admin, ledger_entity="ASKED-FOR", due_at="2031-01-01T00:00:00Z")
    page = contexts().new_page()
    sign_in(page, base, make_token("alice", "reviewer"))
    page.keyboard.press("n")
    expect(current(page)).to_contain_text("HELD-FIRST")
    view(page, "Items")
    page.get_by_role("table", name="Items list").get_by_role("button", name="ASKED-FOR").click()
    page.get_by_role("region", name="Item details").get_by_role("button", name="Lease this item").click()
    expect(current(page)).to_contain_text("ASKED-FOR")
    expect(current(page)).to_contain_text("You hold 2 items")


def rows_of(page: Page) -> list[str]:
    table = page.get_by_role("table", name="Items list")
    return [b.inner_text() for b in table.get_by_role("button").all()]


def test_the_work_list_filters_as_the_api_does_leases_a_row_and_resolves_in_bulk(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    admin, alice_token = make_token("ada", "admin"), make_token("alice", "reviewer")
    root = {"Authorization": f"Bearer {admin}"}
    specs = [
        ("LIST-A", "1500.00", "2020-01-01T00:00:00Z"),
        ("LIST-B", "-2500.00", "2021-06-01T00:00:00Z"),
        ("LIST-C", "12.50", "2020-06-01T00:00:00Z"),
        ("LIST-D", "3000.00", "2999-01-01T00:00:00Z"),
        ("LIST-E", "-999.99", "2022-01-01T00:00:00Z"),
    ]
    base = live_server
    items = {e: enqueue(base, admin, ledger_entity=e, variance_amount=a, due_at=d) for e, a, d in specs}
    page = contexts().new_page()
    sign_in(page, base, alice_token)
    view(page, "Items")
    region = page.get_by_role("region", name="Items")
    tabs = region.get_by_role("tablist", name="State")
    expect(tabs.get_by_role("tab", name="Pending 5")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_role("table", name="Items list")).to_be_visible()
    assert rows_of(page) == ["LIST-A", "LIST-C", "LIST-B", "LIST-E", "LIST-D"]  # by due date

    # The filters give exactly what GET /items gives for them.
    region.get_by_label("Minimum amount").fill("1000")
    region.get_by_label("Maximum amount").fill("2500")
    region.get_by_label("Overdue only").check()
    expect(page.get_by_role("table", name="Items list").get_by_role("button")).to_have_count(2)
    api = httpx.get(
        f"{base}/items",
        params={"state": "PENDING", "min_amount": "1000", "max_amount": "2500", "sort": "due_at",
                "due_before": "2999-01-01T00:00:00Z"},
        headers=root,
    ).json()["items"]  # fmt: skip
    assert rows_of(page) == [i["ledger_entity"] for i in api] == ["LIST-A", "LIST-B"]
    region.get_by_role("button", name="Clear filters").click()
    region.get_by_label("Ledger entity").fill("LIST-C")
    region.get_by_label("Ledger entity").press("Enter")
    expect(page.get_by_role("table", name="Items list").get_by_role("button")).to_have_count(1)
    region.get_by_role("button", name="Clear filters").click()
    region.get_by_label("Search").fill(items["LIST-D"]["idempotency_key"])
    region.get_by_label("Search").press("Enter")
    expect(tabs.get_by_role("tab", name=re.compile("^All"))).to_have_attribute("aria-selected", "true")
    expect(page.get_by_role("table", name="Items list").get_by_role("button")).to_have_count(1)
    assert rows_of(page) == ["LIST-D"]

    # A row opens read-only; a pending one can be leased from there.
    page.get_by_role("table", name="Items list").get_by_role("button", name="LIST-D").click()
    details = page.get_by_role("region", name="Item details")
    expect(details.get_by_test_id("amount")).to_have_text("3,000.00")
    expect(details.get_by_role("list", name="Event history")).to_contain_text("ENQUEUED by ada")
    details.get_by_role("button", name="Lease this item").click()
    expect(current(page)).to_contain_text("LIST-D")
    assert sql.execute(
        "SELECT leased_by FROM review_queue_item WHERE id = %s", (items["LIST-D"]["id"],)
    ).fetchone() == ("alice",)

    # Bulk: two more held items, and one whose figures change, resolved with one code and note.
    alice = {"Authorization": f"Bearer {alice_token}"}
    for entity in ("LIST-A", "LIST-C"):
        assert httpx.post(f"{base}/leases", json={"item_id": items[entity]["id"]}, headers=alice).json()[
            "items"
        ]
    view(page, "Items")
    region.get_by_role("button", name="Clear filters").click()
    tabs.get_by_role("tab", name=re.compile("^Assigned")).click()
    table = page.get_by_role("table", name="Items list")
    expect(table.get_by_role("checkbox")).to_have_count(3)
    for entity in ("LIST-A", "LIST-C", "LIST-D"):
        table.get_by_role("checkbox", name=re.compile(f"^Select {entity}")).check()
    revised = httpx.post(
        f"{base}/items/{items['LIST-C']['id']}/revisions",
        json={"variance_amount": "13.00", "source_hash": "sha256:again"},
        headers=root,
    )
    assert revised.status_code == 200, revised.text
    region.get_by_label("Resolution for the selected items").select_option("MATCH_CONFIRMED")
    region.get_by_label("Note for the selected items").fill("bulk: matched by hand")
    region.get_by_role("button", name="Resolve selected (3)").click()
    results = page.get_by_role("table", name="Bulk results")
    expect(results.get_by_role("row")).to_have_count(4)
    expect(results.get_by_role("row").filter(has_text="LIST-A")).to_contain_text("Resolved")
    expect(results.get_by_role("row").filter(has_text="LIST-D")).to_contain_text("Resolved")
    expect(results.get_by_role("row").filter(has_text="LIST-C")).to_contain_text(
        "Not resolved: The figures changed"
    )
    shot(page, "desk-bulk")
    notes = dict(
        sql.execute(
            "SELECT ledger_entity, resolution_note FROM review_queue_item WHERE state = 'RESOLVED'"
        ).fetchall()
    )
    assert notes == {"LIST-A": "bulk: matched by hand", "LIST-D": "bulk: matched by hand"}
    # My decisions has them at once, not at the next refresh (15 s; issue 42).
    mine = page.get_by_role("table", name="My decisions")
    expect(mine).to_contain_text("LIST-A", timeout=5_000)
    expect(mine).to_contain_text("LIST-D", timeout=5_000)

    # The counts refresh by themselves: new work shows up without a reload.
    enqueue(base, admin, ledger_entity="LIST-LATE")
    expect(tabs.get_by_role("tab", name="Pending 3")).to_be_visible(timeout=45_000)


def test_the_search_box_finds_an_invoice_number_in_the_context_in_any_state(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """Issue 42: `inv-7741` typed in Search finds the item whose context says
    `"invoice": "INV-77412"`, held by someone else (every state is searched), and nothing else;
    the rows are the ones GET /items?q= gives."""
    admin = make_token("ada", "admin")
    base = live_server
    found = enqueue(base, admin, ledger_entity="SEARCH-HIT", context={"invoice": "INV-77412"})
    enqueue(base, admin, ledger_entity="SEARCH-MISS", context={"invoice": "INV-7840"})
    enqueue(base, admin, ledger_entity="SEARCH-NONE")
    bob = {"Authorization": f"Bearer {make_token('bob', 'reviewer')}"}
    assert httpx.post(f"{base}/leases", json={"item_id": found["id"]}, headers=bob).json()["items"]
    page = contexts().new_page()
    sign_in(page, base, make_token("alice", "reviewer"))
    view(page, "Items")
    region = page.get_by_role("region", name="Items")
    search = region.get_by_role("searchbox", name="Search")
    search.fill("inv-7741")
    search.press("Enter")
    tabs = region.get_by_role("tablist", name="State")
    expect(tabs.get_by_role("tab", name=re.compile("^All"))).to_have_attribute("aria-selected", "true")
    table = page.get_by_role("table", name="Items list")
    expect(table.get_by_role("button")).to_have_count(1)
    api = httpx.get(f"{base}/items", params={"q": "inv-7741"}, headers=bob).json()["items"]
    assert rows_of(page) == [i["ledger_entity"] for i in api] == ["SEARCH-HIT"]
    search.fill("Search-")  # every entity here starts so
    search.press("Enter")
    expect(table.get_by_role("button")).to_have_count(3)


def test_every_role_lands_somewhere_useful(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    admin = make_token("ada", "admin")
    base = live_server
    redirect = httpx.get(f"{base}/desk", follow_redirects=False)
    assert redirect.status_code in (301, 307, 308) and redirect.headers["location"].endswith("/desk/"), (
        redirect
    )
    enqueue(base, admin, ledger_entity="AUDITED-CO")
    page = contexts().new_page()
    sign_in(page, base, make_token("audrey", "auditor"))
    region = page.get_by_role("region", name="Items")
    expect(region.get_by_role("link", name="Download the audit trail (NDJSON)")).to_have_attribute(
        "href", "/audit/export"
    )
    page.get_by_role("table", name="Items list").get_by_role("button", name="AUDITED-CO").click()
    details = page.get_by_role("region", name="Item details")
    expect(details.get_by_role("list", name="Event history")).to_contain_text("ENQUEUED by ada")
    expect(details.get_by_role("button", name="Lease this item")).to_have_count(0)
    expect(page.get_by_role("region", name="Current item")).to_have_count(0)
    expect(page.get_by_role("region", name="My decisions")).to_have_count(0)
    page.get_by_role("button", name="Sign out").click()
    expect(notice(page, "Signed out.")).to_be_visible()
    # Signing in on the same page (sign_in() would load it again, which clears every notice).
    page.get_by_label("Token").fill(make_token("ivan", "ingest"))
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    expect(notice(page, "Signed out.")).to_have_count(0)  # about the last session, not ivan's
    sending = page.get_by_role("region", name="Sending work")
    expect(sending).to_contain_text("sends work to the queue through the API")
    expect(sending.get_by_role("link", name="Read the API documentation")).to_have_attribute("href", "/docs")


def _contrast(one: str, two: str) -> float:
    def luminance(css: str) -> float:
        r, g, b = (int(v) / 255 for v in re.findall(r"\d+", css)[:3])
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    high, low = sorted((luminance(one), luminance(two)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _button_look(button: Locator, *, disabled: bool) -> list[str]:
    """[background colour, cursor] of the button, read when its disabled state is `disabled`."""
    deadline = time.monotonic() + SOON / 1000
    while True:
        state, *look = button.evaluate(
            "e => [e.disabled, getComputedStyle(e).backgroundColor, getComputedStyle(e).cursor]"
        )
        if state == disabled or time.monotonic() > deadline:
            assert state == disabled, f"the button never became {'disabled' if disabled else 'enabled'}"
            return look
        time.sleep(0.05)


def test_a_phone_axe_core_contrast_and_the_readme_screenshot(
    live_server: str, make_token: Tokens, browser: Browser
) -> None:
    """Every view on a 390 px phone without sideways scrolling and with a header of two lines at most;
    axe-core finds nothing serious on sign-in, reviewing, the list, approvals, admin and reports;
    focus ring and borders at 3:1 or more; a disabled Resolve looks disabled. The README's screenshot is
    made here."""
    axe = _axe_or_skip()
    admin = make_token("ada", "admin")
    base = live_server
    # One ACME-CORP per width, each leased by an admin of its own: the first one's lease is
    # still held when the second signs in, and the desk would rightly resume it.
    for _ in range(2):
        enqueue(
            base,
            admin,
            ledger_entity="ACME-CORP",
            variance_amount="-25000.00",
            currency="EUR",
            context={
                "account": "2100-AP",
                "statement": "https://bank.example/statements/8841",
            },
        )
    enqueue(base, admin, ledger_entity="GLOBEX", variance_amount="1234.50")
    for width, height in ((1100, 800), (390, 844)):
        admin = make_token(f"ada-{width}", "admin")
        context = browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(SOON)
        context.add_init_script(path=str(axe))
        page = context.new_page()
        try:
            page.goto(f"{base}/desk/")
            expect(page.get_by_label("Token")).to_be_visible()
            assert_accessible(page, f"sign-in at {width} px")
            if width < 400:
                assert page.evaluate("() => document.documentElement.scrollWidth") <= width
            checks: list[tuple[str, str]] = []
            page.get_by_label("Token").fill(admin)
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("button", name="Sign out")).to_be_visible()
            resolve_button = current(page).get_by_role("button", name="Resolve", exact=True)
            expect(resolve_button).to_be_disabled()
            # Read in one go with the state it describes: the region re-renders while the desk
            # settles after sign-in, so a style read after the check could be of another render.
            disabled = _button_look(resolve_button, disabled=True)
            page.keyboard.press("n")
            expect(current(page)).to_contain_text("ACME-CORP")
            enabled = _button_look(resolve_button, disabled=False)
            assert disabled[1] == "not-allowed" and disabled[0] != enabled[0], (disabled, enabled)
            if width > 400:
                DOCS_SHOT.parent.mkdir(exist_ok=True)
                page.screenshot(path=str(DOCS_SHOT))  # the README's picture, never stale
            checks.append(("reviewing", "Review"))
            checks += [("the list", "Items"), ("approvals", "Approvals"), ("admin", "Admin")]
            checks.append(("reports", "Reports"))
            for where, name in checks:
                if name:
                    view(page, name)
                    expect(
                        page.get_by_role("region", name=name if name != "Review" else "Current item")
                    ).to_be_visible()
                    if name == "Items":
                        expect(page.get_by_role("table", name="Items list")).to_be_visible()
                assert_accessible(page, f"{where} at {width} px")
                if width < 400:
                    scroll = page.evaluate("() => document.documentElement.scrollWidth")
                    assert scroll <= width, f"{where}: {scroll} px wide on a {width} px phone"
                    shot(page, f"desk-phone-{where.replace(' ', '-')}")
            lines = page.evaluate(
                """() => new Set([...document.querySelectorAll('header *')]
                    .filter((e) => e.children.length === 0 && e.getClientRects().length)
                    .map((e) => Math.round(e.getBoundingClientRect().top / 8))).size"""
            )
            assert lines <= 2, f"the header wraps into {lines} lines at {width} px"
            border = page.get_by_label("Search").evaluate("e => getComputedStyle(e).borderTopColor")
            ring_rgb = page.evaluate(
                "() => { const e = document.createElement('i'); e.style.color = 'var(--focus)';"
                " document.body.append(e); const c = getComputedStyle(e).color; e.remove(); return c; }"
            )
            assert _contrast(border, "rgb(255, 255, 255)") >= 3, border
            assert _contrast(ring_rgb, "rgb(255, 255, 255)") >= 3, ring_rgb
        finally:
            context.close()


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


def _duration(seconds: str | None) -> str:
    """web/reports.js duration(): the API's seconds as the desk writes them."""
    if seconds is None:
        return "–"
    total = int(Decimal(seconds).to_integral_value(ROUND_HALF_UP))
    d, h, m, s = total // 86400, total // 3600 % 24, total // 60 % 60, total % 60
    if total < 60:
        return f"{s} s"
    if total < 3600:
        return f"{m} min {s} s"
    if total < 86400:
        return f"{h} h {m} min"
    return f"{d} d {h} h"


def _link_query(link: Locator) -> dict[str, str]:
    href = link.get_attribute("href") or ""
    path, _, query = href.partition("?")
    assert path == "/reports/decisions.csv", href
    return dict(parse_qsl(query))


def _reports_equal_the_api(page: Page, base: str, token: str, tz: str) -> dict[str, Any]:
    """Every table of the Reports view equals the API's numbers for the period the view says it
    covers (its From and To), and the download link is for those same days; the backlog as read."""
    reports = page.get_by_role("region", name="Reports")
    # Until the period's reports are read, the figures are the last period's (the form and its
    # "Covers" line change at once): read the tables only once the charts are no longer busy.
    expect(page.locator("#reports-charts")).not_to_have_attribute("aria-busy", "true")
    first = date.fromisoformat(reports.get_by_label("From").input_value())
    last = date.fromisoformat(reports.get_by_label("To (last day)").input_value())
    assert first.weekday() == 0, first  # whole weeks, from a Monday
    monday = last - timedelta(days=last.weekday())
    after = (monday + timedelta(weeks=1)).isoformat()
    weeks = {"from": first.isoformat(), "to": after, "tz": tz, "bucket": "week"}
    days = {"from": first.isoformat(), "to": (last + timedelta(days=1)).isoformat(), "tz": tz}
    expect(reports.get_by_role("figure", name=re.compile(r"^SLA attainment per week \(weeks from "
                                                         + weeks["from"]))).to_be_visible()  # fmt: skip

    sla = _api_rows(base, token, "/reports/sla", weeks)
    expected_sla = [
        [b["start"], str(b["fell_due"]), str(b["on_time"]), str(b["late"]), str(b["open_past_due"]),
         _percent(b["attainment"])]
        for b in sla["buckets"]
    ]  # fmt: skip
    t = sla["total"]
    expected_sla.append(["Total", *(str(t[k]) for k in ("fell_due", "on_time", "late", "open_past_due")),
                         _percent(t["attainment"])])  # fmt: skip
    assert _table(page, "SLA attainment per week") == expected_sla

    # Per week and reviewer, the API's rows: decisions by outcome, their sum, the median and p90
    # time to decision, and the releases apart (issue 42).
    throughput = _api_rows(base, token, "/reports/throughput", weeks)
    four = ("resolved", "submitted_for_approval", "approved", "rejected")
    assert _table(page, "Throughput per reviewer") == [
        [r["start"], r["reviewer"], *(str(r[k]) for k in four), str(r["decisions"]),
         _duration(r["median_lease_to_decision_s"]), _duration(r["p90_lease_to_decision_s"]),
         str(r["released"])]
        for r in throughput["rows"]
    ]  # fmt: skip

    backlog = _api_rows(base, token, "/reports/backlog", days)
    assert _table(page, "Backlog by age") == [
        [p["start"] + (" (now)" if p["at"] == backlog["as_of"] else ""),
         *(str(p["by_age"][band]) for band in backlog["bands"]), str(p["open"])]
        for p in backlog["points"]
    ]  # fmt: skip
    assert _link_query(reports.get_by_role("link", name="Download decisions (CSV)")) == days
    return {"weeks": weeks, "days": days, "sla": sla, "throughput": throughput, "backlog": backlog}


def test_the_reports_view_draws_the_charts_with_tables_of_the_apis_numbers(
    live_server: str, make_token: Tokens, sql: psycopg.Connection, contexts: Callable[[], BrowserContext]
) -> None:
    """The three charts' tables equal the API's numbers for the days the view says it covers, and
    the download link is for those days too: by default whole weeks up to today in the zone, the
    backlog ending with a point for now (issue 42); a chosen period made whole weeks."""
    import random
    from zoneinfo import ZoneInfo

    from tests.support import reports as ref

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
    tz = "Pacific/Kiritimati"  # UTC+14: its today is rarely the browser's (UTC) today
    base = live_server
    page = contexts().new_page()
    sign_in(page, base, auditor)
    # A role without the rejected-proposals count has none in the header (not the text "null").
    expect(page.get_by_role("banner")).not_to_contain_text("null")
    expect(page.get_by_role("banner")).to_contain_text("audrey (auditor)")
    view(page, "Reports")
    reports = page.get_by_role("region", name="Reports")
    expect(reports.get_by_role("figure")).to_have_count(3)  # drawn for the default period first

    # The default period: eight weeks, the last ending today in the browser's zone, and the
    # backlog's last point is now, not yesterday's close.
    zone = page.evaluate("() => Intl.DateTimeFormat().resolvedOptions().timeZone")
    today = datetime.now(ZoneInfo(zone)).date()
    expect(reports.get_by_label("To (last day)")).to_have_value(today.isoformat())
    expect(reports.get_by_label("From")).to_have_value(
        (today - timedelta(days=today.weekday(), weeks=7)).isoformat()
    )
    expect(page.locator("#reports-period")).to_contain_text(f"to {today.isoformat()} (today)")
    shown = _reports_equal_the_api(page, base, auditor, zone)
    assert shown["backlog"]["points"][-1]["start"] == today.isoformat()
    assert _table(page, "Backlog by age")[-1][0] == f"{today.isoformat()} (now)"
    assert len(shown["backlog"]["points"]) == 7 * 7 + today.weekday() + 1
    assert len(shown["sla"]["buckets"]) == 8
    SHOTS.mkdir(exist_ok=True)
    reports.screenshot(path=str(SHOTS / "reports.png"))  # docs/reports.png is a copy of it

    # Another zone: "To" left at today follows today there.
    reports.get_by_label("Time zone").fill(tz)
    reports.get_by_role("button", name="Show reports").click()
    there = datetime.now(ZoneInfo(tz)).date()
    expect(reports.get_by_label("To (last day)")).to_have_value(there.isoformat())
    expect(page.locator("#reports-period")).to_contain_text(f"{tz}:")
    shown = _reports_equal_the_api(page, base, auditor, tz)
    assert _table(page, "Backlog by age")[-1][0] == f"{there.isoformat()} (now)"

    # An answer that comes after a later period's is dropped, not drawn over it: Pago Pago's
    # SLA read is held back while the browser's zone is shown again, then let through.
    far = "Pacific/Pago_Pago"  # UTC-11: its weeks end a day before Kiritimati's
    far_monday = datetime.now(ZoneInfo(far)).date()
    far_monday -= timedelta(days=far_monday.weekday())
    far_weeks = {"from": (far_monday - timedelta(weeks=7)).isoformat(), "tz": far, "bucket": "week",
                 "to": (far_monday + timedelta(weeks=1)).isoformat()}  # fmt: skip
    far_sla = _api_rows(base, auditor, "/reports/sla", far_weeks)["buckets"]
    assert far_sla != _api_rows(base, auditor, "/reports/sla", shown["weeks"] | {"tz": zone})["buckets"]
    held: list[Route] = []
    page.route("**/reports/sla?*", lambda route: held.append(route) if not held else route.continue_())
    reports.get_by_label("Time zone").fill(far)
    reports.get_by_role("button", name="Show reports").click()
    while not held:
        page.wait_for_timeout(20)
    expect(page.locator("#reports-charts")).to_have_attribute("aria-busy", "true")
    reports.get_by_label("Time zone").fill(zone)
    reports.get_by_role("button", name="Show reports").click()
    _reports_equal_the_api(page, base, auditor, zone)
    with page.expect_response(lambda r: far.replace("/", "%2F") in r.url and "/reports/sla" in r.url):
        held[0].continue_()
    page.evaluate("() => new Promise((done) => setTimeout(done, 100))")  # its answer handled
    page.unroute("**/reports/sla?*")
    _reports_equal_the_api(page, base, auditor, zone)

    # A chosen period is made whole weeks: from the Monday of its first day to the Sunday of its
    # last (or today), and the charts, the tables and the download all cover those days.
    tz = "Europe/Berlin"
    first, last = date.today() - timedelta(days=54), date.today() - timedelta(days=10)
    reports.get_by_label("From").fill(first.isoformat())
    reports.get_by_label("To (last day)").fill(last.isoformat())
    reports.get_by_label("Time zone").fill(tz)
    reports.get_by_role("button", name="Show reports").click()
    monday = first - timedelta(days=first.weekday())
    sunday = last - timedelta(days=last.weekday()) + timedelta(days=6)
    expect(reports.get_by_label("From")).to_have_value(monday.isoformat())
    expect(reports.get_by_label("To (last day)")).to_have_value(sunday.isoformat())
    shown = _reports_equal_the_api(page, base, auditor, tz)
    assert sum(b["fell_due"] for b in shown["sla"]["buckets"]) > 20
    assert len({r["reviewer"] for r in shown["throughput"]["rows"]}) >= 3
    assert any(r["released"] for r in shown["throughput"]["rows"]), "no release in the history"
    assert any(r["median_lease_to_decision_s"] for r in shown["throughput"]["rows"])
    assert len(shown["backlog"]["points"]) == (sunday - monday).days + 1
    assert "(now)" not in str(_table(page, "Backlog by age"))
    # One currency's backlog: the choices are the split's currencies, and its table the API's.
    days = shown["days"]
    split = _api_rows(base, auditor, "/reports/backlog", days | {"by": "currency"})
    codes = sorted({code for p in split["points"] for code in p["by_currency"]})
    assert len(codes) >= 2
    choice = reports.get_by_label("Backlog currency")
    assert choice.locator("option").all_inner_texts() == ["All currencies", *codes]
    choice.select_option(codes[1])
    empty = {"open": 0, "by_age": dict.fromkeys(split["bands"], 0)}
    chosen = [(p, p["by_currency"].get(codes[1], empty)) for p in split["points"]]
    assert _table(page, f"Backlog by age, {codes[1]}") == [
        [p["start"] + (" (now)" if p["at"] == split["as_of"] else ""),
         *(str(f["by_age"][band]) for band in split["bands"]), str(f["open"])]
        for p, f in chosen
    ]  # fmt: skip
    choice.select_option("")
    expect(reports.get_by_role("figure", name=re.compile(r"^Backlog by age \("))).to_be_visible()
    # Each chart is an image with a text alternative, drawn as SVG: no canvas, nothing fetched.
    assert reports.locator("svg[role=img]").count() == 3
    assert reports.locator("svg rect").count() > 20

    # The download authenticates with the session cookie alone, like every call of the page.
    link = reports.get_by_role("link", name="Download decisions (CSV)")
    with page.expect_download() as downloading:
        link.click()
    content = Path(downloading.value.path()).read_bytes()
    exported = httpx.get(
        f"{base}/reports/decisions.csv",
        params=shown["days"],
        headers={"Authorization": f"Bearer {auditor}"},
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


def test_the_reports_view_fits_a_phone_and_its_tables_scroll_in_their_cards(
    live_server: str, make_token: Tokens, browser: Browser
) -> None:
    """Issue 42: at 390 px the page does not scroll sideways; the wide tables scroll inside their
    own box (a focusable region named after the table), which stays within the page."""
    admin, auditor = make_token("ada", "admin"), make_token("audrey", "auditor")
    base = live_server
    for n in range(3):
        enqueue(base, admin, ledger_entity=f"ACME-{n}", variance_amount="-25.00")
    page_token = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    for _ in range(2):  # two decisions, so that the throughput has a row
        leased = httpx.post(f"{base}/leases", json={"batch_size": 1}, headers=page_token).json()["items"][0]
        done = httpx.post(
            f"{base}/items/{leased['id']}/complete",
            json={"resolution": "MATCH_CONFIRMED", "note": "ok", "lease_token": leased["lease_token"]},
            headers=page_token,
        )
        assert done.status_code == 200, done.text
    context = browser.new_context(viewport={"width": 390, "height": 844})
    context.set_default_timeout(SOON)
    try:
        page = context.new_page()
        sign_in(page, base, auditor)
        view(page, "Reports")
        reports = page.get_by_role("region", name="Reports")
        expect(reports.get_by_role("figure")).to_have_count(3)
        expect(page.get_by_role("table", name="Throughput per reviewer").locator("tbody tr")).to_have_count(1)
        scroll = page.evaluate("() => document.documentElement.scrollWidth")
        assert scroll <= 390, f"the Reports view is {scroll} px wide on a 390 px phone"
        for name in ("SLA attainment per week", "Throughput per reviewer", "Backlog by age"):
            box = reports.get_by_role("region", name=f"{name}: the numbers")
            table = box.get_by_role("table", name=name, exact=True)
            inside = box.evaluate(
                "(e) => { const r = e.getBoundingClientRect(); e.scrollLeft = 10000;"
                " return [r.left, r.right, e.scrollLeft, e.scrollWidth, e.clientWidth]; }"
            )
            left, right, scrolled, wide, seen = inside
            assert left >= 0 and right <= 390, (name, inside)
            # A table wider than its box scrolls inside it (the throughput's ten columns always
            # are, on a phone); a narrower one just fits.
            if name == "Throughput per reviewer":
                assert table.evaluate("(e) => e.getBoundingClientRect().width") > seen, inside
            if wide > seen:
                assert scrolled > 0, f"{name}: its table does not scroll in its box {inside}"
        shot(page, "desk-phone-reports")
    finally:
        context.close()


def test_the_list_has_a_currency_column_and_filter_and_the_approver_sees_the_conversion(
    live_server: str, make_token: Tokens, contexts: Callable[[], BrowserContext]
) -> None:
    """Issue 40: the work list shows each item's currency and filters by it (as GET /items?currency=
    does), and the approver sees the amount converted into the base currency at the rate the
    submission used, with who set that rate and when."""
    admin = make_token("ada", "admin")
    base = live_server
    feed = {"Authorization": f"Bearer {make_token('treasury-feed', 'ingest')}"}
    rate = httpx.put(f"{base}/fx-rates/EUR", json={"rate": "1.0850"}, headers=feed)
    assert rate.status_code == 200, rate.text
    set_on = rate.json()["set_at"][:10]
    for entity, amount, currency in (("CUR-EUR", "9500.00", "EUR"), ("CUR-USD", "12.50", "USD")):
        enqueue(base, admin, ledger_entity=entity, variance_amount=amount, currency=currency)
    preparer = contexts().new_page()
    sign_in(preparer, base, make_token("alice", "reviewer"))
    view(preparer, "Items")
    region = preparer.get_by_role("region", name="Items")
    listed = preparer.get_by_role("table", name="Items list")
    expect(listed.get_by_role("columnheader", name="Currency")).to_be_visible()
    expect(listed.get_by_role("row", name=re.compile("CUR-EUR"))).to_contain_text("EUR")
    region.get_by_label("Currency").fill("eur")
    region.get_by_label("Currency").press("Enter")
    expect(listed.get_by_role("button")).to_have_count(1)
    assert rows_of(preparer) == ["CUR-EUR"]

    # 9,500.00 EUR is 10,307.50 USD at 1.0850: past the materiality of 10,000.00, an approver.
    alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    (held,) = httpx.post(f"{base}/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert held["ledger_entity"] == "CUR-EUR", held
    done = httpx.post(
        f"{base}/items/{held['id']}/complete",
        json={"resolution": "APPROVED", "lease_token": held["lease_token"]},
        headers=alice,
    )
    assert done.json()["outcome"] == "submitted_for_approval", done.text
    checker = contexts().new_page()
    sign_in(checker, base, make_token("april", "approver"))
    view(checker, "Approvals")
    approvals = checker.get_by_role("region", name="Approvals")
    approvals.get_by_role("button", name="Lease a proposal").click()
    proposal = approvals.get_by_role("definition").filter(has_text="≈")
    expect(proposal).to_have_text(f"EUR 9,500.00 ≈ USD 10,307.50 at 1.0850, set by treasury-feed on {set_on}")
