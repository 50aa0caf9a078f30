"""The introspection cache's bounds (api/introspection.py): how long an answer is reused, how many
are kept, what they are keyed by. The provider here is a stand-in on httpx's MockTransport that
counts the calls and answers as RFC 7662 says (tests/system/api/test_oidc_introspection.py checks
the same paths against the real provider); time is the test's own clock."""

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.introspection import Introspection, cache_key, looks_opaque
from api.oidc import Metadata, OidcProvider, ProviderUnavailable
from api.oidc_claims import Refused
from api.settings import Settings

ISSUER = "https://sso.example.com"
AUDIENCE = "https://review.example.com/api"
ENDPOINT = f"{ISSUER}/token/introspection"


class Clock:
    """Wall time (for exp) and the cache's timer, moved together by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def wall(self) -> float:
        return self.now

    def timer(self) -> float:
        return self.now - 1_700_000_000.0


class Provider:
    """Answers each token with `answers[token]` (`active: false` when unknown), counting calls."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[str] = []
        self.answers: dict[str, dict[str, Any]] = {}
        self.status = 200

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"].startswith("Basic ")  # the desk's client, by its secret
        form = parse_qs(request.content.decode())
        token = form["token"][0]
        assert form["token_type_hint"] == ["access_token"]
        self.calls.append(token)
        if self.status != 200:
            return httpx.Response(self.status, text="down")
        return httpx.Response(200, json=self.answers.get(token, {"active": False}))

    def issue(self, token: str, life_s: float, **claims: Any) -> str:
        self.answers[token] = {
            "active": True,
            "iss": ISSUER,
            "aud": AUDIENCE,
            "client_id": "recon-opaque",
            "token_type": "Bearer",
            "iat": int(self.clock.now),
            "exp": self.clock.now + life_s,
            "groups": ["recon-reviewers"],
            **claims,
        }
        return token


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "oidc_issuer": ISSUER,
        "oidc_client_id": "desk",
        "oidc_client_secret": "desk-secret",
        "oidc_role_map": "recon-reviewers=reviewer",
        "oidc_api_audience": AUDIENCE,
        "oidc_api_clients": "recon-opaque=recon-opaque",
        "public_url": "https://review.example.com",
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def provider(clock: Clock) -> Provider:
    return Provider(clock)


Make = Callable[..., Introspection]


def introspection_of(
    clock: Clock, provider: Provider, max_entries: int = 10_000, **overrides: Any
) -> Introspection:
    """An Introspection whose provider has been discovered (its metadata given, not fetched)."""
    oidc = OidcProvider(settings(**overrides))
    metadata = Metadata(
        issuer=ISSUER,
        authorization_endpoint=f"{ISSUER}/auth",
        token_endpoint=f"{ISSUER}/token",
        jwks_uri=f"{ISSUER}/jwks",
        userinfo_endpoint=None,
        end_session_endpoint=None,
        introspection_endpoint=ENDPOINT,
        algorithms=("RS256",),
        iss_parameter_supported=True,
    )

    async def discovered() -> Metadata:
        return metadata

    oidc.metadata = discovered  # type: ignore[method-assign]
    return Introspection(
        oidc,
        max_entries=max_entries,
        timer=clock.timer,
        clock=clock.wall,
        transport=httpx.MockTransport(provider.handle),
    )


@pytest.fixture
def make(clock: Clock, provider: Provider) -> Make:
    def make(max_entries: int = 10_000, **overrides: Any) -> Introspection:
        return introspection_of(clock, provider, max_entries, **overrides)

    return make


def call(introspection: Introspection, token: str) -> str:
    """The subject, or the refusal's detail."""
    try:
        principal, _account = asyncio.run(introspection.principal(token))
    except Refused as refused:
        return f"refused: {refused.detail}"
    return principal.subject


def test_an_answer_is_reused_for_the_cache_life_and_no_longer(
    make: Make, provider: Provider, clock: Clock
) -> None:
    introspection = make()  # REVIEW_QUEUE_OIDC_INTROSPECTION_CACHE_S: 60 by default
    token = provider.issue("opaque-token-1", life_s=3600)
    assert call(introspection, token) == "recon-opaque"
    clock.now += 59.9
    assert call(introspection, token) == "recon-opaque"
    assert provider.calls == [token]
    clock.now += 0.1
    assert call(introspection, token) == "recon-opaque"
    assert provider.calls == [token, token]


def test_the_tokens_exp_ends_the_answers_life_sooner(make: Make, provider: Provider, clock: Clock) -> None:
    introspection = make()
    token = provider.issue("opaque-token-2", life_s=5)
    assert call(introspection, token) == "recon-opaque"
    clock.now += 4.9
    assert call(introspection, token) == "recon-opaque"
    assert len(provider.calls) == 1
    provider.answers[token] = {"active": False}  # expired at the provider
    clock.now += 0.1
    assert call(introspection, token).startswith("refused: the provider's token was refused: the provider's")
    assert len(provider.calls) == 2


def test_a_shorter_cache_life_is_kept_and_zero_asks_every_time(
    make: Make, provider: Provider, clock: Clock
) -> None:
    token = provider.issue("opaque-token-3", life_s=3600)
    brief = make(oidc_introspection_cache_s=2)
    assert [call(brief, token) for _ in range(3)] == ["recon-opaque"] * 3
    assert len(provider.calls) == 1
    clock.now += 2
    call(brief, token)
    assert len(provider.calls) == 2
    never = make(oidc_introspection_cache_s=0)
    for _ in range(3):
        call(never, token)
    assert len(provider.calls) == 5 and len(never.cache) == 0


