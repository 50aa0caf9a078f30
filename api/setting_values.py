"""The values of settings that are more than a number or a word: SLA tiers, the OIDC role map and
API clients, and web origins, each parsed with a sentence saying what is wrong (api/settings.py)."""

import re
from decimal import Decimal
from urllib.parse import urlsplit

from db.tokens import check_subject
from db.vocabulary import ROLES

# One tier: "AMOUNT:DURATION", DURATION in hours (24h) or days (3d).
_TIER = re.compile(r"^\s*([0-9]{1,16}(?:\.[0-9]{1,2})?)\s*:\s*([1-9][0-9]{0,5})\s*([hd])\s*$")
SlaTiers = tuple[tuple[Decimal, int], ...]  # (at least this abs(amount), hours), largest amount first
ApiClients = tuple[tuple[str, str], ...]  # (the provider's client id, the subject it acts as)


def parse_sla_tiers(value: str) -> SlaTiers:
    """REVIEW_QUEUE_SLA_TIERS: comma-separated AMOUNT:DURATION tiers, one of them at amount 0."""
    tiers: dict[Decimal, int] = {}
    for part in value.split(","):
        found = _TIER.match(part)
        if found is None:
            raise ValueError(
                f"tier {part.strip()!r} is not AMOUNT:DURATION (an amount with at most two decimals,"
                " a colon, then hours like 24h or days like 3d)"
            )
        floor = Decimal(found[1])
        if floor in tiers:
            raise ValueError(f"amount {floor} appears twice")
        hours = int(found[2]) * (24 if found[3] == "d" else 1)
        if hours > 24 * 3660:
            raise ValueError(f"{found[2]}{found[3]} is more than ten years")
        tiers[floor] = hours
    if Decimal(0) not in tiers:
        raise ValueError("needs a tier at amount 0, so that every amount has a deadline (e.g. 0:168h)")
    return tuple(sorted(tiers.items(), reverse=True))


RoleMap = tuple[tuple[str, str], ...]  # (the provider's group, the service's role), in the given order


def parse_role_map(value: str) -> RoleMap:
    """REVIEW_QUEUE_OIDC_ROLE_MAP: comma-separated GROUP=ROLE pairs, ROLE one of the service's roles."""
    pairs: dict[str, str] = {}
    for part in value.split(","):
        group, sign, role = (piece.strip() for piece in part.partition("="))
        if not sign or not group:
            raise ValueError(f"{part.strip()!r} is not GROUP=ROLE (e.g. recon-reviewers=reviewer)")
        if role not in ROLES:
            raise ValueError(
                f"{role!r} (for group {group!r}) is not a role; the roles are {', '.join(ROLES)}"
            )
        if group in pairs:
            raise ValueError(f"group {group!r} appears twice")
        pairs[group] = role
    return tuple(pairs.items())


def parse_api_clients(value: str) -> ApiClients:
    """REVIEW_QUEUE_OIDC_API_CLIENTS: comma-separated CLIENT_ID=SUBJECT pairs, SUBJECT obeying the
    rule of a token's subject (stored folded, as a token's is)."""
    pairs: dict[str, str] = {}
    for part in filter(None, (piece.strip() for piece in value.split(","))):
        client, sign, subject = (piece.strip() for piece in part.partition("="))
        if not sign or not client:
            raise ValueError(f"{part!r} is not CLIENT_ID=SUBJECT (e.g. recon-loader=recon-loader)")
        if client in pairs:
            raise ValueError(f"client {client!r} appears twice")
        pairs[client] = check_subject(subject)
    return tuple(pairs.items())


def loopback(host: str | None) -> bool:
    return host in ("localhost", "127.0.0.1", "::1")


def web_origin(value: str, name: str, *, path_allowed: bool) -> str:
    """An https URL (http only on this machine's loopback), without query, fragment or credentials."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"{name} must be an https:// URL, not {value!r}")
    if parts.scheme == "http" and not loopback(parts.hostname):
        raise ValueError(f"{name} must use https (plain http only for localhost), not {value!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{name} must have no query, fragment or credentials: {value!r}")
    if parts.path.strip("/") and not path_allowed:
        raise ValueError(f"{name} must have no path: {value!r}")
    return value.rstrip("/")
