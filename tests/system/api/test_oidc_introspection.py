"""API calls with the provider's opaque access tokens, checked by RFC 7662 introspection
(api/introspection.py), against the real provider the other OIDC tests share (oidc-provider,
tests/support/oidc_provider.py): its scripts `recon-opaque*` and desk clients registered with
`opaque=True` get opaque access tokens for the API, and it answers at its introspection endpoint."""

import dataclasses
import logging
import secrets
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.support import wait_for
from tests.support.api import assert_problem
from tests.support.oidc_provider import API_AUDIENCE, Client, RealProvider
from tests.support.postgres import make_settings
from tests.support.servers import free_port

PUBLIC = "https://review.test"
EXPECTED_WITH_INTROSPECTION = (
    f"expected a JWT access token for audience {API_AUDIENCE!r}, or an opaque access token for it"
    " that the provider's introspection endpoint says is active"
)


@pytest.fixture
def desk_client(oidc_provider: RealProvider) -> Client:
    return oidc_provider.register_desk(PUBLIC)


def settings_for(db_url: str, provider: RealProvider, client: Client, **overrides: object) -> Settings:
    return make_settings(db_url, **provider.service_settings(PUBLIC, client, **overrides))


@pytest.fixture
def service(db_url: str, oidc_provider: RealProvider, desk_client: Client) -> Iterator[TestClient]:
    """REVIEW_QUEUE_OIDC_INTROSPECTION unset: on, as the provider names the endpoint and the desk's
    client has a secret."""
    settings = settings_for(db_url, oidc_provider, desk_client)
    assert settings.oidc_introspection is None
    with TestClient(create_app(settings), base_url=PUBLIC, raise_server_exceptions=False) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def introspections(provider: RealProvider) -> int:
    return provider.requests().get("/token/introspection", 0)