def test_the_cache_holds_at_most_its_size_dropping_the_least_recently_used(
    make: Make, provider: Provider
) -> None:
    introspection = make(max_entries=3)
    tokens = [provider.issue(f"opaque-token-lru-{n}", life_s=3600) for n in range(5)]
    for token in tokens[:3]:
        call(introspection, token)
    call(introspection, tokens[0])  # used again: the most recent
    for token in tokens[3:]:
        call(introspection, token)
    assert len(introspection.cache) == 3
    assert set(introspection.cache.keys()) == {cache_key(t) for t in (tokens[0], tokens[3], tokens[4])}
    asked = len(provider.calls)
    call(introspection, tokens[0])
    assert len(provider.calls) == asked  # still cached
    call(introspection, tokens[1])
    assert len(provider.calls) == asked + 1  # dropped, asked again


def test_refusals_are_cached_too_and_never_hold_the_token(
    make: Make, provider: Provider, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    introspection = make()
    unknown = "never-issued-token-abcdef"
    for _ in range(3):
        assert call(introspection, unknown).endswith("not active (expired, revoked, or never issued)")
    assert provider.calls == [unknown]
    assert list(introspection.cache.keys()) == [cache_key(unknown)]
    assert all(unknown not in json.dumps(vars(r), default=str) for r in caplog.records)
    clock.now += 60
    call(introspection, unknown)
    assert len(provider.calls) == 2


def test_a_provider_that_cannot_answer_is_never_cached(make: Make, provider: Provider) -> None:
    introspection = make()
    token = provider.issue("opaque-token-down", life_s=3600)
    provider.status = 503
    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            asyncio.run(introspection.principal(token))
    assert len(introspection.cache) == 0
    provider.status = 200
    assert call(introspection, token) == "recon-opaque"
    assert len(provider.calls) == 3


def test_requests_missing_the_cache_at_once_share_one_call(make: Make, provider: Provider) -> None:
    introspection = make()
    token = provider.issue("opaque-token-burst", life_s=3600)

    async def burst() -> list[str]:
        answers = await asyncio.gather(*(introspection.principal(token) for _ in range(20)))
        return [principal.subject for principal, _ in answers]

    assert asyncio.run(burst()) == ["recon-opaque"] * 20
    assert provider.calls == [token]


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        ({"aud": "https://another.example/api"}, "it is not for this audience"),
        ({"aud": None}, "it is not for this audience"),
        ({"iss": "https://evil.example"}, "it is from another issuer"),
        ({"token_type": "refresh_token"}, "it is not a bearer access token"),
        ({"cnf": {"jkt": "x"}}, "it is bound to a key (cnf)"),
        ({"exp": "soon"}, "its exp or nbf is not a number"),
        ({"client_id": "boss"}, "its client 'boss' is not in REVIEW_QUEUE_OIDC_API_CLIENTS"),
    ],
)
def test_an_active_answer_must_be_a_bearer_for_this_api(
    make: Make, provider: Provider, claims: dict[str, Any], refusal: str
) -> None:
    token = provider.issue("opaque-token-odd", life_s=600, **claims)
    assert refusal in call(make(), token)


def test_the_cache_life_bound_is_the_settings_range() -> None:
    with pytest.raises(ValueError, match="less than or equal to 60"):
        settings(oidc_introspection_cache_s=61)


@pytest.mark.parametrize(
    ("token", "opaque"),
    [("2YotnFZFEjr1zCsicMWpAA", True), ("a.b~c+d/e-f_g==", True), ("rq_short", False), ("a b", False)],
)
def test_which_bearers_are_sent_to_the_provider(token: str, opaque: bool) -> None:
    assert looks_opaque(token) is opaque
    assert looks_opaque("x" * 4097) is False


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
PLAUSIBLE = {
    "active": True,
    "iss": ISSUER,
    "aud": AUDIENCE,
    "token_type": "Bearer",
    "client_id": "recon-opaque",
    "sub": "rita",
    "preferred_username": "Rita",
    "groups": ["recon-reviewers"],
    "exp": Clock().now + 60,
    "nbf": Clock().now - 60,
    "cnf": {"jkt": "x"},
}
# Each claim absent, plausible, or any JSON at all (NaN and infinities included: Python's JSON reads them).
ANSWERS = st.fixed_dictionaries(
    {}, optional={name: st.just(value) | JSON for name, value in PLAUSIBLE.items()}
) | st.dictionaries(st.text(max_size=8), JSON, max_size=4)
FUZZED = Provider(Clock())
FUZZED_INTROSPECTION = introspection_of(FUZZED.clock, FUZZED, oidc_introspection_cache_s=0)


@given(ANSWERS)
def test_any_answer_of_the_provider_is_a_caller_a_refusal_or_unavailable_never_another_error(
    answer: dict[str, Any],
) -> None:
    FUZZED.answers["fuzzed-token"] = answer
    try:
        principal, account = asyncio.run(FUZZED_INTROSPECTION.principal("fuzzed-token"))
    except (Refused, ProviderUnavailable):
        return
    assert answer["active"] is True and AUDIENCE in (
        answer["aud"] if isinstance(answer["aud"], list) else [answer["aud"]]
    )
    assert isinstance(account, str) and principal.role == "reviewer"
