"""What an OpenID provider's token says about the caller: their subject, their one role, and
whether the token's lifetime and checks hold (api/oidc.py fetches and verifies; this decides).
The rules are in api/oidc.py's docstring."""

from collections.abc import Mapping, Sequence
from typing import Any

from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
    UnsupportedAlgorithmError,
)

from api.setting_values import RoleMap
from db.tokens import check_subject


class Refused(Exception):
    """A sign-in or an API token refused: `code` for the desk's sentence, `detail` for logs and 401s."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _includes(role: str, other: str) -> bool:
    # As api.deps grants them: an admin may do everything, an approver everything a reviewer may.
    return role == other or role == "admin" or (role, other) == ("approver", "reviewer")


def role_of(groups: object, role_map: RoleMap) -> str:
    """The one role the groups map to (see the module's docstring), or Refused saying why."""
    if isinstance(groups, str):
        # One group, or several joined by some separator? Guessing could grant a role nobody gave.
        raise Refused("OIDC_NO_ROLE", "the groups claim is a string, not a list of group names")
    names = groups if isinstance(groups, list) else []
    roles = {role for group, role in role_map if group in names}
    if not roles:
        raise Refused("OIDC_NO_ROLE", "none of the account's groups is in REVIEW_QUEUE_OIDC_ROLE_MAP")
    widest = [role for role in roles if all(_includes(role, other) for other in roles)]
    if not widest:
        raise Refused(
            "OIDC_AMBIGUOUS_ROLE",
            f"the account's groups map to roles that do not include one another: {', '.join(sorted(roles))}",
        )
    return widest[0]


def subject_of(claims: Mapping[str, Any], names: Sequence[str]) -> str:
    """The first of these claims present, if it may name a reviewer as sent, then folded; else
    Refused. (Folding first would let `K` U+212A KELVIN SIGN pass as `k`, someone else's name.)"""
    value = next((claims[name] for name in names if claims.get(name) is not None), None)
    if not isinstance(value, str) or not value:
        raise Refused("OIDC_BAD_SUBJECT", f"the token has no {' or '.join(names)} claim to name the caller")
    try:
        return check_subject(value)
    except ValueError as error:
        raise Refused("OIDC_BAD_SUBJECT", str(error)) from None


def jose_reason(error: JoseError) -> str:
    if isinstance(error, ExpiredTokenError):
        return "it has expired"
    if isinstance(error, BadSignatureError):
        return "its signature does not verify"
    if isinstance(error, InvalidKeyIdError):
        return "it is signed with a key the provider does not publish"
    if isinstance(error, UnsupportedAlgorithmError):
        return "its signing algorithm is not accepted"
    if isinstance(error, MissingClaimError):
        return f"it has no {error.claim} claim"
    if isinstance(error, ClaimError):
        return {
            "aud": "it is not for this audience",
            "iss": "it is from another issuer",
            "nonce": "it answers another sign-in (nonce)",
            "nbf": "it is not valid yet",
            "iat": "it was issued in the future",
        }.get(error.claim, f"its {error.claim} claim is wrong")
    return "it is not a valid JWT"


def check_lifetime(claims: Mapping[str, Any], longest_s: int, code: str) -> None:
    """Refused when the token claims to live longer than longest_s (exp - iat). joserfc has checked
    that both are finite numbers and iat is not in the future, so exp is at most that far ahead."""
    exp, iat = claims.get("exp"), claims.get("iat")
    if exp is None or iat is None:
        raise Refused(code, f"it has no {'exp' if exp is None else 'iat'} claim")
    if exp - iat > longest_s:
        raise Refused(
            code,
            f"it claims to live {exp - iat:.3g} s, longer than REVIEW_QUEUE_OIDC_MAX_TOKEN_LIFETIME_S"
            f" ({longest_s} s)",
        )
