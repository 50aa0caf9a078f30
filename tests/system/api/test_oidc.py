"""Sign-in with an OpenID Connect provider, and API calls with its JWTs, against a real provider
(oidc-provider, tests/support/oidc_provider.py): every token here was issued by it, except the ones a test
signs with its own key to prove that such a signature is refused."""

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import anyio
import httpx
import psycopg
import pytest
from cryptography.fernet import Fernet
from fastapi import Request
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from api.app import create_app
from api.oidc import OidcProvider
from api.oidc_claims import Refused
from api.oidc_login import login_sealer
from api.routes import oidc as oidc_routes
from api.settings import Settings
from tests.support import seed_items, wait_for
from tests.support.api import assert_problem
from tests.support.oidc_provider import API_AUDIENCE, OTHER_AUDIENCE, Client, RealProvider, real_provider
from tests.support.postgres import make_settings

PUBLIC = "https://review.test"  # the service as people open it (REVIEW_QUEUE_PUBLIC_URL)


@pytest.fixture
def desk_client(oidc_provider: RealProvider) -> Client:
    return oidc_provider.register_desk(PUBLIC)


@pytest.fixture
def oidc_settings(db_url: str, oidc_provider: RealProvider, desk_client: Client) -> Settings:
    return make_settings(db_url, **oidc_provider.service_settings(PUBLIC, desk_client))


