"""db/urls.py: every multi-host spelling libpq accepts reads as the same servers, and comes out in
a form SQLAlchemy and libpq both read; a URL naming no one list of servers is refused with a
sentence. No database: the URLs are parsed, and rendered, here and by the two consumers' parsers."""

from pathlib import Path

import psycopg.conninfo
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from api.settings import Settings
from cli.main import _database_target
from db import urls
from db.engine import database_url, libpq_url

UNUSED = Path("/nonexistent")  # the embedded server's directory, not used when a URL is configured
SPELLINGS = {
    "authority": "postgresql://u:p%40ss@db1.example:5432,db2.example:5433/rq?target_session_attrs=read-write",
    "host-port pairs": "postgresql://u:p%40ss@/rq?host=db1.example:5432&host=db2.example:5433"
    "&target_session_attrs=read-write",
    "comma lists": "postgresql://u:p%40ss@/rq?host=db1.example,db2.example&port=5432,5433"
    "&target_session_attrs=read-write",
}
EXPECTED = {
    "user": "u",
    "password": "p@ss",
    "dbname": "rq",
    "host": "db1.example,db2.example",
    "port": "5432,5433",
    "target_session_attrs": "read-write",
}


def _sqlalchemy_connect_args(url: str) -> dict[str, object]:
    """What SQLAlchemy's psycopg dialect hands psycopg.connect for `url`."""
    _, params = PGDialect_psycopg().create_connect_args(make_url(url))  # type: ignore[no-untyped-call]
    return dict(params)


@pytest.mark.parametrize("raw", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_every_spelling_reaches_both_consumers_with_every_server(raw: str) -> None:
    target = urls.parse(raw)
    assert target.hosts == ("db1.example", "db2.example") and target.ports == (5432, 5433)
    assert _sqlalchemy_connect_args(database_url(raw, UNUSED)) == EXPECTED
    assert psycopg.conninfo.conninfo_to_dict(libpq_url(database_url(raw, UNUSED))) == EXPECTED


def test_libpq_url_for_another_database_keeps_every_server() -> None:
    url = database_url(SPELLINGS["authority"], UNUSED)
    assert psycopg.conninfo.conninfo_to_dict(libpq_url(url, "postgres")) == {**EXPECTED, "dbname": "postgres"}


@pytest.mark.parametrize(
    ("raw", "hosts", "ports"),
    [
        ("postgresql://u@h/db", ("h",), ()),
        ("postgres://u@h:6000/db", ("h",), (6000,)),
        ("postgresql+psycopg://u@[::1]:5432,[fe80::1]/db", ("::1", "fe80::1"), (5432, None)),
        ("postgresql://u@h1,h2:5433/db", ("h1", "h2"), (None, 5433)),
        ("postgresql://u@h1,h2/db?port=6000", ("h1", "h2"), (6000,)),
        ("postgresql://postgres:@/postgres?host=/run/pg", ("/run/pg",), ()),
        ("postgresql://u@%2Frun%2Fa,%2Frun%2Fb/db", ("/run/a", "/run/b"), ()),
        ("postgresql://u@/db?host=/run/a&host=h2:5433", ("/run/a", "h2"), (None, 5433)),
        ("postgresql://u@/db?host=h:5433", ("h",), (5433,)),
    ],
)
def test_hosts_and_ports_as_libpq_reads_them(
    raw: str, hosts: tuple[str, ...], ports: tuple[int, ...]
) -> None:
    target = urls.parse(raw)
    assert (target.hosts, target.ports) == (hosts, ports)
    rendered = psycopg.conninfo.conninfo_to_dict(urls.libpq_url(target))
    assert rendered.get("host", "") in (",".join(hosts), "")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("postgresql://u@h1:5432,h2:x/db", "'x' is not a port number"),
        ("postgresql://u@h1:99999/db", "'99999' is not a port number"),
        ("postgresql://u@h1,,h2/db", "empty host"),
        ("postgresql://u@h1:1:2/db", "is not host or host:port"),
        ("postgresql://u@h1/db?host=h2", "both before the database and in ?host="),
        ("postgresql://u@/db?host=h1:1&host=h2:2&port=3", "mixes ?host=h:p with ?port="),
        ("postgresql://u@/db?host=h1,h2,h3&port=1,2", "3 host(s) but 2 ports"),
        ("postgresql://u@h1:5432/db?port=6000", "ports both after the hosts and in ?port="),
        ("mysql://u@h/db", "is not a PostgreSQL URL"),
    ],
)
def test_a_url_naming_no_one_list_of_servers_is_refused_with_a_sentence(raw: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        urls.parse(raw)
    assert says in str(refused.value)


def test_the_password_never_appears_in_a_refusal() -> None:
    with pytest.raises(ValueError) as refused:
        urls.parse("postgresql://u:hunter2@h1:x/db")
    assert "hunter2" not in str(refused.value) and "***" in str(refused.value)


def test_settings_refuse_a_bad_multi_host_url_at_start_up_and_take_every_good_one() -> None:
    with pytest.raises(ValueError, match="3 host"):
        Settings(database_url="postgresql://u@/db?host=h1,h2,h3&port=1,2")
    for raw in SPELLINGS.values():
        assert Settings(database_url=raw).database_url == raw


def test_the_liveness_options_are_added_unless_the_url_sets_them() -> None:
    liveness = Settings().db_liveness
    url = database_url(SPELLINGS["authority"] + "&keepalives_idle=99", UNUSED, liveness)
    given_to_psycopg = _sqlalchemy_connect_args(url)
    assert given_to_psycopg["keepalives_idle"] == "99"
    assert given_to_psycopg["tcp_user_timeout"] == "10000" and given_to_psycopg["keepalives"] == "1"
    assert given_to_psycopg["host"] == EXPECTED["host"]


def test_a_nul_in_the_url_is_refused_with_a_sentence_not_the_drivers_error() -> None:
    with pytest.raises(ValueError, match="NUL character") as refused:
        urls.parse("postgresql://u:se%00cret@db1.example/rq")
    assert "cret" not in str(refused.value)  # the password is never shown


def test_the_failure_message_names_every_server() -> None:
    settings = Settings(database_url=SPELLINGS["authority"])
    assert _database_target(settings) == "PostgreSQL at db1.example:5432, db2.example:5433 (database rq)"


_name = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){0,2}", fullmatch=True)


