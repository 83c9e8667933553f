"""DBURL-1, DBURL-2: every libpq spelling of several hosts in ``DATABASE_URL`` reaches libpq
whole, for the engine (and so every command) and for the LISTEN connection alike.

One parse (``scheduler.database.urls``) reads each form; these tests check what psycopg is
handed (SQLAlchemy's dialect's connect arguments, the listener's connection string), that
the forms agree with each other for any hosts, ports and options (a Hypothesis property), and,
against the suite's real PostgreSQL reached over TCP through a proxy beside a port where
nothing listens, that the engine, the listener and ``scheduler migrate`` connect in each form
whichever of the two servers is written first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from reliability.cluster import free_port
from sqlalchemy import make_url, text

from scheduler.cli import main
from scheduler.config import Settings
from scheduler.database.engine import make_engine, sqlalchemy_url
from scheduler.database.listener import Listener, conninfo_of
from scheduler.database.urls import DatabaseTarget, Endpoint, parse_database_url
from tests.conftest import TEST_SECRET
from tests.proxy import UnixSocketProxy, running, unix_socket_of

DEADLINE_SECONDS = 30.0

# Each spelling of "these two servers, the one that takes writes" ({h1}:{p1} first).
FORMS = {
    "netloc": "postgresql://{user}@{h1}:{p1},{h2}:{p2}/{db}?target_session_attrs=read-write",
    "host-port-list": "postgresql://{user}@/{db}?host={h1}:{p1},{h2}:{p2}&target_session_attrs=read-write",
    "repeated-host": "postgresql://{user}@/{db}?host={h1}:{p1}&host={h2}:{p2}&target_session_attrs=read-write",
    "host-and-port-lists": "postgresql://{user}@/{db}?host={h1},{h2}&port={p1},{p2}&target_session_attrs=read-write",
    "repeated-host-and-port": ("postgresql+psycopg://{user}@/{db}?target_session_attrs=read-write"
                               "&host={h1}&host={h2}&port={p1}&port={p2}"),
}


def _form(name: str, *, h1: str = "db1.example", p1: int = 5432, h2: str = "db2.example", p2: int = 5433,
          db: str = "scheduler", user: str = "app:s3cret") -> str:
    return FORMS[name].format(h1=h1, p1=p1, h2=h2, p2=p2, db=db, user=user)


@pytest.mark.clause("DBURL-1")
@pytest.mark.parametrize("form", FORMS)
def test_each_multi_host_form_reaches_psycopg_and_the_listener_with_every_host_and_port_in_order(form: str) -> None:
    """DBURL-1: whatever the spelling, psycopg is handed ``host=db1.example,db2.example`` and
    ``port=5432,5433`` with target_session_attrs, the user, the password and the database, by
    the engine (SQLAlchemy's dialect's connect arguments) and by the LISTEN connection's
    string (``conninfo_of``) alike: no host dropped, none read as ``host:port``."""
    url = _form(form)
    wanted = {"host": "db1.example,db2.example", "port": "5432,5433", "user": "app", "password": "s3cret",
              "dbname": "scheduler", "target_session_attrs": "read-write"}
    assert parse_database_url(url).libpq_parameters() == wanted
    engine = make_engine(url, Settings())
    try:
        _, handed = engine.dialect.create_connect_args(engine.url)
        assert {key: str(handed[key]) for key in wanted} == wanted
        assert conninfo_to_dict(conninfo_of(engine)) == wanted
    finally:
        engine.dispose()


@pytest.mark.clause("DBURL-1")
def test_one_port_serves_every_host_and_a_single_host_url_reads_as_it_always_did() -> None:
    """DBURL-1: ``?host=h1,h2&port=6432`` is libpq's "6432 for both"; a one-host URL, a Unix
    socket as ``?host=`` (pgserver's) and a URL without a host keep their SQLAlchemy form."""
    assert parse_database_url("postgresql://u@/db?host=h1,h2&port=6432").endpoints == (
        Endpoint("h1", 6432), Endpoint("h2", 6432))
    for url in ["postgresql+psycopg://u:p@db.example:5432/scheduler",
                "postgresql+psycopg://postgres:@/postgres?host=/tmp/pg-socket",
                "postgresql+psycopg://postgres@/scheduler?host=/run/postgresql&port=5432",
                "postgresql+psycopg:///scheduler", "postgresql+psycopg://u@[::1]:5432/scheduler"]:
        assert sqlalchemy_url(url) == url
    assert sqlalchemy_url("postgres://u@db.example/x", "other") == "postgresql+psycopg://u@db.example/other"


# -- the forms agree, for any hosts, ports and options ------------------------------------

_names = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
_ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda parts: ".".join(map(str, parts)))
_ipv6 = st.lists(st.from_regex(r"[0-9a-f]{1,4}", fullmatch=True), min_size=8, max_size=8).map(":".join)
_hosts = st.one_of(_names, _ipv4, _ipv6)
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20)
_options = st.fixed_dictionaries({}, optional={
    "target_session_attrs": st.sampled_from(["read-write", "any", "primary", "standby", "prefer-standby"]),
    "application_name": _text, "sslmode": st.sampled_from(["disable", "prefer", "require"]),
})


