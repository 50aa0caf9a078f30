"""The SSRF guard's classifier (cli/addresses.py) and the check of every resolved address
(cli/outbound.pinned), tested directly: no connection to any address, a fake resolver.

The addresses below are written out by hand from the IANA IPv4 and IPv6 Special-Purpose Address
Registries, not read from the classifier's tables, so a range dropped from a table fails here."""

import ipaddress

import pytest

from cli import outbound
from cli.addresses import embedded_ipv4, why_not

pytestmark = pytest.mark.anyio

# One address at each end of every range (where the range has two ends worth naming).
REFUSED = (
    "0.0.0.0", "0.255.255.255",  # this network
    "10.0.0.1", "10.255.255.255",
    "100.64.0.0", "100.127.255.255",  # shared address space (carrier-grade NAT)
    "127.0.0.1", "127.255.255.254",
    "169.254.0.1", "169.254.169.254",  # link-local, the cloud metadata address among them
    "172.16.0.1", "172.31.255.255",
    "192.0.0.0", "192.0.0.8", "192.0.0.9", "192.0.0.170", "192.0.0.255",  # IETF protocol assignments
    "192.0.2.1", "198.51.100.7", "203.0.113.255",  # documentation
    "192.31.196.1", "192.175.48.1",  # AS112
    "192.52.193.1",  # AMT
    "192.88.99.1",  # 6to4 relay anycast
    "192.168.0.1", "192.168.255.255",
    "198.18.0.0", "198.19.255.255",  # benchmarking
    "224.0.0.1", "239.255.255.255",  # multicast
    "240.0.0.1", "255.255.255.254", "255.255.255.255",  # reserved, broadcast
    "::", "::1",
    "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:192.0.0.8", "::ffff:100.64.0.1",  # mapped
    "::127.0.0.1", "::8.8.8.8",  # IPv4-compatible (deprecated): refused whatever it carries
    "64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::192.0.0.8",  # NAT64 of special IPv4
    "64:ff9b:1::1", "64:ff9b:1:ffff::1",  # local-use NAT64
    "100::1", "100:0:0:1::1",  # discard-only, dummy prefix
    "2001::1", "2001:1::1", "2001:1::2", "2001:2::1", "2001:3::1", "2001:4:112::1",
    "2001:10::1", "2001:20::1", "2001:30::1", "2001:1ff:ffff::1",  # IETF protocol assignments
    "2001:db8::1", "3fff::1", "3fff:fff:ffff::1",  # documentation
    "2002:7f00:1::", "2002:a00:1::1", "2002:808:808::1",  # 6to4: refused whatever it carries
    "2620:4f:8000::1",  # AS112 direct delegation
    "5f00::1",  # SRv6 SIDs
    "fc00::1", "fdff:ffff::1",  # unique local
    "fe80::1", "febf::1",  # link-local
    "fec0::1", "feff::1",  # site-local (deprecated)
    "ff02::1", "ff0e::1",  # multicast
    "4000::1", "8000::1",  # outside global unicast 2000::/3
)  # fmt: skip

ALLOWED = (
    "1.1.1.1", "8.8.8.8", "93.184.215.14", "100.63.255.255", "100.128.0.0", "172.15.255.255",
    "172.32.0.0", "192.0.1.0", "192.167.255.255", "198.17.255.255", "198.20.0.0", "223.255.255.255",
    "2606:4700:4700::1111", "2a00:1450:4001::200e", "2001:200::1", "2003::1", "3ffe::1",
    "::ffff:8.8.8.8", "64:ff9b::8.8.8.8",  # mapped, and NAT64 from DNS64, of a public address
)  # fmt: skip

# What ipaddress.is_global calls global on Python 3.11 (issue 38): each must be refused here.
PYTHON_311_GLOBAL = ("192.0.0.8", "192.88.99.1", "::127.0.0.1", "2002:7f00:1::", "64:ff9b::7f00:1", "fec0::1")


@pytest.mark.parametrize("address", REFUSED)
def test_every_special_purpose_range_is_refused(address: str) -> None:
    assert why_not(ipaddress.ip_address(address)) is not None, f"{address} would be sent to"


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_pass(address: str) -> None:
    assert why_not(ipaddress.ip_address(address)) is None


def test_what_python_calls_global_is_refused_whatever_its_version() -> None:
    passed = [a for a in PYTHON_311_GLOBAL if why_not(ipaddress.ip_address(a)) is None]
    assert not passed, f"refused by no table: {passed}"


@pytest.mark.parametrize(
    ("address", "inside"),
    [("::ffff:10.0.0.1", "10.0.0.1"), ("::10.0.0.1", "10.0.0.1"), ("64:ff9b::a00:1", "10.0.0.1"),
     ("2002:a00:1:5::9", "10.0.0.1"), ("2606:4700::1", None), ("::1", "0.0.0.1")],
)  # fmt: skip
def test_the_ipv4_address_inside_is_read_from_each_form(address: str, inside: str | None) -> None:
    found = embedded_ipv4(ipaddress.IPv6Address(address))
    assert (None if found is None else str(found)) == inside


def test_a_reason_names_the_ipv4_address_inside() -> None:
    assert why_not(ipaddress.ip_address("2002:7f00:1::")) == "6to4 form of 127.0.0.1: loopback"
    assert why_not(ipaddress.ip_address("::ffff:169.254.169.254")) == (
        "IPv4-mapped form of 169.254.169.254: link-local"
    )


def _resolving_to(*answers: str) -> outbound.Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        return list(answers)

    return resolve


async def test_every_resolved_address_is_checked_not_only_the_first() -> None:
    for answers in (("93.184.215.14", "127.0.0.1"), ("93.184.215.14", "::ffff:10.0.0.1")):
        with pytest.raises(outbound.Refused, match=r"resolves to .*(127\.0\.0\.1|10\.0\.0\.1)"):
            await outbound.pinned("https://hooks.example.com/x", (), resolver=_resolving_to(*answers))


async def test_the_request_goes_to_the_checked_address_with_the_name_kept() -> None:
    target = await outbound.pinned(
        "https://hooks.example.com/x", (), resolver=_resolving_to("93.184.215.14", "1.1.1.1")
    )
    assert (target.url.host, target.host, target.extensions) == (
        "93.184.215.14", "hooks.example.com", {"sni_hostname": "hooks.example.com"},
    )  # fmt: skip


async def test_the_allow_list_admits_a_named_host_or_a_network_and_nothing_else() -> None:
    private = _resolving_to("10.20.0.5")
    for allow in (("hooks.internal",), ("10.20.0.0/16",)):
        target = await outbound.pinned("https://hooks.internal/x", allow, resolver=private)
        assert target.url.host == "10.20.0.5"
    with pytest.raises(outbound.Refused, match=r"10\.20\.0\.5 \(private; allow it"):
        await outbound.pinned("https://hooks.internal/x", ("10.30.0.0/16", "other"), resolver=private)
    with pytest.raises(outbound.Refused, match="resolves to no address"):
        await outbound.pinned("https://hooks.internal/x", (), resolver=_resolving_to())
