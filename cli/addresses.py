"""Which addresses a webhook may be sent to: the SSRF guard's classifier, with no connection made.

Explicit tables, not `ipaddress.is_global` and friends: those change between Python versions, and
3.11 calls 192.0.0.0/24, 192.88.99.0/24, `::/96`, `2002::/16`, `64:ff9b::/96` and `fec0::/10` global.
Every range of the IANA IPv4 and IPv6 Special-Purpose Address Registries (as of 2025-12) is
refused, the globally reachable ones too (AS112, AMT, PCP and TURN anycast: no receiver lives
there), and so is multicast, and IPv6 outside global unicast `2000::/3`. An IPv6 address that
carries an IPv4 one is judged by that IPv4 address as well: IPv4-mapped (`::ffff:0:0/96`, which a
dual-stack socket sends to the IPv4 address) and the NAT64 well-known prefix (`64:ff9b::/96`, which
DNS64 answers with for a public IPv4 host) are allowed when the IPv4 address inside is; the
deprecated IPv4-compatible (`::/96`) and 6to4 (`2002::/16`) forms are refused whatever they carry.
"""

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# IANA IPv4 Special-Purpose Address Registry, then multicast (RFC 5771), which it leaves out.
IPV4_SPECIAL: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation"),
    ("192.31.196.0/24", "AS112"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("192.175.48.0/24", "AS112 direct delegation"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
)

# IANA IPv6 Special-Purpose Address Registry, and what else lies outside global unicast that
# deserves a name of its own in an error message.
IPV6_SPECIAL: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::/96", "IPv4-compatible"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy prefix"),
    ("2001::/23", "IETF protocol assignment"),  # holds TEREDO, PCP/TURN/DNS-SD anycast, benchmarking,
    ("2001:db8::/32", "documentation"),  # AMT, AS112, ORCHIDv2 and DRIP below it
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "AS112 direct delegation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing (SRv6) SID"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

_V4 = tuple((ipaddress.IPv4Network(net), kind) for net, kind in IPV4_SPECIAL)
# No two of these overlap but ::/96, which holds ::/128 and ::1/128: those come first.
_V6 = tuple((ipaddress.IPv6Network(net), kind) for net, kind in IPV6_SPECIAL)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
# The forms that carry an IPv4 address; the first two are judged by it, the last two refused.
_CARRIERS = ("IPv4-mapped", "NAT64", "IPv4-compatible", "6to4")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside a mapped (::ffff:a.b.c.d), compatible (::a.b.c.d), NAT64
    (64:ff9b::a.b.c.d) or 6to4 (2002:aabb:ccdd::) address, read from the bytes themselves."""
    packed = address.packed
    if packed[:10] == bytes(10) and packed[10:12] in (b"\xff\xff", b"\0\0"):
        return ipaddress.IPv4Address(packed[12:])
    if address in _NAT64:
        return ipaddress.IPv4Address(packed[12:])
    if address in _SIX_TO_FOUR:
        return ipaddress.IPv4Address(packed[2:6])
    return None


def _special_v4(address: ipaddress.IPv4Address) -> str | None:
    return next((kind for net, kind in _V4 if address in net), None)


def why_not(address: Address) -> str | None:
    """Why no webhook may go to `address` (a special-purpose range), or None for a public one."""
    if isinstance(address, ipaddress.IPv4Address):
        return _special_v4(address)
    kind = next((kind for net, kind in _V6 if address in net), None)
    if kind in _CARRIERS:
        inside = embedded_ipv4(address)
        assert inside is not None  # every carrier form has one
        why_inside = _special_v4(inside)
        if why_inside is not None:
            return f"{kind} form of {inside}: {why_inside}"
        return None if kind in _CARRIERS[:2] else kind
    if kind is not None:
        return kind
    return None if address in GLOBAL_UNICAST else "not global unicast"
