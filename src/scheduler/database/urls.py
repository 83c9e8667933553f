"""``DATABASE_URL`` → what psycopg and libpq get: one strict parse of every form a libpq user writes.

A deployment whose primary fails over to a standby names every server it may find the primary
on, and libpq picks the one that accepts writes (``target_session_attrs=read-write``). Each of
these spellings means the same two servers, and each is read here into one ``DatabaseTarget``:

- ``postgresql://u:pw@h1:5432,h2:5433/db`` (libpq's own list before the database),
- ``postgresql://u:pw@/db?host=h1:5432,h2:5433`` (a ``host:port`` comma list),
- ``postgresql://u:pw@/db?host=h1:5432&host=h2:5433`` (repeated ``host=``, SQLAlchemy's),
- ``postgresql://u:pw@/db?host=h1,h2&port=5432,5433`` (libpq's ``host``/``port`` lists; ``port=``
  may repeat too, and one port applies to every host),

with one host (``u@h:5432/db``, an IPv6 address in brackets, a Unix socket directory as
``?host=/dir``) and every other libpq option of the query (``target_session_attrs``,
``application_name``, ``sslmode``...) as ever. SQLAlchemy's psycopg dialect reads only some of
them (a ``host:port`` comma list reached libpq as host names: "failed to resolve host
'h2:5433'"), so the service never hands it a DATABASE_URL as written: ``sqlalchemy_url`` writes
the target in the one form the dialect passes on whole (``?host=h1,h2&port=5432,5433``), and
``conninfo`` writes it as libpq's ``key=value`` string for a connection of the service's own
(the LISTEN connection). Both keep every host.

The parse is strict, each part in a sentence (the rest of one that starts with the variable's
name, as ``scheduler.config.database_url_problem`` says it; nothing of the URL is quoted: it may
hold a password): the scheme and driver, at most one ``@``, each host (an IPv6 address in
brackets before the database) and each port (ASCII digits, 1 to 65535), as many ports as hosts
or one, hosts and ports each given one way, no query parameter twice but ``host`` and
``port``, and only options libpq knows. Query values are percent-decoded as SQLAlchemy always
read the service's URL (a ``+`` is a space; write a plus as ``%2B``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, unquote_plus

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

_POSTGRESQL = {"postgresql", "postgres"}
_ASYNC_DRIVERS = {"asyncpg", "psycopg_async"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9.-]*)(?:\+([A-Za-z0-9_.-]+))?://")
_PORT = re.compile(r"^[0-9]{1,5}$")
# A host SQLAlchemy reads back as written before the database (it decodes no host): a name, an
# IPv4 or IPv6 address; any other (a socket directory, an IPv6 zone's '%') goes in ?host=.
_PLAIN_HOST = re.compile(r"^[A-Za-z0-9._:-]+$")
EXAMPLE_URL = "postgresql://user:password@host:5432/db"
_MULTI_HOST_EXAMPLE = "postgresql://user:password@h1:5432,h2:5432/db?target_session_attrs=read-write"
_PORT_NOT_A_NUMBER = ("has a port that is not a number (ASCII digits after the host's ':'; a '/', '?', '#' or '@' "
                      "in the password is written percent-encoded: %2F, %3F, %23, %40)")
_IPV6_EXAMPLE = "[::1] (postgresql://user@[::1]:5432/db)"
# The query parameters that may be given more than once: the host and port lists.
_LISTS = ("host", "port")


class DatabaseUrlError(ValueError):
    """What is wrong with a database URL: the rest of a sentence that starts with its name."""


@dataclass(frozen=True)
class Endpoint:
    """One server to try: a host name, an IP address (IPv6 without brackets) or a Unix socket
    directory (``""``: libpq's default), and its port (``None``: libpq's default, 5432)."""

    host: str
    port: int | None = None


@dataclass(frozen=True)
class DatabaseTarget:
    """A database URL read whole: who connects, to which database, on which servers in order,
    with which other libpq options (in the order given)."""

    user: str | None
    password: str | None
    database: str | None
    endpoints: tuple[Endpoint, ...]
    options: tuple[tuple[str, str], ...] = ()

    def with_database(self, database: str | None) -> DatabaseTarget:
        return self if database is None else replace(self, database=database)

    def with_options(self, **options: str) -> DatabaseTarget:
        """The same target with these libpq options set (replacing any of the same name)."""
        kept = tuple((k, v) for k, v in self.options if k not in options)
        return replace(self, options=kept + tuple(options.items()))

    def libpq_parameters(self) -> dict[str, str]:
        """libpq's keywords and values (``host`` and ``port`` as its comma lists)."""
        parameters: dict[str, str] = {}
        if any(e.host for e in self.endpoints):
            parameters["host"] = ",".join(e.host for e in self.endpoints)
        if any(e.port is not None for e in self.endpoints):
            parameters["port"] = ",".join("" if e.port is None else str(e.port) for e in self.endpoints)
        if self.user is not None:
            parameters["user"] = self.user
        if self.password is not None:
            parameters["password"] = self.password
        if self.database is not None:
            parameters["dbname"] = self.database
        parameters.update(self.options)
        return parameters

    def conninfo(self) -> str:
        """libpq's ``key=value`` connection string (what ``psycopg.connect`` takes)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo("", **self.libpq_parameters())

    def sqlalchemy_url(self) -> str:
        """A ``postgresql+psycopg://`` URL that SQLAlchemy's dialect hands to psycopg whole: one
        TCP host before the database as ever, several (or a socket) as ``?host=...&port=...``.
        Percent-encoded so that SQLAlchemy and this module read it back alike (idempotent)."""
        url = "postgresql+psycopg://"
        if self.user is not None or self.password is not None:
            url += _quote(self.user or "")
            if self.password is not None:
                url += ":" + _quote(self.password)
            url += "@"
        query: list[tuple[str, str]] = []
        if len(self.endpoints) == 1 and _PLAIN_HOST.match(self.endpoints[0].host):
            only = self.endpoints[0]
            url += f"[{only.host}]" if ":" in only.host else only.host
            if only.port is not None:
                url += f":{only.port}"
        else:
            parameters = self.libpq_parameters()
            query += [(key, parameters[key]) for key in _LISTS if key in parameters]
        url += "/" + _quote(self.database or "")
        query += self.options
        if query:
            url += "?" + "&".join(f"{_quote(k)}={_quote(v, safe=',/:')}" for k, v in query)
        return url


def _quote(value: str, safe: str = "") -> str:
    return quote(value, safe=safe)


def parse_database_url(url: str | URL) -> DatabaseTarget:
    """Read ``url`` (a string in any form above, or a SQLAlchemy ``URL``, an engine's) into a
    ``DatabaseTarget``; a ``DatabaseUrlError`` says what is wrong."""
    if not isinstance(url, str):
        return _from_sqlalchemy(url)
    scheme = _SCHEME.match(url)
    if scheme is None:
        raise DatabaseUrlError(f"must be a PostgreSQL URL such as {EXAMPLE_URL}: this value has no scheme:// part")
    _check_scheme(scheme[0], scheme[1].lower(), (scheme[2] or "").lower())
    rest = url[scheme.end():]
    authority, _, after = _split_at(rest, "/?#")
    if authority.count("@") > 1:
        raise DatabaseUrlError("holds more than one '@' before the host: write an '@' in the user or password as %40")
    userinfo, at, hosts = authority.rpartition("@")
    user: str | None = None
    password: str | None = None
    if at:
        name, colon, secret = userinfo.partition(":")
        user = _decode(name) if name or colon else None
        password = _decode(secret) if colon else None
    path, query = after, ""
    if "?" in after:
        path, _, query = after.partition("?")
    if "#" in path or "#" in query or rest[len(authority):].startswith("#"):
        raise DatabaseUrlError("has a '#': write a '#' in the password or a value as %23")
    database = _decode(path[1:]) if path.startswith("/") else None
    netloc = [_endpoint_before_database(item) for item in hosts.split(",")] if hosts else []
    if len(netloc) > 1 and any(not e.host for e in netloc):
        raise DatabaseUrlError("has an empty host in its list of hosts: write each host, as " + _MULTI_HOST_EXAMPLE)
    items = [_query_item(part) for part in query.split("&") if part] if query else []
    return _target(user, password, database or None, netloc, items)


def _from_sqlalchemy(url: URL) -> DatabaseTarget:
    """An engine's URL, read through the same rules (its parts are already decoded)."""
    dialect, _, driver = url.drivername.partition("+")
    _check_scheme(url.drivername + "://", dialect.lower(), driver.lower())
    netloc = []
    if url.host is not None or url.port is not None:
        if url.port is not None and not 1 <= url.port <= 65535:
            raise DatabaseUrlError("has a port outside 1 to 65535")
        netloc.append(Endpoint(url.host or "", url.port))
    items = [(key, value) for key, values in url.query.items()
             for value in ([values] if isinstance(values, str) else values)]
    return _target(url.username, url.password, url.database or None, netloc, items)


def _check_scheme(scheme: str, dialect: str, driver: str) -> None:
    if dialect not in _POSTGRESQL:
        raise DatabaseUrlError(f"names the database {dialect!r} ({scheme}): the scheduler runs on PostgreSQL only; "
                               f"write a PostgreSQL URL such as {EXAMPLE_URL}")
    if driver in _ASYNC_DRIVERS:
        raise DatabaseUrlError(f"names the asynchronous driver {driver!r} ({scheme}): the scheduler connects with "
                               "psycopg 3's synchronous driver; write postgresql:// or postgresql+psycopg://")
    if driver not in {"", "psycopg"}:
        raise DatabaseUrlError(f"names the driver {driver!r} ({scheme}): the scheduler connects with psycopg 3; write "
                               "postgresql:// or postgresql+psycopg://")


def _split_at(text: str, stops: str) -> tuple[str, str, str]:
    """``text`` cut before the first of ``stops``: (before, the stop, the stop and after)."""
    found = re.search(f"[{re.escape(stops)}]", text)
    if found is None:
        return text, "", ""
    return text[:found.start()], found[0], text[found.start():]


def _decode(text: str, *, plus: bool = False) -> str:
    """Percent-decoded (and ``+`` as a space in a query, ``plus``), strictly UTF-8, no NUL."""
    try:
        value = (unquote_plus if plus else unquote)(text, errors="strict")
    except UnicodeDecodeError:
        raise DatabaseUrlError("has a percent-encoded byte that is not UTF-8 (%XX must spell UTF-8 text)") from None
    if "\x00" in value:
        raise DatabaseUrlError("holds a NUL character (%00)")
    return value


def _query_item(part: str) -> tuple[str, str]:
    key, equals, value = part.partition("=")
    if not equals or not key:
        raise DatabaseUrlError("has a query parameter without a name and '=' (write ?name=value&name=value)")
    return _decode(key, plus=True), _decode(value, plus=True)


def _endpoint_before_database(host_port: str) -> Endpoint:
    """``host[:port]`` of a URL's authority: an IPv6 host in brackets, a port 1 to 65535."""
    port: str | None
    if host_port.startswith("["):
        host, closed, after = host_port[1:].partition("]")
        if not closed:
            raise DatabaseUrlError(f"has an IPv6 host whose '[' is never closed: write it as {_IPV6_EXAMPLE}")
        if not host:
            raise DatabaseUrlError("has an empty IPv6 host '[]': write the address inside the brackets, as [::1]")
        if after and not after.startswith(":"):
            raise DatabaseUrlError(f"has text after the IPv6 host's ']': only :port may follow it, as {_IPV6_EXAMPLE}")
        port = after[1:] if after else None
    else:
        if "]" in host_port:
            raise DatabaseUrlError(f"has an IPv6 host whose ']' is never opened: write it as {_IPV6_EXAMPLE}")
        if host_port.count(":") > 1:
            raise DatabaseUrlError(f"has an IPv6 host without brackets: write it as {_IPV6_EXAMPLE}")
        host, colon, after = host_port.partition(":")
        port = after if colon else None
    return Endpoint(_decode(host), _port(port))


def _endpoint_in_query(item: str) -> Endpoint:
    """One entry of ``?host=``: a socket directory, ``[v6]:port``, a bare IPv6 address, or ``host[:port]``."""
    if not item:
        raise DatabaseUrlError("has an empty entry in ?host=: write each host, as ?host=h1:5432,h2:5432")
    if item.startswith("/") or item.startswith("@"):
        return Endpoint(item)  # a Unix socket directory (or an abstract one): the port is ?port=
    if item.startswith("[") or item.count(":") == 1:
        return _endpoint_before_database(item)
    if "]" in item:
        raise DatabaseUrlError(f"has an IPv6 host whose ']' is never opened: write it as {_IPV6_EXAMPLE}")
    return Endpoint(item)  # a name, an IPv4 address, or an IPv6 address (libpq's own spelling)


def _port(text: str | None) -> int | None:
    if text is None:
        return None
    if not _PORT.match(text):
        raise DatabaseUrlError(_PORT_NOT_A_NUMBER)
    if not 1 <= int(text) <= 65535:
        raise DatabaseUrlError("has a port outside 1 to 65535")
    return int(text)


def _target(user: str | None, password: str | None, database: str | None, netloc: list[Endpoint],
            items: Iterable[tuple[str, str]]) -> DatabaseTarget:
    """The hosts, the ports, who and which database, and the other options, each given one way."""
    query_hosts: list[str] = []
    query_ports: list[str] = []
    options: dict[str, str] = {}
    for key, value in items:
        if key == "host":
            query_hosts += value.split(",")
        elif key == "port":
            query_ports += value.split(",")
        elif key in options:
            raise DatabaseUrlError(f"gives the query parameter {key!r} twice: give it once")
        else:
            options[key] = value
    # libpq also takes the user, the password and the database from the query: one place each
    given = {"user": user, "password": password, "dbname": database}
    for key, in_url in given.items():
        if key in options:
            if in_url is not None:
                raise DatabaseUrlError(f"gives {key!r} both in the URL and in its query: give it in one place")
            given[key] = options.pop(key)
    if query_hosts and any(e.host for e in netloc):
        raise DatabaseUrlError("names hosts both before the database and in ?host=: write them in one place, as "
                               + _MULTI_HOST_EXAMPLE)
    endpoints = netloc
    if query_hosts:
        # ``postgresql://:5433/db?host=/dir``: the port before the database is libpq's ?port=
        if netloc and netloc[0].port is not None:
            if query_ports:
                raise DatabaseUrlError("gives a port both before the database and in ?port=: give it in one place")
            query_ports = [str(netloc[0].port)]
        endpoints = [_endpoint_in_query(item) for item in query_hosts]
    if query_ports:
        if any(e.port is not None for e in endpoints):
            raise DatabaseUrlError("gives ports both after the hosts (h1:5432) and in ?port=: give them one way, as "
                                   + _MULTI_HOST_EXAMPLE)
        if not all(query_ports):
            raise DatabaseUrlError("has an empty entry in ?port=: write each port, as ?host=h1,h2&port=5432,5433")
        ports = [_port(p) for p in query_ports]
        endpoints = endpoints or [Endpoint("")]
        if len(ports) == 1:
            ports *= len(endpoints)  # one port for every host, as libpq reads it
        if len(ports) != len(endpoints):
            raise DatabaseUrlError(f"gives {len(query_ports)} ports for {len(endpoints)} hosts: give one port for "
                                   "every host, or one for all")
        endpoints = [Endpoint(e.host, port) for e, port in zip(endpoints, ports, strict=True)]
    if options:
        _check_options(options)
    return DatabaseTarget(given["user"], given["password"], given["dbname"] or None, tuple(endpoints),
                          tuple(options.items()))


def _check_options(options: dict[str, str]) -> None:
    """Every option is one libpq knows (libpq's own parser says, as it would at connect)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    try:
        make_conninfo("", **options)
    except psycopg.ProgrammingError as exc:
        unknown = re.search(r'invalid (?:connection|URI query parameter:?) option "?([^"]+)"?', str(exc))
        name = f" {unknown[1]!r}" if unknown and unknown[1].isascii() and unknown[1].isprintable() else ""
        raise DatabaseUrlError(f"has a query parameter{name} that libpq does not know (the options are libpq's "
                               "connection parameters, such as target_session_attrs or sslmode)") from None


def database_url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a database URL, as the rest of a sentence that starts with
    the variable's name; ``None`` when the scheduler connects with it."""
    try:
        target = parse_database_url(url)
    except DatabaseUrlError as exc:
        return str(exc)
    from sqlalchemy import make_url  # the parser the engine uses: what passes here, it reads
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(target.sqlalchemy_url())
    except (ArgumentError, ValueError):
        return f"is not a URL SQLAlchemy can read: write it as {EXAMPLE_URL}"
    return None


def sqlalchemy_url(url: str | URL, database: str | None = None) -> str:
    """The SQLAlchemy (psycopg 3) URL for ``url`` in any form above, on ``database`` if given."""
    return parse_database_url(url).with_database(database).sqlalchemy_url()


def conninfo(url: str | URL) -> str:
    """libpq's connection string for ``url`` in any form above (or an engine's URL), every host kept."""
    return parse_database_url(url).conninfo()
