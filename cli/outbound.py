"""One webhook request: where it may go (the SSRF guard), how it is signed, and what came back.

The receiver's host is resolved at each delivery and every address it resolves to is checked:
private, loopback, link-local and every other non-global range are refused unless
REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS names the host or covers the address. The request then goes to
the checked address itself (the URL carries the address; `Host` and TLS SNI and certificate
verification the name), so a second resolution cannot swap in another address (DNS rebinding).
Redirects are never followed (a 3xx is a failed delivery), connections are never reused (one
established for one name must not carry a request for another), and the whole request, connect
to last byte, gets REVIEW_QUEUE_WEBHOOK_TIMEOUT_S.
"""

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from standardwebhooks import Webhook

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
USER_AGENT = "review-queue-webhooks/1"


class Refused(Exception):
    """The target may not be contacted (the SSRF guard), or cannot be resolved."""


async def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to now."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise Refused(f"cannot resolve {host}: {error.strerror}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _why_not(address: Address) -> str | None:
    """Why an address is no receiver's, or None for a public one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for kind, matches in (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("private", address.is_private),
        ("multicast", address.is_multicast),
        ("unspecified", address.is_unspecified),
        ("reserved", address.is_reserved),
    ):
        if matches:
            return kind
    return None if address.is_global else "not global"


def allowed(allow: Sequence[str], host: str, address: Address) -> bool:
    """REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS: the host's name, or a network holding the address."""
    for entry in allow:
        if entry == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


@dataclass(frozen=True, slots=True)
class Target:
    url: httpx.URL  # with the checked address in place of the name
    host: str  # the Host header
    extensions: dict[str, Any]  # sni_hostname for https


async def pinned(url: str, allow: Sequence[str], *, resolver: Resolver = resolve) -> Target:
    """The request's target, pinned to an address checked now; Refused when any address the host
    resolves to is not allowed."""
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in await resolver(host, port)]
    if not addresses:
        raise Refused(f"{host} resolves to no address")
    for address in addresses:
        why = _why_not(address)
        if why is not None and not allowed(allow, host, address):
            raise Refused(
                f"{host} resolves to {address}, a {why} address"
                " (allow it with REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS)"
            )
    chosen = str(addresses[0])
    host_header = host if parsed.port is None else f"{host}:{parsed.port}"
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return Target(parsed.copy_with(host=chosen), host_header, extensions)


@dataclass(frozen=True, slots=True)
class Sent:
    outcome: str  # delivered, http_error, gone, timeout, unreachable, refused
    status_code: int | None
    latency_ms: float
    error: str | None

    @property
    def ok(self) -> bool:
        return self.outcome == "delivered"


def client() -> httpx.AsyncClient:
    """The deliverer's HTTP client: no redirects, no proxies from the environment, no keep-alive."""
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
        headers={"user-agent": USER_AGENT},
    )


async def send(
    http: httpx.AsyncClient,
    url: str,
    *,
    webhook_id: str,
    timestamp: datetime,
    body: bytes,
    signer: Webhook,
    timeout_s: float,
    allow: Sequence[str],
    resolver: Resolver = resolve,
) -> Sent:
    """POST one signed webhook (Standard Webhooks headers); what came back, never an exception."""
    started = time.perf_counter()

    def sent(outcome: str, status: int | None, error: str | None) -> Sent:
        return Sent(outcome, status, round((time.perf_counter() - started) * 1000, 2), error)

    try:
        async with asyncio.timeout(timeout_s):
            target = await pinned(url, allow, resolver=resolver)
            headers = {
                "host": target.host,
                "content-type": "application/json",
                "webhook-id": webhook_id,
                "webhook-timestamp": str(int(timestamp.timestamp())),
                "webhook-signature": signer.sign(webhook_id, timestamp, body),
            }
            response = await http.post(
                target.url, content=body, headers=headers, extensions=target.extensions
            )
    except Refused as error:
        return sent("refused", None, f"refused: {error}")
    except TimeoutError:
        return sent("timeout", None, f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as error:
        return sent("unreachable", None, f"{type(error).__name__}: {error}"[:500])
    status = response.status_code
    if 200 <= status < 300:
        return sent("delivered", status, None)
    if status == 410:
        return sent("gone", status, "the receiver answered 410 Gone: subscription disabled")
    where = f" to {response.headers.get('location', '?')[:200]} (not followed)" if 300 <= status < 400 else ""
    return sent("http_error", status, f"HTTP {status}{where}")
