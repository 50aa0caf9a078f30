"""A PostgreSQL URL in every spelling libpq accepts for several hosts, read into one shape and
written out again for SQLAlchemy and for psycopg/libpq.

An operator pointing the service at a primary and its standbys writes one of
`postgresql://u:pw@h1:5432,h2:5432/db` (libpq's own authority form), `?host=h1:5432&host=h2:5432`
(SQLAlchemy's) or `?host=h1,h2&port=5432,5432` (libpq's query form), usually with
`target_session_attrs=read-write`. SQLAlchemy's URL parser cannot read the first, and rewriting the
second for libpq keeps only the last host, so every URL is read here once and rendered in a form its
consumer understands: the query form, which both take. A URL that cannot mean one list of hosts is
refused with a sentence (ValueError), at start-up.
"""

import re
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, quote, unquote

SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")

# One host of the authority: [IPv6]:port, or name:port, either without the port.
_HOST = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.%]+)\]|(?P<name>[^:\[\]]*))(?::(?P<port>[^:]*))?$")


@dataclass(frozen=True)
class Target:
    """Who connects to which database on which servers, in the order libpq tries them."""

    user: str | None
    password: str | None
    database: str | None
    hosts: tuple[str, ...]  # empty: libpq's default (the local socket); a path is a socket directory
    ports: tuple[int | None, ...]  # one per host, or a single one for every host
    options: tuple[tuple[str, str], ...]  # the other query parameters, in order

    @property
    def servers(self) -> list[str]:
        """host:port of each server, for messages."""
        hosts = self.hosts or ("localhost",)
        ports = self.ports if len(self.ports) == len(hosts) else (self.ports or (None,)) * len(hosts)
        return [f"{host}:{port or 5432}" for host, port in zip(hosts, ports, strict=True)]

    def with_database(self, database: str) -> "Target":
        return replace(self, database=database)

    def option(self, name: str) -> str | None:
        return next((value for key, value in self.options if key == name), None)


def _port(text: str, raw: str) -> int | None:
    if text == "":
        return None
    if not text.isdigit() or not 0 < int(text) < 65_536:
        raise ValueError(f"{text!r} is not a port number (1-65535) in {_shown(raw)}")
    return int(text)


def _split_host(entry: str, raw: str) -> tuple[str, int | None]:
    found = _HOST.match(entry)
    if found is None:
        raise ValueError(
            f"{entry!r} is not host or host:port in {_shown(raw)}"
            " (an IPv6 address goes in brackets: [::1]:5432)"
        )
    host = found["v6"] if found["v6"] is not None else unquote(found["name"] or "")
    return host, _port(found["port"] or "", raw)


def _shown(raw: str) -> str:
    return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1:***@", raw)