@pytest.fixture
def service(oidc_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(oidc_settings), base_url=PUBLIC, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def browser() -> Iterator[httpx.Client]:
    """The person's browser at the provider (its cookies are the provider's session)."""
    with httpx.Client() as client:
        yield client


def start(service: TestClient) -> httpx.Response:
    response = service.get("/auth/oidc/login", follow_redirects=False)
    assert response.status_code == 302, response.text
    return response


def back_from_provider(
    service: TestClient, provider: RealProvider, browser: httpx.Client, login: str, **options: Any
) -> str:
    """Start at the service, sign in at the provider's pages: the callback URL (path and query)."""
    url = provider.sign_in(browser, start(service).headers["location"], login, **options)
    assert url.startswith(f"{PUBLIC}/auth/oidc/callback?"), url
    return url.removeprefix(PUBLIC)


def finish(service: TestClient, callback: str) -> httpx.Response:
    response = service.get(callback, follow_redirects=False)
    assert response.status_code == 303, response.text
    assert response.headers["cache-control"] == "no-store"
    return response


def sign_in(service: TestClient, provider: RealProvider, browser: httpx.Client, login: str) -> httpx.Response:
    return finish(service, back_from_provider(service, provider, browser, login))


def refusal(response: httpx.Response) -> dict[str, list[str]]:
    """The desk URL a refused sign-in lands on, as its query; no session was opened."""
    location = response.headers["location"]
    assert location.startswith("/desk/?"), location
    assert "rq_session" not in response.headers.get("set-cookie", "")
    return parse_qs(urlsplit(location).query)


def sessions(sql: psycopg.Connection) -> list[tuple[str, str]]:
    return sql.execute("SELECT subject, role FROM oidc_session ORDER BY created_at").fetchall()


# --- the desk's sign-in --------------------------------------------------------------------------


def stored_sign_in_rows(sql: psycopg.Connection) -> int:
    """Rows of every table sign-in writes to."""
    tables = ("oidc_used_state", "oidc_identity", "oidc_session")
    return sum(sql.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in tables)  # type: ignore[index]


def test_the_login_redirect_carries_pkce_state_and_nonce_bound_to_this_browser(
    service: TestClient,
    oidc_settings: Settings,
    oidc_provider: RealProvider,
    desk_client: Client,
    sql: psycopg.Connection,
) -> None:
    response = start(service)
    url = urlsplit(response.headers["location"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{oidc_provider.issuer}/auth"  # from discovery
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert query["response_type"] == "code" and query["client_id"] == desk_client.client_id
    assert query["redirect_uri"] == f"{PUBLIC}/auth/oidc/callback"
    assert query["scope"] == "openid profile email groups"
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert len(query["state"]) >= 32 and len(query["nonce"]) >= 32 and query["state"] != query["nonce"]
    cookie = response.headers["set-cookie"]
    for part in ("rq_oidc_login=", "HttpOnly", "Path=/auth/oidc/", "SameSite=lax", "Secure", "Max-Age=600"):
        assert part in cookie, cookie
    # Kept in the browser only, sealed with the service's key: the state, the nonce, the verifier
    # whose S256 is sent. Nothing is written anywhere.
    sealed = service.cookies["rq_oidc_login"]
    assert query["state"] not in sealed and query["nonce"] not in sealed
    state, nonce, verifier = json.loads(login_sealer(oidc_settings).decrypt(sealed.encode()))
    assert (state, nonce) == (query["state"], query["nonce"])
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert challenge == query["code_challenge"]
    assert stored_sign_in_rows(sql) == 0


def test_a_host_header_cannot_choose_the_redirect_uri(service: TestClient) -> None:
    response = service.get("/auth/oidc/login", headers={"Host": "evil.example"}, follow_redirects=False)
    query = parse_qs(urlsplit(response.headers["location"]).query)
    assert query["redirect_uri"] == [f"{PUBLIC}/auth/oidc/callback"]


def test_signing_in_opens_a_desk_session_with_the_mapped_role_and_a_lowercased_subject(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    seed_items(sql, 2)
    # A parameter the provider adds (OIDC Session Management) is no reason to refuse.
    done = finish(service, back_from_provider(service, oidc_provider, browser, "rita") + "&session_state=s.1")
    assert done.headers["location"] == "/desk/"
    cookies = done.headers.get_list("set-cookie")
    (desk,) = [c for c in cookies if c.startswith("rq_session=")]
    for part in ("HttpOnly", "SameSite=strict", "Path=/", "Secure"):
        assert part in desk, desk
    assert any(c.startswith('rq_oidc_login=""') and "Max-Age=0" in c for c in cookies), cookies

    me = service.get("/session").json()
    assert (me["subject"], me["role"]) == ("rita.reviewer", "reviewer")  # preferred_username Rita.Reviewer
    assert sessions(sql) == [("rita.reviewer", "reviewer")]
    assert sql.execute("SELECT count(*) FROM oidc_used_state").fetchone() == (1,)  # the state is used up
    # The same session rules as a token's: writes need the CSRF token.
    assert_problem(service.post("/leases", json={}), 403, "CSRF_REJECTED")
    csrf = {"X-CSRF-Token": me["csrf_token"]}
    (item,) = service.post("/leases", json={"batch_size": 1}, headers=csrf).json()["items"]
    assert item["leased_by"] == "rita.reviewer"
    resolved = service.post(
        f"/items/{item['id']}/complete", json={"resolution": "MATCH_CONFIRMED"}, headers=csrf
    )
    assert resolved.json()["item"]["resolved_by"] == "rita.reviewer", resolved.text


def test_the_session_ends_with_the_id_token(
    db_url: str, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    client = oidc_provider.register_desk(PUBLIC, id_token_ttl_s=4)
    settings = make_settings(db_url, **oidc_provider.service_settings(PUBLIC, client))
    with TestClient(create_app(settings), base_url=PUBLIC) as service:
        sign_in(service, oidc_provider, browser, "rita")
        assert service.get("/session").status_code == 200
        (lifetime,) = sql.execute(
            "SELECT extract(epoch FROM expires_at - created_at) FROM oidc_session"
        ).fetchone()
        assert lifetime <= 5, lifetime  # the ID token's 4 s (its exp is whole seconds), not the desk's 12 h
        wait_for(lambda: service.get("/session").status_code == 401, timeout=60)


def test_several_groups_give_the_role_that_includes_the_others(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client
) -> None:
    sign_in(service, oidc_provider, browser, "april")  # recon-reviewers and recon-approvers
    assert (service.get("/session").json()["subject"], service.get("/session").json()["role"]) == (
        "april",
        "approver",
    )


@pytest.mark.parametrize(
    ("login", "code"),
    [("nora", "OIDC_NO_ROLE"), ("max", "OIDC_AMBIGUOUS_ROLE"), ("me", "OIDC_BAD_SUBJECT")],
    ids=["in no mapped group", "reviewer and auditor", "a reserved subject"],
)
def test_someone_without_one_clear_role_is_refused_and_told_why(
    service: TestClient,
    oidc_provider: RealProvider,
    browser: httpx.Client,
    sql: psycopg.Connection,
    login: str,
    code: str,
) -> None:
    assert refusal(sign_in(service, oidc_provider, browser, login)) == {"sign_in_error": [code]}
    assert sessions(sql) == []
    assert_problem(service.get("/session"), 401, "UNAUTHENTICATED")


def test_a_username_is_checked_as_sent_before_it_is_folded(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """`\u212aasey` (KELVIN SIGN) lower-cases to `kasey`: checked after folding it became kasey."""
    sign_in(service, oidc_provider, browser, "kasey")
    service.cookies.clear()
    with httpx.Client() as other_browser:
        refused = sign_in(service, oidc_provider, other_browser, "kelvin")
    assert refusal(refused) == {"sign_in_error": ["OIDC_BAD_SUBJECT"]}
    assert sessions(sql) == [("kasey", "reviewer")]


def test_a_name_stays_with_the_provider_account_that_first_signed_in_with_it(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """Keyed by issuer and `sub`: another account whose username folds to the same name is refused,
    at the desk and as an API bearer, and the name's own account keeps working."""
    sign_in(service, oidc_provider, browser, "rita")
    service.cookies.clear()
    with httpx.Client() as other_browser:
        refused = sign_in(service, oidc_provider, other_browser, "impostor")  # RITA.reviewer
    assert refusal(refused) == {"sign_in_error": ["OIDC_SUBJECT_TAKEN"]}
    assert sessions(sql) == [("rita.reviewer", "reviewer")]
    assert sql.execute("SELECT subject, issuer, provider_subject FROM oidc_identity").fetchall() == [
        ("rita.reviewer", oidc_provider.issuer, "rita")
    ]
    impostor = _api_token(oidc_provider, sub="impostor", preferred_username="RITA.reviewer")
    problem = assert_problem(service.get("/session", headers=bearer(impostor)), 401, "UNAUTHENTICATED")
    assert "OIDC_SUBJECT_TAKEN" in problem["detail"], problem
    assert service.get("/session", headers=bearer(_api_token(oidc_provider))).json()["subject"] == (
        "rita.reviewer"
    )
    # The API binds a name on its first call too, and checks it again in a process that has it cached.
    newcomer = _api_token(oidc_provider, sub="newcomer", preferred_username="New.Comer")
    assert service.get("/session", headers=bearer(newcomer)).json()["subject"] == "new.comer"
    usurper = _api_token(oidc_provider, sub="usurper", preferred_username="new.comer")
    assert_problem(service.get("/session", headers=bearer(usurper)), 401, "UNAUTHENTICATED")


def test_a_replayed_state_is_refused(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    login = start(service)
    binding = service.cookies.get("rq_oidc_login")
    callback = oidc_provider.sign_in(browser, login.headers["location"], "rita").removeprefix(PUBLIC)
    assert finish(service, callback).headers["location"] == "/desk/"
    # The same answer again, with everything the browser had: state, code and the binding cookie.
    service.cookies.clear()
    service.cookies.set("rq_oidc_login", binding, domain="review.test", path="/auth/oidc/")
    assert refusal(finish(service, callback)) == {"sign_in_error": ["OIDC_STATE_INVALID"]}
    assert sessions(sql) == [("rita.reviewer", "reviewer")]


def test_a_state_works_only_in_the_browser_that_started_it(
    service: TestClient,
    oidc_settings: Settings,
    oidc_provider: RealProvider,
    browser: httpx.Client,
    sql: psycopg.Connection,
) -> None:
    """Login CSRF: an attacker's own callback URL, opened in the victim's browser, signs nobody in,
    whether the victim has no sign-in cookie or one of its own sign-in (the cookie must be the one
    the answer's state was sealed in, not just any of this service's)."""
    callback = back_from_provider(service, oidc_provider, browser, "ada")
    with TestClient(create_app(oidc_settings), base_url=PUBLIC) as victim:
        assert refusal(finish(victim, callback)) == {"sign_in_error": ["OIDC_STATE_INVALID"]}
        start(victim)  # the victim's own sign-in, begun and not finished: its cookie is real
        assert "rq_oidc_login" in victim.cookies
        assert refusal(finish(victim, callback)) == {"sign_in_error": ["OIDC_STATE_INVALID"]}
        assert_problem(victim.get("/session"), 401, "UNAUTHENTICATED")
    assert sessions(sql) == []


def test_an_expired_or_forged_sign_in_cookie_is_refused(
    service: TestClient,
    oidc_settings: Settings,
    oidc_provider: RealProvider,
    browser: httpx.Client,
    sql: psycopg.Connection,
) -> None:
    """The cookie is good for 10 minutes from its sealing, and only sealed with the service's key."""
    callback = back_from_provider(service, oidc_provider, browser, "rita")
    sealer, sealed = login_sealer(oidc_settings), service.cookies["rq_oidc_login"]
    content = sealer.decrypt(sealed.encode())
    mine = Fernet(Fernet.generate_key())
    tampered = sealed[:-8] + ("A" if sealed[-8] != "A" else "B") + sealed[-7:]
    for cookie in (
        sealer.encrypt_at_time(content, int(time.time()) - 601),  # sealed 10 minutes and a second ago
        mine.encrypt(content),  # the same sign-in, sealed with another key
        tampered.encode(),
    ):
        service.cookies.set("rq_oidc_login", cookie.decode(), domain="review.test", path="/auth/oidc/")
        assert refusal(finish(service, callback)) == {"sign_in_error": ["OIDC_STATE_INVALID"]}
    assert sessions(sql) == []
    # Nine minutes old, the real cookie's content still signs in.
    young = sealer.encrypt_at_time(content, int(time.time()) - 540).decode()
    service.cookies.set("rq_oidc_login", young, domain="review.test", path="/auth/oidc/")
    assert finish(service, callback).headers["location"] == "/desk/"


def test_a_flood_of_sign_in_starts_stores_nothing_and_locks_nobody_out(
    oidc_settings: Settings, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """20,000 anonymous GET /auth/oidc/login (twice the old table's cap, which then refused everyone
    with OIDC_BUSY); then a real sign-in works. The flood calls the route's handler in the app's
    own event loop, as fast as it answers (through the HTTP stack it took a minute here), so that
    this costs a few seconds; the middleware in between stores nothing."""
    app = create_app(oidc_settings)
    with TestClient(app, base_url=PUBLIC) as service:
        start(service)  # discovery fetched once, as in a running service
        scope = {
            "type": "http", "method": "GET", "scheme": "https", "server": ("review.test", 443),
            "path": "/auth/oidc/login", "query_string": b"", "headers": [], "app": app,
        }  # fmt: skip

        async def flood() -> int:
            redirected = 0
            for _ in range(20_000):
                response = await oidc_routes.login(Request(scope))
                redirected += (
                    response.status_code == 302 and "rq_oidc_login=" in response.headers["set-cookie"]
                )
            return redirected

        assert service.portal is not None
        assert service.portal.call(flood) == 20_000
        assert stored_sign_in_rows(sql) == 0
        assert sign_in(service, oidc_provider, browser, "rita").headers["location"] == "/desk/"
        assert sessions(sql) == [("rita.reviewer", "reviewer")]


def test_an_answer_naming_another_issuer_is_refused(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """RFC 9207: the provider names itself in its answer; another name is a mix-up attack."""
    callback = back_from_provider(service, oidc_provider, browser, "rita")
    assert "iss=" in callback
    forged = callback.replace("iss=http%3A%2F%2Flocalhost", "iss=https%3A%2F%2Fevil.example")
    assert refusal(finish(service, forged)) == {"sign_in_error": ["OIDC_ID_TOKEN_INVALID"]}
    assert sessions(sql) == []


def test_an_answer_without_iss_is_refused_when_the_provider_promises_it(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """RFC 9207: a provider that advertises authorization_response_iss_parameter_supported always
    names itself; an answer without `iss` may come from another provider (a mix-up)."""
    discovery = httpx.get(f"{oidc_provider.issuer}/.well-known/openid-configuration").json()
    assert discovery["authorization_response_iss_parameter_supported"] is True
    path, _, query = back_from_provider(service, oidc_provider, browser, "rita").partition("?")
    without_iss = urlencode([(k, v) for k, v in parse_qsl(query) if k != "iss"])
    assert refusal(finish(service, f"{path}?{without_iss}")) == {"sign_in_error": ["OIDC_ID_TOKEN_INVALID"]}
    assert sessions(sql) == []


def test_an_oidc_session_past_its_expiry_is_refused(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """The row's own expires_at ends the session on lookup, the cookie sent again as a browser that
    kept it would (the ID token itself still lives)."""
    sign_in(service, oidc_provider, browser, "rita")
    cookie = service.cookies["rq_session"]
    assert service.get("/session").status_code == 200
    sql.execute("UPDATE oidc_session SET expires_at = now() - interval '1 second'")
    service.cookies.clear()
    service.cookies.set("rq_session", cookie, domain="review.test", path="/")
    assert_problem(service.get("/session"), 401, "UNAUTHENTICATED")


def test_the_providers_error_is_passed_on_as_a_code(
    service: TestClient, oidc_provider: RealProvider, browser: httpx.Client
) -> None:
    """The person pressed Cancel on the provider's own login page: error=access_denied comes back."""
    callback = back_from_provider(service, oidc_provider, browser, "rita", cancel=True)
    assert "error=access_denied" in callback
    assert refusal(finish(service, callback)) == {
        "sign_in_error": ["OIDC_PROVIDER_ERROR"],
        "provider_error": ["access_denied"],
    }
    # Only plain error codes go on to the desk, which words them itself: no text from the URL.
    odd = finish(service, "/auth/oidc/callback?error=%3Cscript%3E&error_description=call+555")
    assert refusal(odd) == {"sign_in_error": ["OIDC_PROVIDER_ERROR"]}


def test_signing_out_ends_the_provider_session_too(
    service: TestClient,
    oidc_provider: RealProvider,
    browser: httpx.Client,
    desk_client: Client,
    sql: psycopg.Connection,
) -> None:
    sign_in(service, oidc_provider, browser, "rita")
    csrf = service.get("/session").json()["csrf_token"]
    out = service.delete("/session", headers={"X-CSRF-Token": csrf})
    assert out.status_code == 200, out.text
    end = urlsplit(out.json()["end_session_url"])
    assert f"{end.scheme}://{end.netloc}{end.path}" == f"{oidc_provider.issuer}/session/end"
    query = {k: v[0] for k, v in parse_qs(end.query).items()}
    assert (
        query["post_logout_redirect_uri"] == f"{PUBLIC}/desk/" and query["client_id"] == desk_client.client_id
    )
    assert query["id_token_hint"].count(".") == 2
    assert sessions(sql) == [] and service.get("/session").status_code == 401
    # The provider agrees: its sign-out page, confirmed, sends the browser back to the desk, and the
    # next sign-in asks for the login again instead of passing straight through.
    assert oidc_provider.sign_in(browser, out.json()["end_session_url"], "rita") == f"{PUBLIC}/desk/"
    page = browser.get(start(service).headers["location"], follow_redirects=True)
    assert 'name="login"' in page.text


def test_without_oidc_the_routes_say_so(client: TestClient) -> None:
    assert client.get("/auth/oidc").json() == {"enabled": False, "provider_name": None, "login_url": None}
    assert_problem(client.get("/auth/oidc/login", follow_redirects=False), 404, "OIDC_NOT_CONFIGURED")
    assert_problem(client.get("/auth/oidc/callback?code=x&state=y"), 404, "OIDC_NOT_CONFIGURED")


def test_the_desk_learns_the_providers_name(service: TestClient) -> None:
    assert service.get("/auth/oidc").json() == {
        "enabled": True,
        "provider_name": "Test IdP",
        "login_url": "/auth/oidc/login",
    }


def test_an_unreachable_provider_is_a_sentence_not_an_error(db_url: str, desk_client: Client) -> None:
    from tests.support.servers import free_port

    gone = f"http://localhost:{free_port()}"
    settings = make_settings(
        db_url, oidc_issuer=gone, oidc_client_id="desk", oidc_role_map="g=reviewer", public_url=PUBLIC
    )
    with TestClient(create_app(settings), base_url=PUBLIC) as service:
        response = service.get("/auth/oidc/login", follow_redirects=False)
        assert refusal(response) == {"sign_in_error": ["IDENTITY_PROVIDER_UNAVAILABLE"]}


def test_the_id_token_claims_can_come_from_the_id_token_alone(
    db_url: str, browser: httpx.Client, sql: psycopg.Connection
) -> None:
    """A provider that puts the profile and groups in the ID token (Keycloak and Entra can): no
    UserInfo call is needed."""
    with real_provider(conform_id_token_claims=False) as provider:
        client = provider.register_desk(PUBLIC)
        settings = make_settings(db_url, **provider.service_settings(PUBLIC, client))
        with TestClient(create_app(settings), base_url=PUBLIC) as service:
            sign_in(service, provider, browser, "april")
            assert sessions(sql) == [("april", "approver")]
        assert "/me" not in provider.requests()


def test_segregation_of_duties_holds_across_both_kinds_of_sign_in(
    service: TestClient,
    oidc_provider: RealProvider,
    browser: httpx.Client,
    sql: psycopg.Connection,
    make_token: Callable[[str, str], str],
) -> None:
    """rita prepares a write-off in the desk (signed in by the provider); a project token of the same
    person, lower-case as the provider's subject is, cannot approve it."""
    seed_items(sql, 1, amount="2500.00")
    sign_in(service, oidc_provider, browser, "rita")
    csrf = {"X-CSRF-Token": service.get("/session").json()["csrf_token"]}
    (item,) = service.post("/leases", json={}, headers=csrf).json()["items"]
    body = {"resolution": "WRITE_OFF", "note": "rounding"}
    proposed = service.post(f"/items/{item['id']}/complete", json=body, headers=csrf)
    assert proposed.json()["outcome"] == "submitted_for_approval", proposed.text
    service.cookies.clear()
    same_person = {"Authorization": f"Bearer {make_token('rita.reviewer', 'approver')}"}
    assert service.post("/leases", json={"queue": "approval"}, headers=same_person).json()["items"] == []
    refused = service.post(f"/items/{item['id']}/approve", json={}, headers=same_person)
    assert_problem(refused, 403, "SEGREGATION_OF_DUTIES")


def _answered_with(
    service: TestClient, provider: RealProvider, browser: httpx.Client, claims: dict[str, Any]
) -> httpx.Response:
    """A whole sign-in as rita, the provider's token endpoint answering with an ID token of these
    claims (signed with its own key, for this sign-in's nonce and the desk's client)."""
    login = start(service)
    nonce = parse_qs(urlsplit(login.headers["location"]).query)["nonce"][0]
    callback = provider.sign_in(browser, login.headers["location"], "rita").removeprefix(PUBLIC)
    rita = {
        "sub": "rita",
        "nonce": nonce,
        "preferred_username": "Rita.Reviewer",
        "groups": ["recon-reviewers"],
    }
    provider.answer_next_code_with(provider.sign({**rita, **claims}))
    return finish(service, callback)


@pytest.mark.parametrize(
    ("lifetime", "signed_in"),
    [(600, True), (86_400, True), (86_401, False), (10**30, False), (1e300, False)],
    ids=["10 minutes", "the cap", "past the cap", "10**30", "1e300"],
)
def test_an_id_token_claiming_too_long_a_life_is_a_sign_in_error_not_a_500(
    service: TestClient,
    oidc_provider: RealProvider,
    desk_client: Client,
    browser: httpx.Client,
    sql: psycopg.Connection,
    lifetime: float,
    signed_in: bool,
) -> None:
    """exp - iat at most REVIEW_QUEUE_OIDC_MAX_TOKEN_LIFETIME_S (a day by default): an exp of 1e300
    made the callback a 500 (OverflowError turning it into the session's end)."""
    now = int(time.time())
    claims = {"aud": desk_client.client_id, "iat": now, "exp": now + lifetime}
    done = _answered_with(service, oidc_provider, browser, claims)
    if signed_in:
        assert done.headers["location"] == "/desk/"
        assert sessions(sql) == [("rita.reviewer", "reviewer")]
    else:
        assert refusal(done) == {"sign_in_error": ["OIDC_ID_TOKEN_INVALID"]}
        assert sessions(sql) == []


# --- the ID token's checks, with real ID tokens -------------------------------------------------------


@pytest.fixture
def real_tokens(oidc_provider: RealProvider, desk_client: Client, browser: httpx.Client) -> dict[str, Any]:
    """A real token answer (ID token and access token) for the desk client, from a whole code flow."""
    return oidc_provider.code_flow(browser, desk_client, f"{PUBLIC}/auth/oidc/callback", "rita")


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _parts(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    header, payload, signature = token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    return (
        json.loads(base64.urlsafe_b64decode(pad(header))),
        json.loads(base64.urlsafe_b64decode(pad(payload))),
        signature,
    )


async def _check_id_token(settings: Settings, id_token: str, nonce: str, access_token: str | None) -> str:
    provider = OidcProvider(settings)
    try:
        claims = await provider.id_token_claims(id_token, nonce=nonce, access_token=access_token)
        return f"accepted {claims['sub']}"
    except Refused as refused:
        return refused.detail
    finally:
        await provider.aclose()


@pytest.mark.anyio
async def test_a_real_id_token_passes_and_each_kind_of_tampering_is_refused(
    oidc_settings: Settings, real_tokens: dict[str, Any]
) -> None:
    id_token, nonce, access = real_tokens["id_token"], real_tokens["nonce"], real_tokens["access_token"]
    header, claims, signature = _parts(id_token)
    assert await _check_id_token(oidc_settings, id_token, nonce, access) == "accepted rita"

    # The payload changed, the provider's signature kept.
    forged = f"{_b64(header)}.{_b64({**claims, 'sub': 'ada'})}.{signature}"
    assert "signature does not verify" in await _check_id_token(oidc_settings, forged, nonce, access)
    # Signed by a key the test made, under the provider's key id, and under a new one.
    mine = RSAKey.generate_key(2048)
    for kid in (header["kid"], "test-key"):
        resigned = jwt.encode({"alg": "RS256", "kid": kid}, claims, mine)
        refused = await _check_id_token(oidc_settings, resigned, nonce, access)
        assert "signature does not verify" in refused or "key the provider does not publish" in refused
    # No signature at all, and an HMAC keyed with the client secret (the classic confusion).
    unsigned = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."
    assert "algorithm is not accepted" in await _check_id_token(oidc_settings, unsigned, nonce, access)
    secret = OctKey.import_key(oidc_settings.oidc_client_secret.get_secret_value())  # type: ignore[union-attr]
    hmac = jwt.encode({"alg": "HS256"}, claims, secret, algorithms=["HS256"])
    assert "algorithm is not accepted" in await _check_id_token(oidc_settings, hmac, nonce, access)
    # A real token, but for another sign-in.
    assert "nonce" in await _check_id_token(oidc_settings, id_token, "another-nonce", access)


@pytest.mark.anyio
async def test_an_id_token_for_another_client_is_refused(
    oidc_provider: RealProvider, oidc_settings: Settings, browser: httpx.Client
) -> None:
    other = oidc_provider.register_desk("https://other-app.test")
    tokens = oidc_provider.code_flow(browser, other, "https://other-app.test/auth/oidc/callback", "rita")
    refused = await _check_id_token(
        oidc_settings, tokens["id_token"], tokens["nonce"], tokens["access_token"]
    )
    assert "audience" in refused, refused


@pytest.mark.anyio
async def test_an_expired_id_token_is_refused(
    db_url: str, oidc_provider: RealProvider, browser: httpx.Client
) -> None:
    client = oidc_provider.register_desk(PUBLIC, id_token_ttl_s=1)
    settings = make_settings(db_url, **oidc_provider.service_settings(PUBLIC, client, oidc_clock_skew_s=0))
    tokens = oidc_provider.code_flow(browser, client, f"{PUBLIC}/auth/oidc/callback", "rita")
    exp = _parts(tokens["id_token"])[1]["exp"]
    await anyio.sleep(max(0.0, exp + 1.5 - time.time()))  # past exp: the token's own clock, whole seconds
    refused = await _check_id_token(settings, tokens["id_token"], tokens["nonce"], tokens["access_token"])
    assert refused == "the ID token was refused: it has expired"


# --- API calls with the provider's JWTs ------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_scripts_client_credentials_token_works_like_a_project_token(
    service: TestClient,
    oidc_provider: RealProvider,
    sql: psycopg.Connection,
    make_token: Callable[[str, str], str],
) -> None:
    seed_items(sql, 2)
    script = bearer(oidc_provider.script_token("recon-script"))
    me = service.get("/session", headers=script).json()
    assert (me["subject"], me["role"], me["csrf_token"]) == ("recon-script", "reviewer", None)
    (item,) = service.post("/leases", json={"batch_size": 1}, headers=script).json()["items"]
    assert item["leased_by"] == "recon-script"
    assert (
        service.post(
            f"/items/{item['id']}/complete", json={"resolution": "MATCH_CONFIRMED"}, headers=script
        ).status_code
        == 200
    )
    loader = bearer(oidc_provider.script_token("recon-loader"))  # recon-ingest
    assert (
        service.post(
            "/items",
            json={
                "idempotency_key": "k",
                "ledger_entity": "E",
                "variance_amount": "1.00",
                "match_decision": "PARTIAL",
                "source_hash": "h",
            },
            headers=loader,
        ).status_code
        == 201
    )
    assert_problem(service.post("/leases", json={}, headers=loader), 403, "FORBIDDEN")
    # Project tokens keep working beside them.
    assert (
        service.get("/session", headers=bearer(make_token("alice", "reviewer"))).json()["subject"] == "alice"
    )


def test_provider_tokens_that_are_not_for_this_api_are_refused(
    service: TestClient, oidc_provider: RealProvider, real_tokens: dict[str, Any]
) -> None:
    cases = {
        # A real token of the provider, for another resource server.
        "not for this audience": oidc_provider.script_token("recon-script", resource=OTHER_AUDIENCE),
        # A real ID token: its audience is the desk's client id, never the API's.
        "not for this audience ": real_tokens["id_token"],
    }
    for reason, token in cases.items():
        problem = assert_problem(service.get("/session", headers=bearer(token)), 401, "UNAUTHENTICATED")
        assert reason.strip() in problem["detail"], problem
    nobody = oidc_provider.script_token("recon-nobody")  # real, for this API, in no mapped group
    assert_problem(service.get("/session", headers=bearer(nobody)), 403, "FORBIDDEN")


def _api_token(provider: RealProvider, **claims: Any) -> str:
    """A token of the provider (its own key) for this API, as rita through the desk's client, with
    these claims changed (None: left out); header options as `typ`."""
    typ = claims.pop("typ", "at+jwt")
    base = {
        "aud": API_AUDIENCE,
        "client_id": "desk-client",
        "sub": "rita",
        "preferred_username": "Rita.Reviewer",
        "groups": ["recon-reviewers"],
    }
    return provider.sign({**base, **claims}, typ=typ)


def test_an_id_token_is_never_an_api_bearer(
    service: TestClient, oidc_provider: RealProvider, desk_client: Client
) -> None:
    """Even one whose audience lists the API too: typ, a nonce, or an audience that names the client
    it was issued to (the desk's, or its own azp) tells it from an access token."""
    admin = {"groups": ["recon-admins"]}
    assert (
        service.get("/session", headers=bearer(_api_token(oidc_provider, **admin))).json()["role"] == "admin"
    )
    desk = desk_client.client_id
    id_tokens = {
        "aud lists the desk": {"typ": "JWT", "aud": [desk, API_AUDIENCE], "client_id": None, "azp": desk},
        "aud lists the desk, no azp": {"typ": None, "aud": [desk, API_AUDIENCE], "client_id": None},
        "aud lists its own client": {"typ": "JWT", "aud": ["other-app", API_AUDIENCE], "azp": "other-app"},
        "a nonce": {"typ": "JWT", "nonce": "n-1", "client_id": None, "azp": "other-app"},
        "another type": {"typ": "logout+jwt"},
    }
    for case, claims in id_tokens.items():
        problem = assert_problem(
            service.get("/session", headers=bearer(_api_token(oidc_provider, **admin, **claims))),
            401,
            "UNAUTHENTICATED",
        )
        assert "ID token" in problem["detail"] or "not an access token" in problem["detail"], (case, problem)


@pytest.mark.parametrize(
    ("lifetime", "accepted"),
    [(86_400, True), (86_401, False), (10**30, False), (1e300, False), (None, False)],
    ids=["the cap", "past the cap", "10**30", "1e300", "no iat"],
)
def test_an_api_token_claiming_too_long_a_life_is_refused(
    service: TestClient, oidc_provider: RealProvider, lifetime: float | None, accepted: bool
) -> None:
    now = int(time.time())
    claims = {"iat": now, "exp": now + lifetime} if lifetime is not None else {"iat": None}
    response = service.get("/session", headers=bearer(_api_token(oidc_provider, **claims)))
    if accepted:
        assert response.json()["subject"] == "rita.reviewer", response.text
    else:
        problem = assert_problem(response, 401, "UNAUTHENTICATED")
        assert "REVIEW_QUEUE_OIDC_MAX_TOKEN_LIFETIME_S" in problem["detail"] or "iat" in problem["detail"]


def test_a_token_naming_no_person_needs_its_client_listed(
    service: TestClient, oidc_provider: RealProvider
) -> None:
    """client_id "boss" in an admin group is not admin "boss": a client acts as a subject only when
    REVIEW_QUEUE_OIDC_API_CLIENTS says so (the provider's scripts are listed there)."""
    boss = _api_token(
        oidc_provider, client_id="boss", sub="boss", preferred_username=None, groups=["recon-admins"]
    )
    problem = assert_problem(service.get("/session", headers=bearer(boss)), 401, "UNAUTHENTICATED")
    assert "REVIEW_QUEUE_OIDC_API_CLIENTS" in problem["detail"], problem
    # Listed: by client_id (RFC 9068), or by azp alone (Entra's app-only tokens).
    for claims in ({"client_id": "recon-script"}, {"client_id": None, "azp": "recon-script"}):
        script = _api_token(oidc_provider, preferred_username=None, **claims)
        assert service.get("/session", headers=bearer(script)).json()["subject"] == "recon-script"


def test_an_api_username_is_checked_as_sent_before_it_is_folded(
    service: TestClient, oidc_provider: RealProvider
) -> None:
    kasey = _api_token(oidc_provider, sub="kasey", preferred_username="Kasey")
    assert service.get("/session", headers=bearer(kasey)).json()["subject"] == "kasey"
    kelvin = _api_token(oidc_provider, sub="kelvin", preferred_username="\u212aasey")
    problem = assert_problem(service.get("/session", headers=bearer(kelvin)), 401, "UNAUTHENTICATED")
    assert "must be 1-128 characters" in problem["detail"], problem


def test_groups_sent_as_a_string_give_no_role(service: TestClient, oidc_provider: RealProvider) -> None:
    token = _api_token(oidc_provider, groups="recon-admins")
    problem = assert_problem(service.get("/session", headers=bearer(token)), 403, "FORBIDDEN")
    assert "not a list" in problem["detail"], problem


def test_a_tampered_or_foreign_signed_api_token_is_refused(
    service: TestClient, oidc_provider: RealProvider
) -> None:
    token = oidc_provider.script_token("recon-script")
    assert service.get("/session", headers=bearer(token)).status_code == 200
    header, claims, signature = _parts(token)
    forged = f"{_b64(header)}.{_b64({**claims, 'groups': ['recon-admins']})}.{signature}"
    problem = assert_problem(service.get("/session", headers=bearer(forged)), 401, "UNAUTHENTICATED")
    assert "signature does not verify" in problem["detail"]
    mine = RSAKey.generate_key(2048)
    for kid in (header["kid"], "rotated-key"):
        resigned = jwt.encode(
            {"alg": "RS256", "kid": kid, "typ": "at+jwt"}, {**claims, "groups": ["recon-admins"]}, mine
        )
        assert_problem(service.get("/session", headers=bearer(resigned)), 401, "UNAUTHENTICATED")


def test_an_expired_api_token_is_refused(
    db_url: str, oidc_provider: RealProvider, desk_client: Client
) -> None:
    settings = make_settings(
        db_url, **oidc_provider.service_settings(PUBLIC, desk_client, oidc_clock_skew_s=0)
    )
    with TestClient(create_app(settings), base_url=PUBLIC) as service:
        token = oidc_provider.script_token("recon-brief")  # lives 3 s
        assert service.get("/session", headers=bearer(token)).status_code == 200
        wait_for(lambda: service.get("/session", headers=bearer(token)).status_code == 401, timeout=60)
        problem = service.get("/session", headers=bearer(token)).json()
        # The refusal, and what the service takes instead (a JWT for this audience, or introspection).
        assert problem["detail"] == (
            "the provider's token was refused: it has expired; expected a JWT access token for"
            f" audience {API_AUDIENCE!r}, or an opaque access token for it that the provider's"
            " introspection endpoint says is active"
        )


def test_api_calls_fetch_nothing_from_the_provider_but_its_keys_once(
    service: TestClient, oidc_provider: RealProvider
) -> None:
    """No network I/O per request beyond a cached JWKS; and made-up key ids cannot make the service
    hammer the provider (one refetch at most per KEYS_MIN_REFRESH_S)."""
    tokens = [oidc_provider.script_token("recon-script") for _ in range(3)]
    assert service.get("/session", headers=bearer(tokens[0])).status_code == 200  # fills the caches
    before = oidc_provider.requests()
    for _ in range(5):
        for token in tokens:
            assert service.get("/session", headers=bearer(token)).status_code == 200
    mine = RSAKey.generate_key(2048)
    for _ in range(10):
        made_up = jwt.encode({"alg": "RS256", "kid": secrets.token_hex(8)}, {"sub": "x"}, mine)
        assert_problem(service.get("/session", headers=bearer(made_up)), 401, "UNAUTHENTICATED")
    after = oidc_provider.requests()
    changed = {
        path: after[path] - before.get(path, 0) for path in after if after[path] != before.get(path, 0)
    }
    assert changed in ({}, {"/jwks": 1}), changed


def test_without_an_api_audience_a_provider_token_is_just_malformed(
    db_url: str, oidc_provider: RealProvider, desk_client: Client
) -> None:
    settings = make_settings(
        db_url, **oidc_provider.service_settings(PUBLIC, desk_client, oidc_api_audience=None)
    )
    with TestClient(create_app(settings), base_url=PUBLIC) as service:
        token = oidc_provider.script_token("recon-script")
        problem = assert_problem(service.get("/session", headers=bearer(token)), 401, "UNAUTHENTICATED")
        assert problem["detail"] == "the token is not a review-queue token"


def test_api_audience_alone_needs_no_desk_client(db_url: str, oidc_provider: RealProvider) -> None:
    values = oidc_provider.service_settings(PUBLIC, None)
    del values["public_url"]  # only needed for the desk's redirect URI
    settings = make_settings(db_url, **values)
    with TestClient(create_app(settings)) as service:
        assert (
            service.get("/session", headers=bearer(oidc_provider.script_token("recon-script"))).status_code
            == 200
        )
        assert service.get("/auth/oidc").json()["enabled"] is False
        assert_problem(service.get("/auth/oidc/login", follow_redirects=False), 404, "OIDC_NOT_CONFIGURED")


def _garbage() -> list[str]:
    def b(value: object) -> str:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    rs = b({"alg": "RS256"})
    return [
        "eyJ.eyJ.x",
        f"{b([1, 2])}.e30.x",
        f"eyJ{b(b'garbage')}.e30.x",
        f"{b({'alg': 5})}.e30.x",
        f"{b({'alg': 'RS256', 'kid': 5})}.e30.x",
        f"{b({'alg': 'RS256', 'kid': 'a', 'crit': ['x']})}.e30.x",
        f"{b({'alg': 'RS256', 'b64': False, 'crit': ['b64']})}.e30.x",
        f"{b({'alg': 'RS256', 'jku': 'https://evil.example/jwks'})}.e30.x",
        f"{rs}.{b([1])}.x",
        f"{rs}.{b(bytes([255]))}.x",
        f"{rs}.e30.{'A' * 342}",
    ]


@pytest.mark.parametrize("token", _garbage())
def test_garbage_shaped_like_a_jwt_is_a_401_never_a_500(
    service: TestClient, oidc_provider: RealProvider, token: str
) -> None:
    assert (
        service.get("/session", headers=bearer(oidc_provider.script_token("recon-script"))).status_code == 200
    )
    assert_problem(service.get("/session", headers=bearer(token)), 401, "UNAUTHENTICATED")


def test_the_desk_has_a_sentence_for_every_refusal_code() -> None:
    """The callback sends only a code; web/oidc.js words each one (an unknown code would get the
    generic sentence, which says nothing useful)."""
    from api.desk import WEB_DIR
    from api.oidc import SIGN_IN_ERRORS

    source = (WEB_DIR / "oidc.js").read_text()
    table = source[source.index("const SIGN_IN_ERRORS = {") :]
    missing = [code for code in SIGN_IN_ERRORS if f"  {code}: " not in table]
    assert not missing, f"web/oidc.js has no sentence for {missing}"
