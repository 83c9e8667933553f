"""The checks of a setting's value that are more than a type and bounds: the schema's name
(DEC-SCHEMA-NAME), ``DATABASE_URL`` (parsed by ``scheduler.database.urls``), the webhook's URL
and the pattern of a list of names. Each answers why a value cannot be used, or ``None``."""

from __future__ import annotations

import re

# Space-separated names of printable ASCII but the comma (a claim's name, a scope, a role),
# at least one: a comma-separated list is refused, never read as one name.
NAMES = r"^[!-+\--~]+( [!-+\--~]+)*$"


# Schemas that are PostgreSQL's own (the catalogue, the SQL-standard views, TOAST storage) or
# the host's default: never the scheduler's (DEC-SCHEMA-NAME).
SYSTEM_SCHEMAS = frozenset({"public", "information_schema", "pg_catalog", "pg_toast"})
SCHEMA_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"


def schema_problem(name: str) -> str | None:
    """Why ``name`` cannot be the scheduler's schema (``None``: it can). A plain lower-case
    identifier of at most 63 characters that is not PostgreSQL's (``pg_*``,
    ``information_schema``) nor ``public``; a reserved word (``select``, ``user``) is a fine
    name: every use of it is quoted (``queries.quoted``)."""
    if not re.fullmatch(SCHEMA_PATTERN, name):
        return "must be a lower-case identifier: a letter or _, then letters, digits or _ (at most 63)"
    if name in SYSTEM_SCHEMAS or name.startswith("pg_"):
        what = "the default schema of the database" if name == "public" else "a system schema of PostgreSQL"
        return (f"{name} is {what}"
                "; the scheduler needs a schema of its own (e.g. scheduler)")
    return None


def database_url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as the scheduler's ``DATABASE_URL``, as the rest of a sentence
    that starts with the variable's name; ``None`` when it is a URL the scheduler connects with
    (OPS-6.1): ``postgresql://`` (or ``postgres://``, ``postgresql+psycopg://``), an optional user
    and password, one host or every libpq spelling of several (``h1:5432,h2:5432`` before the
    database, ``?host=h1:5432,h2:5432``, repeated ``?host=``, ``?host=h1,h2&port=5432,5433``),
    each host and port checked, a database and libpq's query options. The one parse is
    ``scheduler.database.urls``; nothing of the URL itself is quoted: it may hold a password."""
    from scheduler.database.urls import database_url_problem as problem

    return problem(url)


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an absolute http(s) URL the service may be configured to POST to."""
    from urllib.parse import urlsplit

    if not url.isascii() or not url.isprintable() or any(c in url for c in " \\\t"):
        return "must be a URL of printable ASCII without spaces or backslashes"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError:
        return "must be an absolute http:// or https:// URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an absolute http:// or https:// URL"
    if "@" in parts.netloc:
        return "must not hold a user name or password (sign with SCHEDULER_WEBHOOK_SECRET instead)"
    if parts.fragment or "#" in url:
        return "must not have a fragment"
    return None
