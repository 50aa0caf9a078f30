"""A real OpenID Connect provider for the tests: panva's oidc-provider (OpenID Certified) under Node,
pinned by tests/oidc/package.json and package-lock.json (`npm ci` there; .ci/run does it).

The provider runs at http://localhost:PORT while the service runs at 127.0.0.1 (or a TestClient's
https://review.test): two different sites, as in production, so a cookie that only works same-site
would fail here too. Its users are USERS (any password), in groups; desk clients are registered per
test through the provider's registration endpoint (RFC 7591) with that test's redirect URI; the
client-credentials clients (scripts) are static, so their ids (the API subject) are known.

Without Node or the installed package the tests that need the provider are skipped with the reason,
unless REVIEW_QUEUE_REQUIRE_OIDC=1 (set by .ci/run), where that is a failure.
"""

import base64
import hashlib
import html
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

OIDC_DIR = Path(__file__).resolve().parents[1] / "oidc"  # tests/oidc
API_AUDIENCE = "https://review-queue.test/api"
OTHER_AUDIENCE = "https://another-service.test/api"
ROLE_MAP = (
    "recon-reviewers=reviewer,recon-approvers=approver,recon-audit=auditor,recon-admins=admin,"
    "recon-ingest=ingest"
)
SCOPES = "openid profile email groups"  # groups: a scope of this provider, as in many real ones
PROVIDER_NAME = "Test IdP"
# login -> claims. The login name is the provider's `sub`; preferred_username is the reviewer.
USERS: dict[str, dict[str, Any]] = {
    "rita": {"preferred_username": "Rita.Reviewer", "groups": ["staff", "recon-reviewers"]},
    "april": {"preferred_username": "April", "groups": ["recon-reviewers", "recon-approvers"]},
    "ada": {"groups": ["recon-admins"]},
    "nora": {"groups": ["staff"]},  # in no mapped group
    "max": {"groups": ["recon-reviewers", "recon-audit"]},  # roles that do not include one another
    "me": {"preferred_username": "me", "groups": ["recon-reviewers"]},  # a reserved subject
    "kasey": {"preferred_username": "Kasey", "groups": ["recon-reviewers"]},
    # Kasey with U+212A KELVIN SIGN, which str.lower() folds to "k": another person, not kasey.
    "kelvin": {"preferred_username": "\u212aasey", "groups": ["recon-approvers"]},
    # Another account whose username folds to rita's: the name stays with the account that had it.
    "impostor": {"preferred_username": "RITA.reviewer", "groups": ["recon-approvers"]},
}
SCRIPT_SECRET = "script-secret-" + "s" * 32
# Scripts (client credentials): their client id is the API subject.
SCRIPTS: dict[str, dict[str, Any]] = {
    "recon-script": {"test_groups": ["recon-reviewers"]},
    "recon-loader": {"test_groups": ["recon-ingest"]},
    "recon-nobody": {"test_groups": ["staff"]},
    "recon-brief": {"test_groups": ["recon-reviewers"], "test_ttl_s": 3},
    # Their access tokens for the API are opaque: the service asks the provider (RFC 7662).
    "recon-opaque": {"test_groups": ["recon-approvers"], "test_opaque": True},
    "recon-opaque-brief": {"test_groups": ["recon-reviewers"], "test_opaque": True, "test_ttl_s": 3},
}


def node_or_skip() -> str:
    """Node and the installed package, or a skip (a failure under REVIEW_QUEUE_REQUIRE_OIDC)."""
    node = shutil.which("node")
    major = (
        int(subprocess.run([node, "--version"], capture_output=True, text=True).stdout[1:].split(".")[0])
        if node
        else 0
    )
    missing = (
        "Node is not installed (apt-get install nodejs npm)"
        if node is None
        else f"Node {major} is too old for oidc-provider 9 (20 or later)"
        if major < 20
        else "oidc-provider is not installed (cd tests/oidc && npm ci)"
        if not (OIDC_DIR / "node_modules" / "oidc-provider").is_dir()
        else None
    )
    if missing is not None:
        if os.environ.get("REVIEW_QUEUE_REQUIRE_OIDC"):
            pytest.fail(f"REVIEW_QUEUE_REQUIRE_OIDC is set but {missing}")
        pytest.skip(f"{missing}; .ci/run installs it")
    assert node is not None
    return node


