"""A company sign-in between GET /auth/oidc/login and its callback, kept in the browser only.

State, nonce and the PKCE verifier travel in a short-lived cookie, encrypted and authenticated
(Fernet): starting a sign-in stores nothing on the server, so no number of anonymous starts can
fill a table and lock real users out (issue 38).
"""

import base64
import json
import secrets
from dataclasses import dataclass

from authlib.common.security import generate_token
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from api.settings import Settings


@dataclass(frozen=True, slots=True)
class PendingLogin:
    """A sign-in between GET /auth/oidc/login and its callback, kept in the browser's cookie only."""

    state: str
    nonce: str
    code_verifier: str


def new_login() -> PendingLogin:
    return PendingLogin(generate_token(43), generate_token(43), generate_token(64))


def login_sealer(settings: Settings) -> Fernet:
    """The key of the sign-in cookies: REVIEW_QUEUE_OIDC_LOGIN_KEY, else one derived (HKDF) from the
    client secret, which every worker and replica shares; a public client without a key gets one
    of its own per process (the settings refuse several workers then)."""
    if settings.oidc_login_key is not None:
        return Fernet(settings.oidc_login_key.get_secret_value().strip())
    if settings.oidc_client_secret is not None:
        derived = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"review-queue oidc login cookie"
        ).derive(settings.oidc_client_secret.get_secret_value().encode())
        return Fernet(base64.urlsafe_b64encode(derived))
    return Fernet(Fernet.generate_key())


def seal_login(sealer: Fernet, login: PendingLogin) -> str:
    """The cookie: state, nonce and verifier, encrypted and authenticated (Fernet), with its time."""
    return sealer.encrypt(json.dumps([login.state, login.nonce, login.code_verifier]).encode()).decode()


def open_login(sealer: Fernet, cookie: str | None, state: str, ttl_s: int) -> PendingLogin | None:
    """The sign-in the cookie holds, when this service sealed it less than ttl_s ago and it is the
    one the answer's state names; None otherwise (no cookie, forged, stale, or another sign-in's)."""
    if not cookie or len(cookie) > 1_000:
        return None
    try:
        values = json.loads(sealer.decrypt(cookie.encode(), ttl=ttl_s))
    except (InvalidToken, ValueError):
        return None
    login = PendingLogin(*values)
    # The state in the address must be the one sealed in this browser: a sign-in started in one
    # browser (an attacker's) cannot be finished in another (login CSRF).
    return login if secrets.compare_digest(login.state.encode(), state.encode()) else None