def parse(raw: str) -> Target:
    """The URL's servers, credentials, database and options; ValueError with a sentence when it
    names no one list of servers (mixed spellings, a port that is not a number, more ports than
    hosts)."""
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(
            f"{_shown(raw)} is not a PostgreSQL URL (postgresql://user:password@host:port/database)"
        )
    rest, _, query = rest.partition("?")
    rest = rest.partition("#")[0]
    authority, slash, path = rest.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    if not at:
        userinfo, hostlist = "", authority
    user, colon, password = userinfo.partition(":")
    hosts: list[str] = []
    ports: list[int | None] = []
    if hostlist:
        for entry in hostlist.split(","):
            host, port = _split_host(entry, raw)
            if not host:
                raise ValueError(f"{_shown(raw)} has an empty host in its list of servers")
            hosts.append(host)
            ports.append(port)
    options: list[tuple[str, str]] = []
    query_hosts: list[str] = []
    query_ports: list[str] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "host":
            query_hosts.append(value)
        elif key == "port":
            query_ports.append(value)
        else:
            options.append((key, value))
    if query_hosts and hosts:
        raise ValueError(
            f"{_shown(raw)} names servers both before the database and in ?host=: use one of"
            " h1:p1,h2:p2 (before the database), ?host=h1:p1&host=h2:p2, or ?host=h1,h2&port=p1,p2"
        )
    if query_hosts:
        hosts, ports = _query_servers(query_hosts, query_ports, raw)
    elif query_ports:
        if hosts and any(port is not None for port in ports):
            raise ValueError(f"{_shown(raw)} gives ports both after the hosts and in ?port=: use one")
        ports = [_port(text, raw) for text in ",".join(query_ports).split(",")]
    if len(ports) > 1 and len(ports) != len(hosts):
        raise ValueError(
            f"{_shown(raw)} has {len(hosts)} host(s) but {len(ports)} ports:"
            " give one port for all or one per host"
        )
    if hosts and all(port is None for port in ports):
        ports = []
    user, password, path = unquote(user), unquote(password), unquote(path)
    if "\x00" in user + password + path + "".join(value for _, value in options):
        # libpq's strings end at NUL: psycopg refuses the URL later with an error that is no sentence.
        raise ValueError(f"{_shown(raw)} holds a NUL character (%00), which PostgreSQL cannot take")
    return Target(
        user=user or None,
        password=password if colon and password else None,
        database=path if slash and path else None,
        hosts=tuple(hosts),
        ports=tuple(ports),
        options=tuple(options),
    )


def _query_servers(
    query_hosts: list[str], query_ports: list[str], raw: str
) -> tuple[list[str], list[int | None]]:
    if len(query_hosts) > 1:  # SQLAlchemy's form: host=h1:p1&host=h2:p2
        if query_ports:
            raise ValueError(
                f"{_shown(raw)} mixes ?host=h:p with ?port=:"
                " use ?host=h1:p1&host=h2:p2 or ?host=h1,h2&port=p1,p2"
            )
        pairs = [(e, None) if e.startswith("/") else _split_host(e, raw) for e in query_hosts]
        return [host for host, _ in pairs], [port for _, port in pairs]
    hosts = query_hosts[0].split(",")
    if query_ports:
        return hosts, [_port(text, raw) for text in ",".join(query_ports).split(",")]
    if len(hosts) == 1 and not hosts[0].startswith("/") and ":" in hosts[0]:
        host, port = _split_host(hosts[0], raw)  # ?host=h:p, which SQLAlchemy also reads so
        return [host], [port]
    return hosts, [None] * len(hosts)


def _render(target: Target, scheme: str) -> str:
    user = quote(target.user or "", safe="")
    if target.password is not None:
        user += ":" + quote(target.password, safe="")
    query: list[tuple[str, str]] = []
    one_tcp_host = len(target.hosts) == 1 and not target.hosts[0].startswith("/")
    authority = ""
    if one_tcp_host:
        host = target.hosts[0]
        authority = f"[{host}]" if ":" in host else quote(host, safe="")
        if target.ports and target.ports[0] is not None:
            authority += f":{target.ports[0]}"
    else:
        # Several servers, or a socket directory: the query form, which libpq and SQLAlchemy both read.
        if target.hosts:
            query.append(("host", ",".join(target.hosts)))
        if target.ports:
            query.append(("port", ",".join("" if port is None else str(port) for port in target.ports)))
    query.extend(target.options)
    rendered = f"{scheme}://{user + '@' if user else ''}{authority}/{quote(target.database or '', safe='')}"
    if query:
        rendered += "?" + "&".join(f"{quote(key, safe='')}={quote(value, safe='/,')}" for key, value in query)
    return rendered


def sqlalchemy_url(target: Target) -> str:
    """For SQLAlchemy's psycopg dialect (the engine, Alembic)."""
    return _render(target, "postgresql+psycopg")


def libpq_url(target: Target) -> str:
    """For psycopg's connect() and libpq's tools (psql, pg_dump)."""
    return _render(target, "postgresql")