def _spelled(form: str, endpoints: list[Endpoint], user: str, password: str, database: str,
             options: dict[str, str]) -> str:
    """``endpoints`` and the rest written in ``form``, percent-encoded as a careful operator would."""
    def bracketed(host: str) -> str:
        return f"[{host}]" if ":" in host else host

    who = f"{quote(user, safe='')}:{quote(password, safe='')}@"
    rest = "".join(f"&{k}={quote(v, safe='')}" for k, v in options.items())
    pairs = [f"{bracketed(e.host)}:{e.port}" for e in endpoints]
    if form == "netloc":
        return f"postgresql://{who}{','.join(pairs)}/{quote(database, safe='')}" + rest.replace("&", "?", 1)
    base = f"postgresql://{who}/{quote(database, safe='')}?"
    if form == "host-port-list":
        return base + "host=" + ",".join(pairs) + rest
    if form == "repeated-host":
        return base + "&".join(f"host={pair}" for pair in pairs) + rest
    hosts = ",".join(e.host for e in endpoints)
    ports = ",".join(str(e.port) for e in endpoints)
    if form == "host-and-port-lists":
        return base + f"host={hosts}&port={ports}" + rest
    return base + "&".join(f"host={e.host}" for e in endpoints) + "".join(f"&port={e.port}" for e in endpoints) + rest


@pytest.mark.clause("DBURL-1")
@settings(max_examples=150, deadline=None)
@given(endpoints=st.lists(st.builds(Endpoint, _hosts, st.integers(1, 65535)), min_size=1, max_size=4),
       user=_text, password=_text, database=_text, options=_options)
def test_every_form_of_any_hosts_and_options_reads_the_same_and_the_service_url_reads_back_unchanged(
    endpoints: list[Endpoint], user: str, password: str, database: str, options: dict[str, str]
) -> None:
    """DBURL-1: any one to four hosts (names, IPv4, IPv6), ports, user, password, database and
    libpq options, spelled in each form, read as the same target; the URL the service builds
    from it (``sqlalchemy_url``) reads back the same through this module and through
    SQLAlchemy's own parser, and builds itself again unchanged; the listener's string is the
    same libpq parameters."""
    wanted = DatabaseTarget(user, password, database, tuple(endpoints), tuple(options.items()))
    for form in FORMS:
        assert parse_database_url(_spelled(form, endpoints, user, password, database, options)) == wanted, form
    built = wanted.sqlalchemy_url()
    assert parse_database_url(built) == wanted
    assert parse_database_url(make_url(built)) == wanted
    assert sqlalchemy_url(built) == built
    assert conninfo_to_dict(wanted.conninfo()) == wanted.libpq_parameters()


# -- against the real server: a live one and one where nothing listens ---------------------


@pytest.fixture
def tcp_port(database_url: str) -> Iterator[int]:
    """A TCP port on 127.0.0.1 that reaches this test's database (a proxy to the server's socket)."""
    with running(UnixSocketProxy(unix_socket_of(database_url))) as proxy:
        yield proxy.port


def _both(form: str, database_url: str, live: int, *, live_first: bool) -> str:
    closed = free_port()  # bound and released: nothing listens there
    first, second = (live, closed) if live_first else (closed, live)
    url = make_url(database_url)
    return _form(form, h1="127.0.0.1", p1=first, h2="127.0.0.1", p2=second, db=str(url.database),
                 user=str(url.username))


@pytest.mark.clause("DBURL-2")
@pytest.mark.parametrize("live_first", [True, False], ids=["live-first", "live-second"])
@pytest.mark.parametrize("form", FORMS)
def test_the_engine_and_the_listen_connection_connect_in_every_form_whichever_server_is_written_first(
    form: str, live_first: bool, database_url: str, tcp_port: int
) -> None:
    """DBURL-2: with the live server written first or second beside a port where nothing
    listens, the service's engine connects to the database, and the LISTEN connection built
    from the engine (``conninfo_of``) connects too and finds notifications working: both keep
    every host (the listener once kept only the last one, and a ``host:port`` list reached
    libpq as host names)."""
    url = _both(form, database_url, tcp_port, live_first=live_first)
    engine = make_engine(url, Settings())
    listener = Listener(conninfo_of(engine), name=f"multi-host-{form}", probe_engine=engine,
                        probe_seconds=DEADLINE_SECONDS)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar_one() == make_url(database_url).database
        with psycopg.connect(conninfo_of(engine), connect_timeout=10) as direct:
            assert direct.execute("SELECT 1").fetchone() == (1,)
        listener.start(wait_seconds=DEADLINE_SECONDS)
        assert listener.available, listener.reason
    finally:
        listener.stop()
        engine.dispose()


@pytest.mark.clause("DBURL-2")
@pytest.mark.parametrize("form", FORMS)
def test_scheduler_migrate_connects_in_every_form(
    form: str, database_url: str, tcp_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """DBURL-2: ``scheduler migrate`` (every command reads DATABASE_URL the same way) with the
    URL in each form, the server where nothing listens first: exit 0, the schema found at its
    revision."""
    monkeypatch.setenv("DATABASE_URL", _both(form, database_url, tcp_port, live_first=False))
    monkeypatch.setenv("SCHEDULER_JWT_SECRET", TEST_SECRET)
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path / "data"))
    code = main(["migrate"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "at revision" in said.out + said.err
