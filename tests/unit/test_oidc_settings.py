"""The OIDC settings: a configuration that cannot work stops start-up with a message naming the
variables, before anything listens (docs/security.md, "Sign-in with OpenID Connect")."""

import pytest

from api.setting_values import parse_role_map
from api.settings import load_settings
from tests.support import OIDC_ENV


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"REVIEW_QUEUE_OIDC_ISSUER": None},
            "REVIEW_QUEUE_OIDC_CLIENT_ID, REVIEW_QUEUE_OIDC_ROLE_MAP set, but",
        ),
        (
            {"REVIEW_QUEUE_OIDC_ISSUER": "http://sso.example.com"},
            "must use https (plain http only for localhost)",
        ),
        ({"REVIEW_QUEUE_OIDC_ISSUER": "sso.example.com"}, "REVIEW_QUEUE_OIDC_ISSUER must be an https:// URL"),
        ({"REVIEW_QUEUE_OIDC_ROLE_MAP": None}, "REVIEW_QUEUE_OIDC_ROLE_MAP is required"),
        (
            {"REVIEW_QUEUE_OIDC_ROLE_MAP": "recon-reviewers=boss"},
            "'boss' (for group 'recon-reviewers') is not a role",
        ),
        ({"REVIEW_QUEUE_OIDC_ROLE_MAP": "recon-reviewers"}, "is not GROUP=ROLE"),
        ({"REVIEW_QUEUE_OIDC_ROLE_MAP": "a=reviewer,a=admin"}, "group 'a' appears twice"),
        (
            {"REVIEW_QUEUE_PUBLIC_URL": None},
            "REVIEW_QUEUE_PUBLIC_URL is required with REVIEW_QUEUE_OIDC_CLIENT_ID",
        ),
        (
            {"REVIEW_QUEUE_PUBLIC_URL": "https://review.example.com/desk"},
            "REVIEW_QUEUE_PUBLIC_URL must have no path",
        ),
        ({"REVIEW_QUEUE_OIDC_SCOPES": "profile email"}, "REVIEW_QUEUE_OIDC_SCOPES must include openid"),
        ({"REVIEW_QUEUE_OIDC_CLIENT_ID": None}, "needs REVIEW_QUEUE_OIDC_CLIENT_ID (the desk's sign-in)"),
        ({"REVIEW_QUEUE_OIDC_API_AUDIENCE": "review-queue"}, "must differ from REVIEW_QUEUE_OIDC_CLIENT_ID"),
        ({"REVIEW_QUEUE_OIDC_CLOCK_SKEW_S": "900"}, "(allowed range 0-300)"),
        ({"REVIEW_QUEUE_OIDC_MAX_TOKEN_LIFETIME_S": "0"}, "(allowed range 60-604800)"),
        ({"REVIEW_QUEUE_OIDC_LOGIN_KEY": "not-a-key"}, "must be a Fernet key"),
        ({"REVIEW_QUEUE_WORKERS": "2"}, "REVIEW_QUEUE_OIDC_LOGIN_KEY is required for a public client"),
        ({"REVIEW_QUEUE_OIDC_API_CLIENTS": "recon-loader"}, "is not CLIENT_ID=SUBJECT"),
        ({"REVIEW_QUEUE_OIDC_API_CLIENTS": "recon-loader=me"}, "is reserved"),
        ({"REVIEW_QUEUE_OIDC_API_CLIENTS": "a=x,a=y"}, "client 'a' appears twice"),
        ({"REVIEW_QUEUE_OIDC_INTROSPECTION": "1"}, "REVIEW_QUEUE_OIDC_INTROSPECTION=1 needs"),
        (
            {
                "REVIEW_QUEUE_OIDC_INTROSPECTION": "1",
                "REVIEW_QUEUE_OIDC_API_AUDIENCE": "https://review.example.com/api",
            },
            "REVIEW_QUEUE_OIDC_CLIENT_SECRET (the client that asks",
        ),
        (
            {
                "REVIEW_QUEUE_OIDC_INTROSPECTION": "1",
                "REVIEW_QUEUE_OIDC_API_AUDIENCE": "https://review.example.com/api",
                "REVIEW_QUEUE_OIDC_CLIENT_ID": None,
                "REVIEW_QUEUE_OIDC_CLIENT_SECRET": "s" * 32,
            },
            "REVIEW_QUEUE_OIDC_INTROSPECTION=1 needs",
        ),
        ({"REVIEW_QUEUE_OIDC_INTROSPECTION": "maybe"}, "REVIEW_QUEUE_OIDC_INTROSPECTION"),
        ({"REVIEW_QUEUE_OIDC_INTROSPECTION_CACHE_S": "61"}, "(allowed range 0-60)"),
    ],
)
def test_a_configuration_that_cannot_work_stops_with_a_message(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, str | None], says: str
) -> None:
    for name, value in {**OIDC_ENV, **change}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert says in str(stopped.value), stopped.value


def test_a_good_configuration_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OIDC_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REVIEW_QUEUE_PUBLIC_URL", "https://review.example.com/")
    settings = load_settings()
    assert settings.oidc_role_map == (("recon-reviewers", "reviewer"), ("recon-admins", "admin"))
    assert settings.public_url == "https://review.example.com"
    assert settings.oidc_display_name == "sso.example.com"  # REVIEW_QUEUE_OIDC_PROVIDER_NAME unset
    assert settings.oidc_login_enabled
    monkeypatch.setenv("REVIEW_QUEUE_OIDC_API_CLIENTS", "recon-loader=Recon.Loader, 0a1b-guid=nightly")
    assert load_settings().oidc_api_clients == (("recon-loader", "recon.loader"), ("0a1b-guid", "nightly"))
    assert (settings.oidc_introspection, settings.oidc_introspection_cache_s) == (None, 60)  # auto, 60 s
    monkeypatch.setenv("REVIEW_QUEUE_OIDC_INTROSPECTION", "0")
    assert load_settings().oidc_introspection is False
    for name, value in {
        "REVIEW_QUEUE_OIDC_INTROSPECTION": "1",
        "REVIEW_QUEUE_OIDC_API_AUDIENCE": "https://review.example.com/api",
        "REVIEW_QUEUE_OIDC_CLIENT_SECRET": "s" * 32,
        "REVIEW_QUEUE_OIDC_INTROSPECTION_CACHE_S": "0",
    }.items():
        monkeypatch.setenv(name, value)
    assert (load_settings().oidc_introspection, load_settings().oidc_introspection_cache_s) == (True, 0)


def test_the_role_map_accepts_every_role_the_service_defines() -> None:
    from db.vocabulary import ROLES

    assert parse_role_map(",".join(f"g-{role}={role}" for role in ROLES)) == tuple(
        (f"g-{r}", r) for r in ROLES
    )