def test_an_opaque_token_of_the_provider_is_accepted_with_its_role(
    service: TestClient, oidc_provider: RealProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """A script's (client credentials, listed in REVIEW_QUEUE_OIDC_API_CLIENTS) and a person's (the
    code flow of a desk client, for the API's resource): the subject and role a JWT would give.
    The provider is asked once per token while the answer is cached, and no log line holds a token."""
    caplog.set_level(logging.DEBUG)
    script = oidc_provider.script_token("recon-opaque")  # in recon-approvers
    assert not script.startswith("eyJ") and script.count(".") == 0, script
    before = introspections(oidc_provider)
    for _ in range(5):
        me = service.get("/session", headers=bearer(script)).json()
        assert (me["subject"], me["role"]) == ("recon-opaque", "approver"), me
    assert introspections(oidc_provider) - before == 1
    assert service.post("/leases", json={"queue": "approval"}, headers=bearer(script)).status_code == 200

    opaque_desk = oidc_provider.register_desk(PUBLIC, opaque=True)
    with httpx.Client() as browser:
        tokens = oidc_provider.code_flow(
            browser, opaque_desk, f"{PUBLIC}/auth/oidc/callback", "rita", resource=API_AUDIENCE
        )
    person = tokens["access_token"]
    assert not person.startswith("eyJ"), person
    me = service.get("/session", headers=bearer(person)).json()
    assert (me["subject"], me["role"]) == ("rita.reviewer", "reviewer"), me  # preferred_username, groups
    logged = "\n".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    assert script not in logged and person not in logged


def test_a_revoked_opaque_token_is_refused_once_its_answer_is_no_longer_cached(
    db_url: str, oidc_provider: RealProvider, desk_client: Client
) -> None:
    settings = settings_for(db_url, oidc_provider, desk_client, oidc_introspection_cache_s=3)
    with TestClient(create_app(settings), base_url=PUBLIC) as service:
        token = oidc_provider.script_token("recon-opaque")
        assert service.get("/session", headers=bearer(token)).status_code == 200
        oidc_provider.revoke("recon-opaque", token)
        # Still the cached answer (at most REVIEW_QUEUE_OIDC_INTROSPECTION_CACHE_S), then refused.
        assert service.get("/session", headers=bearer(token)).status_code == 200
        waited = wait_for(lambda: service.get("/session", headers=bearer(token)).status_code == 401, 30)
        assert waited <= 3 + 2, waited
        problem = assert_problem(service.get("/session", headers=bearer(token)), 401, "UNAUTHENTICATED")
        assert problem["detail"] == (
            "the provider's token was refused: the provider's introspection endpoint says it is not"
            f" active (expired, revoked, or never issued); {EXPECTED_WITH_INTROSPECTION}"
        )


def test_an_expired_opaque_token_is_refused_from_its_exp_not_the_cache_life(
    service: TestClient, oidc_provider: RealProvider
) -> None:
    """recon-opaque-brief's tokens live 3 s; answers are cached up to 60 s, but never past exp."""
    token = oidc_provider.script_token("recon-opaque-brief")
    assert service.get("/session", headers=bearer(token)).json()["subject"] == "recon-opaque-brief"
    waited = wait_for(lambda: service.get("/session", headers=bearer(token)).status_code == 401, 30)
    assert waited < 10, waited  # the 3 s life (and whole-second exp), far below the 60 s cache


def test_a_401_for_a_provider_token_names_what_the_service_expected(
    db_url: str, service: TestClient, oidc_provider: RealProvider, desk_client: Client
) -> None:
    unknown = secrets.token_urlsafe(32)  # shaped like the provider's tokens, never issued
    problem = assert_problem(service.get("/session", headers=bearer(unknown)), 401, "UNAUTHENTICATED")
    assert problem["detail"].endswith(
        f"not active (expired, revoked, or never issued); {EXPECTED_WITH_INTROSPECTION}"
    )
    # A real opaque token of the provider, but for its own UserInfo endpoint, not for this API.
    with httpx.Client() as browser:
        userinfo_only = oidc_provider.code_flow(browser, desk_client, f"{PUBLIC}/auth/oidc/callback", "rita")
    problem = assert_problem(
        service.get("/session", headers=bearer(userinfo_only["access_token"])), 401, "UNAUTHENTICATED"
    )
    assert problem["detail"] == (
        f"the provider's token was refused: it is not for this audience; {EXPECTED_WITH_INTROSPECTION}"
    )
    # A JWT for another audience says the same.
    other = oidc_provider.script_token("recon-script", resource="https://another-service.test/api")
    problem = assert_problem(service.get("/session", headers=bearer(other)), 401, "UNAUTHENTICATED")
    assert problem["detail"].endswith(f"it is not for this audience; {EXPECTED_WITH_INTROSPECTION}")

    # Introspection off: an opaque token is refused without asking, and the 401 says what would do.
    settings = settings_for(db_url, oidc_provider, desk_client, oidc_introspection=False)
    with TestClient(create_app(settings), base_url=PUBLIC) as off:
        before = introspections(oidc_provider)
        token = oidc_provider.script_token("recon-opaque")
        problem = assert_problem(off.get("/session", headers=bearer(token)), 401, "UNAUTHENTICATED")
        assert problem["detail"] == (
            "the token is neither a review-queue token nor a JWT; expected a JWT access token for"
            f" audience {API_AUDIENCE!r}; opaque tokens are not checked here (introspection is off:"
            " REVIEW_QUEUE_OIDC_INTROSPECTION, a client secret, and the provider's"
            " introspection_endpoint turn it on)"
        )
        assert introspections(oidc_provider) == before


def test_an_introspection_endpoint_that_cannot_answer_is_a_503_never_cached(
    service: TestClient, db_url: str, oidc_provider: RealProvider, desk_client: Client
) -> None:
    """Down (connection refused), or refusing this service's own client: a 503 with a stable code,
    not a 401 (the token may be good) and not a 500; the next call asks again."""
    token = oidc_provider.script_token("recon-opaque")
    assert (
        service.get("/session", headers=bearer(oidc_provider.script_token("recon-script"))).status_code == 200
    )
    oidc = service.app.state.oidc  # type: ignore[attr-defined]
    real = oidc._metadata
    # The discovery document fetched, then the endpoint it names gone (nothing listens there).
    oidc._metadata = dataclasses.replace(
        real, introspection_endpoint=f"http://127.0.0.1:{free_port()}/introspect"
    )
    problem = assert_problem(
        service.get("/session", headers=bearer(token)), 503, "IDENTITY_PROVIDER_UNAVAILABLE"
    )
    assert "the introspection endpoint" in problem["detail"], problem
    oidc._metadata = real
    assert service.get("/session", headers=bearer(token)).json()["subject"] == "recon-opaque"

    wrong = dataclasses.replace(desk_client, client_secret="not-the-secret-" + "x" * 32)
    with TestClient(create_app(settings_for(db_url, oidc_provider, wrong)), base_url=PUBLIC) as misconfigured:
        problem = assert_problem(
            misconfigured.get("/session", headers=bearer(token)), 503, "IDENTITY_PROVIDER_UNAVAILABLE"
        )
        assert "refused this service's client (401 'invalid_client')" in problem["detail"], problem

    # REVIEW_QUEUE_OIDC_INTROSPECTION=1 with a provider that names no endpoint: said, as a 503.
    settings = settings_for(db_url, oidc_provider, desk_client, oidc_introspection=True)
    with TestClient(create_app(settings), base_url=PUBLIC) as required:
        assert required.get("/session", headers=bearer(token)).status_code == 200
        oidc = required.app.state.oidc  # type: ignore[attr-defined]
        oidc._metadata = dataclasses.replace(oidc._metadata, introspection_endpoint=None)
        problem = assert_problem(
            required.get("/session", headers=bearer(secrets.token_urlsafe(32))),
            503,
            "IDENTITY_PROVIDER_UNAVAILABLE",
        )
        assert "names no introspection_endpoint" in problem["detail"], problem


@pytest.mark.parametrize(
    "token",
    ["x", "a" * 4096, "a" * 4097, "rq_short", "~+/-._==", "a=b", "eyJ-not-a-jwt", "a.b.c", "=" * 8],
    ids=["one", "4 KiB", "over 4 KiB", "rq_ prefix", "symbols", "inner =", "eyJ", "dots", "padding"],
)
def test_odd_bearers_with_introspection_on_are_401s_never_500s(service: TestClient, token: str) -> None:
    problem = assert_problem(service.get("/session", headers=bearer(token)), 401, "UNAUTHENTICATED")
    assert "expected a JWT access token" in problem["detail"] or problem["detail"] == (
        "the token is not a review-queue token"
    ), problem