@given(
    servers=st.lists(st.tuples(_name, st.one_of(st.none(), st.integers(1, 65535))), min_size=1, max_size=4),
    password=st.text(min_size=1, max_size=12),
)
def test_the_three_spellings_of_any_list_of_servers_read_alike(
    servers: list[tuple[str, int | None]], password: str
) -> None:
    from urllib.parse import quote

    hosts = [host for host, _ in servers]
    ports = ["" if port is None else str(port) for _, port in servers]
    secret = quote(password, safe="")
    authority = ",".join(f"{h}:{p}" if p else h for h, p in zip(hosts, ports, strict=True))
    spellings = [
        f"postgresql://u:{secret}@{authority}/db",
        f"postgresql://u:{secret}@/db?"
        + "&".join(f"host={h}:{p}" if p else f"host={h}" for h, p in zip(hosts, ports, strict=True)),
        f"postgresql://u:{secret}@/db?host={','.join(hosts)}&port={','.join(ports)}",
    ]
    if "\x00" in password:  # libpq cannot carry it: each spelling is refused with a sentence
        for spelling in spellings:
            with pytest.raises(ValueError, match="NUL character"):
                urls.parse(spelling)
        return
    read = {spelling: urls.parse(spelling) for spelling in spellings}
    assert len(set(read.values())) == 1, read
    target = read[spellings[0]]
    assert target.password == password
    libpq = psycopg.conninfo.conninfo_to_dict(urls.libpq_url(target))
    assert libpq["password"] == password
    if len(hosts) > 1:
        assert libpq["host"] == ",".join(hosts)
