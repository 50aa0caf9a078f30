"""Webhook secrets: made, encrypted at rest with Fernet, and read back only by the deliverer.

The Standard Webhooks signature is an HMAC keyed with the secret itself, so the secret cannot be
stored hashed like the API tokens: it is encrypted with `REVIEW_QUEUE_WEBHOOK_KEY` (cryptography's
Fernet: AES-128-CBC and HMAC-SHA256, authenticated), a key that never enters the database.
Several comma-separated keys rotate it: the first encrypts, any of them decrypts
(docs/security.md). On the embedded database a development key is kept under the data directory,
as the development tokens are.
"""

import base64
import secrets
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from api.settings import Settings

PREFIX = "whsec_"
SECRET_BYTES = 32
DEV_KEY_FILE = "webhook-key"

__all__ = ["InvalidToken", "decrypt", "encrypt", "generate", "keys"]


def generate() -> str:
    """A new secret as Standard Webhooks writes them: `whsec_` and 32 random bytes in base64."""
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _dev_key(data_dir: Path) -> str:
    path = data_dir / DEV_KEY_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        key = Fernet.generate_key().decode()
        path.write_text(key)
        return key


def keys(settings: Settings) -> str | None:
    """REVIEW_QUEUE_WEBHOOK_KEY; on the embedded database (no DATABASE_URL) the development key
    kept in the data directory; otherwise None: webhooks cannot be configured."""
    if settings.webhook_key:
        return settings.webhook_key
    return _dev_key(settings.data_dir) if settings.database_url is None else None


def _fernet(key_list: str) -> MultiFernet:
    return MultiFernet([Fernet(k.strip()) for k in key_list.split(",")])


def encrypt(key_list: str, secret: str) -> bytes:
    return _fernet(key_list).encrypt(secret.encode())


def decrypt(key_list: str, token: bytes) -> str:
    """The secret; InvalidToken when none of the keys made it (the key was changed, not rotated)."""
    return _fernet(key_list).decrypt(token).decode()
