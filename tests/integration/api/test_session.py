"""The desk's sign-in: a token exchanged for an HttpOnly session cookie, CSRF-proof writes,
sign-out and revocation end it, bearer tokens unchanged."""

import re
from collections.abc import Callable

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support import seed_items
from tests.support.api import assert_problem

Tokens = Callable[[str, str], str]


def sign_in(client: TestClient, token: str) -> str:
    response = client.post("/session", json={"token": token})
    assert response.status_code == 200, response.text
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie, cookie
    assert token not in cookie  # a random session id, not the token
    csrf: str = response.json()["csrf_token"]
    return csrf


def test_a_session_cookie_reads_and_writes_with_its_csrf_token(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    seed_items(sql, 2)
    csrf = sign_in(client, make_token("alice", "reviewer"))
    me = client.get("/session").json()
    assert (me["subject"], me["role"], me["csrf_token"]) == ("alice", "reviewer", csrf)
    assert me["idle_release_s"] == 600 and me["max_wait_s"] == 20
    # Stored as a hash only.
    (stored,) = sql.execute("SELECT id_hash FROM desk_session").fetchone()
    assert stored not in client.cookies.values()

    assert_problem(client.post("/leases", json={}), 403, "CSRF_REJECTED")
    assert_problem(client.post("/leases", json={}, headers={"X-CSRF-Token": "forged"}), 403, "CSRF_REJECTED")
    cross_site = {"X-CSRF-Token": csrf, "Origin": "https://evil.example"}
    assert_problem(client.post("/leases", json={}, headers=cross_site), 403, "CSRF_REJECTED")
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'ASSIGNED'").fetchone() == (0,)

    leased = client.post("/leases", json={"batch_size": 1}, headers={"X-CSRF-Token": csrf})
    assert leased.status_code == 200, leased.text
    (item,) = leased.json()["items"]
    assert item["leased_by"] == "alice" and item["lease_token"]
    same_origin = {"X-CSRF-Token": csrf, "Origin": "http://testserver"}
    done = client.post(f"/items/{item['id']}/complete", json={"resolution": "APPROVED"}, headers=same_origin)
    assert done.json()["item"]["resolved_by"] == "alice"


def test_sign_out_ends_the_session_on_the_server(client: TestClient, make_token: Tokens) -> None:
    csrf = sign_in(client, make_token("alice", "reviewer"))
    cookie = dict(client.cookies)
    assert_problem(client.delete("/session"), 403, "CSRF_REJECTED")  # no other site can sign you out
    assert client.delete("/session", headers={"X-CSRF-Token": csrf}).status_code == 204
    client.cookies.clear()
    client.cookies.update(cookie)  # the old cookie, replayed
    response = client.get("/session")
    assert_problem(response, 401, "UNAUTHENTICATED")


def test_a_session_past_its_expiry_is_refused_though_its_token_lives(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    """The row's own expires_at ends the session on lookup: the cookie is sent again as a browser
    that kept it would (the test client's jar would drop it by itself, hiding a missing check)."""
    sign_in(client, make_token("alice", "reviewer"))
    cookie = dict(client.cookies)
    assert client.get("/session").status_code == 200
    sql.execute("UPDATE desk_session SET expires_at = now() - interval '1 second'")
    assert sql.execute("SELECT count(*) FROM api_token WHERE expires_at IS NULL").fetchone() == (1,)
    client.cookies.clear()
    client.cookies.update(cookie)
    assert_problem(client.get("/session"), 401, "UNAUTHENTICATED")


def test_revoking_the_token_ends_its_sessions(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    sign_in(client, make_token("alice", "reviewer"))
    assert client.get("/session").status_code == 200
    sql.execute("UPDATE api_token SET revoked_at = now() WHERE subject = 'alice'")
    assert_problem(client.get("/session"), 401, "UNAUTHENTICATED")


def test_a_revoked_token_gets_no_session(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    token = make_token("alice", "reviewer")
    sql.execute("UPDATE api_token SET revoked_at = now() WHERE subject = 'alice'")
    response = client.post("/session", json={"token": token})
    assert_problem(response, 401, "UNAUTHENTICATED")
    assert "set-cookie" not in response.headers
    assert sql.execute("SELECT count(*) FROM desk_session").fetchone() == (0,)


def test_an_expired_token_gets_no_session(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    token = make_token("alice", "reviewer")
    sql.execute("UPDATE api_token SET expires_at = now() - interval '1 second' WHERE subject = 'alice'")
    assert_problem(
        client.get("/session", headers={"Authorization": f"Bearer {token}"}), 401, "UNAUTHENTICATED"
    )
    response = client.post("/session", json={"token": token})
    assert_problem(response, 401, "UNAUTHENTICATED")
    assert "set-cookie" not in response.headers
    assert sql.execute("SELECT count(*) FROM desk_session").fetchone() == (0,)


def test_a_session_ends_when_its_token_expires(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    token = make_token("alice", "reviewer")
    sql.execute("UPDATE api_token SET expires_at = now() + interval '1 hour' WHERE subject = 'alice'")
    sign_in(client, token)
    assert client.get("/session").status_code == 200
    # The session itself lives no longer than the token it was made from.
    (outlives,) = sql.execute(
        "SELECT s.expires_at > t.expires_at FROM desk_session s JOIN api_token t ON t.id = s.token_id"
    ).fetchone()
    assert outlives is False
    # The token's expiry is what ends it, whatever the session row says.
    sql.execute("UPDATE api_token SET expires_at = now() - interval '1 second' WHERE subject = 'alice'")
    assert_problem(client.get("/session"), 401, "UNAUTHENTICATED")
    assert_problem(client.post("/leases", json={}, headers={"X-CSRF-Token": "x"}), 401, "UNAUTHENTICATED")


def test_an_unknown_token_gets_no_session(client: TestClient) -> None:
    response = client.post("/session", json={"token": "rq_nope"})
    assert_problem(response, 401, "UNAUTHENTICATED")
    assert "set-cookie" not in response.headers


def test_the_cookie_is_secure_under_https(settings, make_token: Tokens) -> None:  # type: ignore[no-untyped-def]
    from api.app import create_app

    with TestClient(create_app(settings), base_url="https://desk.example") as client:
        response = client.post("/session", json={"token": make_token("alice", "reviewer")})
    assert "Secure" in response.headers["set-cookie"]


def test_bearer_tokens_work_as_before_and_win_over_a_cookie(
    client: TestClient, make_token: Tokens, sql: psycopg.Connection
) -> None:
    seed_items(sql, 1)
    sign_in(client, make_token("alice", "reviewer"))
    bob = {"Authorization": f"Bearer {make_token('bob', 'reviewer')}"}
    # A bearer call needs no CSRF token, and is bob's even with alice's cookie in the jar.
    (item,) = client.post("/leases", json={}, headers=bob).json()["items"]
    assert item["leased_by"] == "bob"
    assert client.get("/session", headers=bob).json()["csrf_token"] is None


@pytest.mark.parametrize("role", ["ingest"])
def test_a_forbidden_answer_names_the_roles_needed(client: TestClient, make_token: Tokens, role: str) -> None:
    headers = {"Authorization": f"Bearer {make_token('ivan', role)}"}
    problem = assert_problem(client.post("/leases", json={}, headers=headers), 403, "FORBIDDEN")
    assert problem["required_roles"] == ["reviewer", "approver", "admin"]


STRICT_CSP = [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
]


def test_the_desk_is_served_with_a_strict_csp(client: TestClient) -> None:
    for path in ("/desk/", "/desk/app.js", "/desk/api.js", "/desk/app.css"):
        response = client.get(path)
        assert response.status_code == 200, path
        csp = response.headers["content-security-policy"]
        # Every directive, exactly: a loosened one (`script-src *`, a missing `object-src`) fails.
        assert sorted(d.strip() for d in csp.split(";")) == sorted(STRICT_CSP), csp
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["referrer-policy"] == "no-referrer", path
    assert client.get("/", follow_redirects=False).headers["location"] == "/desk/"
    assert_problem(client.get("/desk/nothing.js"), 404, "NOT_FOUND")
    assert "/desk/" not in client.get("/openapi.json").json()["paths"]


def test_only_api_js_calls_fetch_and_nothing_renders_html() -> None:
    """The desk's rules, checked in its source: one module talks to the service, and no data ever
    goes through innerHTML / outerHTML / insertAdjacentHTML / document.write."""
    from api.desk import WEB_DIR

    modules = sorted(WEB_DIR.rglob("*.js"))
    assert len(modules) > 1 and (WEB_DIR / "api.js") in modules, modules
    for path in modules:
        source = path.read_text()
        assert ("fetch(" in source) == (path.name == "api.js"), path.name
        sinks = re.findall(r"\.(?:innerHTML|outerHTML|insertAdjacentHTML)\b|document\.write|\beval\(", source)
        assert not sinks, f"{path.name} uses {sinks}"
    assert "<script>" not in (WEB_DIR / "index.html").read_text()
    assert "localStorage" not in "".join(p.read_text() for p in modules)


def test_the_desk_is_small_modules_loaded_as_es_modules() -> None:
    """One module per view and concern (issue 25): none grows past about 500 lines, and the page
    loads them as ES modules, which the CSP's script-src 'self' allows (no build step)."""
    from api.desk import CSP, WEB_DIR

    sizes = {p.name: len(p.read_text().splitlines()) for p in WEB_DIR.rglob("*.js")}
    assert max(sizes.values()) <= 500, sizes
    assert '<script type="module" src="/desk/app.js">' in (WEB_DIR / "index.html").read_text()
    assert "script-src 'self'" in CSP