@dataclass(frozen=True)
class Client:
    client_id: str
    client_secret: str


class RealProvider:
    """One running oidc-provider process, and what a test does with it."""

    def __init__(self, *, conform_id_token_claims: bool = True) -> None:
        from tests.support.servers import STARTUP_S, free_port

        node = node_or_skip()
        self.port = free_port()
        self.issuer = f"http://localhost:{self.port}"
        self._registration_token = secrets.token_urlsafe(24)
        # The provider's signing key, known to the tests too: sign() makes tokens "it" issued with
        # claims no real configuration would give (an exp of 1e300, an ID token for two audiences).
        self.signing_key = RSAKey.generate_key(
            2048, parameters={"kid": "test-signing-key", "use": "sig", "alg": "RS256"}, private=True
        )
        config = {
            "jwks": {"keys": [self.signing_key.as_dict(private=True)]},
            "port": self.port,
            "issuer": self.issuer,
            "initial_access_token": self._registration_token,
            "users": USERS,
            "resources": [API_AUDIENCE, OTHER_AUDIENCE],
            "conform_id_token_claims": conform_id_token_claims,
            "clients": [
                {
                    "client_id": client_id,
                    "client_secret": SCRIPT_SECRET,
                    "grant_types": ["client_credentials"],
                    "response_types": [],
                    "redirect_uris": [],
                    **extra,
                }
                for client_id, extra in SCRIPTS.items()
            ],
        }
        # Its output goes to a file: a pipe nobody reads could fill and stall it.
        self.log = Path(tempfile.mkstemp(prefix="rq-oidc-provider-", suffix=".log")[1])
        with self.log.open("w") as output:
            self.process = subprocess.Popen(
                [node, str(OIDC_DIR / "provider.mjs")],
                cwd=OIDC_DIR,
                env={**os.environ, "OIDC_TEST_CONFIG": json.dumps(config)},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("oidc-provider did not come up")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    # --- clients --------------------------------------------------------------------------------

    def register_desk(
        self, public_url: str, *, id_token_ttl_s: int | None = None, opaque: bool = False
    ) -> Client:
        """A confidential web client for a service at public_url (PKCE is required for every client);
        opaque: its access tokens for the API are opaque, not JWTs."""
        metadata: dict[str, Any] = {
            "redirect_uris": [f"{public_url}/auth/oidc/callback"],
            "post_logout_redirect_uris": [f"{public_url}/desk/"],
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "client_secret_basic",
        }
        if id_token_ttl_s is not None:
            metadata["test_ttl_s"] = id_token_ttl_s
        if opaque:
            metadata["test_opaque"] = True
        response = httpx.post(
            f"{self.issuer}/reg",
            json=metadata,
            headers={"Authorization": f"Bearer {self._registration_token}"},
        )
        assert response.status_code == 201, response.text
        body = response.json()
        return Client(body["client_id"], body["client_secret"])

    def service_settings(self, public_url: str, client: Client | None, **overrides: Any) -> dict[str, Any]:
        """The service's settings (Settings field names) for this provider and a desk client."""
        values: dict[str, Any] = {
            "oidc_issuer": self.issuer,
            "oidc_role_map": ROLE_MAP,
            "oidc_scopes": SCOPES,
            "oidc_api_audience": API_AUDIENCE,
            "oidc_provider_name": PROVIDER_NAME,
            "public_url": public_url,
            # The scripts act as themselves (their tokens name no person).
            "oidc_api_clients": ",".join(f"{name}={name}" for name in SCRIPTS),
        }
        if client is not None:
            values["oidc_client_id"] = client.client_id
            values["oidc_client_secret"] = client.client_secret
        values.update(overrides)
        return values

    @staticmethod
    def environment(settings: dict[str, Any]) -> dict[str, str]:
        """service_settings as `review-queue serve` reads them."""
        names = {"public_url": "REVIEW_QUEUE_PUBLIC_URL"}
        return {names.get(k, "REVIEW_QUEUE_" + k.upper()): str(v) for k, v in settings.items()}

    def script_token(self, client_id: str, *, resource: str = API_AUDIENCE) -> str:
        """A client-credentials access token (a JWT for `resource`) from the provider."""
        response = httpx.post(
            f"{self.issuer}/token",
            data={"grant_type": "client_credentials", "resource": resource},
            auth=(client_id, SCRIPT_SECRET),
        )
        assert response.status_code == 200, response.text
        token: str = response.json()["access_token"]
        return token

    def revoke(self, client_id: str, token: str) -> None:
        """The client revokes its access token at the provider (RFC 7009)."""
        response = httpx.post(
            f"{self.issuer}/token/revocation",
            data={"token": token, "token_type_hint": "access_token"},
            auth=(client_id, SCRIPT_SECRET),
        )
        assert response.status_code == 200, response.text

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        """A JWT signed with the provider's own key (so the service's checks of the signature pass)."""
        now = int(time.time())
        claims = {"iss": self.issuer, "iat": now, "exp": now + 300, **claims}
        token: str = jwt.encode(
            {
                k: v
                for k, v in {"alg": "RS256", "kid": self.signing_key.kid, **header}.items()
                if v is not None
            },
            {k: v for k, v in claims.items() if v is not None},
            self.signing_key,
        )
        return token

    def answer_next_code_with(self, id_token: str) -> None:
        """The token endpoint's next answer carries this ID token instead of the one it made."""
        response = httpx.post(f"{self.issuer}/_test/next_id_token", json={"id_token": id_token})
        assert response.status_code == 204, response.text

    def requests(self) -> dict[str, int]:
        """Requests the provider has answered, by path, since it started."""
        counts: dict[str, int] = httpx.get(f"{self.issuer}/_test/requests").json()
        return counts

    # --- a person at the provider's own pages -------------------------------------------------------

    def sign_in(
        self, browser: httpx.Client, authorization_url: str, login: str, *, cancel: bool = False
    ) -> str:
        """Go through the provider's login and consent pages as `login` (any password), as a person
        would, in `browser` (its cookie jar is the provider's session); the URL the provider sends the
        browser back to (the redirect URI with code or error), not followed. cancel: press the
        login page's Cancel link instead."""
        url = authorization_url
        for _ in range(20):
            response = browser.get(url)
            if response.is_redirect:
                url = urljoin(url, response.headers["location"])
                if not url.startswith(self.issuer):
                    return url
                continue
            assert response.status_code == 200, response.text
            page = response.text
            if cancel:
                (abort,) = re.findall(r'href="([^"]*/abort)"', page)
                url = urljoin(url, html.unescape(abort))
                cancel = False
                continue
            action = html.unescape(re.findall(r'<form[^>]*action="([^"]+)"', page)[0])
            fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
            if 'name="login"' in page:
                fields.update(login=login, password="any password")
            if 'name="logout"' in page:  # the provider's sign-out page: "Yes, sign me out"
                fields["logout"] = "yes"
            posted = browser.post(urljoin(url, action), data=fields)
            assert posted.is_redirect, posted.text
            url = urljoin(url, posted.headers["location"])
            if not url.startswith(self.issuer):
                return url
        raise AssertionError("the provider's pages did not send the browser back")

    def code_flow(
        self,
        browser: httpx.Client,
        client: Client,
        redirect_uri: str,
        login: str,
        *,
        resource: str | None = None,
    ) -> dict[str, Any]:
        """A whole authorization code flow done by the test itself as `client` (its own state,
        nonce and PKCE): the token endpoint's answer, with `nonce` added. For checking the service's
        validation of ID tokens with real ones; with `resource`, the access token is for it (RFC 8707)."""
        for_resource = {"resource": resource} if resource is not None else {}
        verifier, nonce, state = (secrets.token_urlsafe(48) for _ in range(3))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = urlencode(
            {
                "response_type": "code",
                "client_id": client.client_id,
                "redirect_uri": redirect_uri,
                "scope": SCOPES,
                "state": state,
                "nonce": nonce,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
                **for_resource,
            }
        )
        back = parse_qs(urlsplit(self.sign_in(browser, f"{self.issuer}/auth?{query}", login)).query)
        assert back["state"] == [state], back
        response = httpx.post(
            f"{self.issuer}/token",
            data={
                "grant_type": "authorization_code",
                "code": back["code"][0],
                "redirect_uri": redirect_uri,
                "code_verifier": verifier,
                **for_resource,
            },
            auth=(client.client_id, client.client_secret),
        )
        assert response.status_code == 200, response.text
        return {**response.json(), "nonce": nonce}


@contextmanager
def real_provider(**options: Any) -> Iterator[RealProvider]:
    provider = RealProvider(**options)
    try:
        yield provider
    finally:
        provider.stop()
