"""One webhook request: where it may go (the SSRF guard), how it is signed, and what came back.

The receiver's host is resolved at each delivery and every address it resolves to is checked
(cli/addresses.py): each special-purpose range (private, loopback, link-local, shared, reserved,
documentation, ...) is refused unless REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS names the host or covers
the address. The request then goes to
the checked address itself (the URL carries the address; `Host` and TLS SNI and certificate
verification the name), so a second resolution cannot swap in another address (DNS rebinding).
Redirects are never followed (a 3xx is a failed delivery), connections are never reused (one
established for one name must not carry a request for another), and the whole request, connect
to last byte, gets REVIEW_QUEUE_WEBHOOK_TIMEOUT_S. The answer is streamed and at most
ANSWER_READ_BYTES of its body read, undecoded: only the status matters, and a receiver must not be
able to make the deliverer (and `serve`, which runs it beside the API) hold a body of any size.
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

from cli import addresses

Address = addresses.Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
USER_AGENT = "review-queue-webhooks/1"
ANSWER_READ_BYTES = 4096  # of the receiver's body; the connection is closed after (no keep-alive)


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
    resolved = [ipaddress.ip_address(a.split("%", 1)[0]) for a in await resolver(host, port)]
    if not resolved:
        raise Refused(f"{host} resolves to no address")
    for address in resolved:
        why = addresses.why_not(address)
        if why is not None and not allowed(allow, host, address):
            raise Refused(
                f"{host} resolves to {address} ({why}; allow it with REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS)"
            )
    chosen = str(resolved[0])
    host_header = host if parsed.port is None else f"{host}:{parsed.port}"
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return Target(parsed.copy_with(host=chosen), host_header, extensions)


async def _glance(response: httpx.Response) -> int:
    """Read at most ANSWER_READ_BYTES of the body, raw (a gzip bomb stays compressed): how many."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read >= ANSWER_READ_BYTES:
            break
    return read


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
            async with http.stream(
                "POST", target.url, content=body, headers=headers, extensions=target.extensions
            ) as response:
                await _glance(response)
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
