"""Settings: each declared once (its variable, type, default, bounds and meaning), validated
on every construction. A bad value is a ``ConfigError`` naming the variable.

``Settings(...)`` is a value built in code (tests, embedding): the declared defaults and the
arguments, nothing read from the environment. ``Settings.from_env()`` reads the environment
(``scheduler serve`` and every other command do). The README's configuration table is written
from this declaration: ``python -m scheduler.config --markdown`` prints it, ``--write-readme``
puts it in README.md, and a test fails when the two drift.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import Field, JsonValue, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from scheduler.delivery.hosts import DEFAULT_ALLOWED_HOSTS, AllowedHosts
from scheduler.types import SchedulerMode

Environment = Literal["development", "production"]
LogFormat = Literal["text", "json"]


# Space-separated names of printable ASCII but the comma (a claim's name, a scope, a role),
# at least one: a comma-separated list is refused, never read as one name.
_NAMES = r"^[!-+\--~]+( [!-+\--~]+)*$"


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


class DatabaseUnusable(Exception):
    """The database cannot be used as it is (cannot be migrated, reached, or started); the
    message says why in one sentence. The CLI prints it and exits 2."""


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


def _setting(default: Any, env: str, meaning: str, *, shown: str | None = None, **bounds: Any) -> Any:
    """A field of ``Settings``: ``env`` is the variable it is read from, ``meaning`` the README's
    "meaning" column, ``shown`` the README's default where the value itself says too little."""
    extra: dict[str, JsonValue] | None = {"readme_default": shown} if shown is not None else None
    return Field(default, validation_alias=env, description=meaning, json_schema_extra=extra, **bounds)


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
        return (f"{name} is {'the default schema of the database' if name == 'public' else 'a system schema of PostgreSQL'}"
                "; the scheduler needs a schema of its own (e.g. scheduler)")
    return None


class Settings(BaseSettings):
    """Everything the service reads from its environment, one declaration per setting."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",  # a misspelt field in code is an error, never a silently ignored value
        populate_by_name=True,  # code passes field names; the environment, the variables
        case_sensitive=True,
        validate_default=True,
    )

    database_url: str | None = _setting(
        None, "DATABASE_URL",
        "a PostgreSQL URL for psycopg 3: `postgresql://user:pw@host:5432/db` (or `postgresql+psycopg://`; an IPv6 "
        "host in brackets, `[::1]`; a Unix socket as `?host=/dir`; a primary that fails over as several hosts in "
        "any libpq spelling, `postgresql://user:pw@h1:5432,h2:5432/db?target_session_attrs=read-write`, see "
        "docs/operations.md); anything else is refused at startup",
        shown="embedded PostgreSQL", repr=False)  # a URL may hold a password: never in a log line
    database_schema: str = _setting(
        "scheduler", "SCHEDULER_DATABASE_SCHEMA",
        "the PostgreSQL schema that holds every table, sequence, function and trigger of the scheduler and "
        "its Alembic version table, beside a host's own (`public`) in one database (DEC-SCHEMA)",
        pattern=SCHEMA_PATTERN)
    data_dir: Path = _setting(
        Path(".scheduler"), "SCHEDULER_DATA_DIR",
        "the embedded server's data (`pgdata/`) and the generated dev secret", shown="`./.scheduler`")
    poll_seconds: float = _setting(
        30.0, "SCHEDULER_POLL_SECONDS",
        "the loop's interval (the wait on the stop event); in prompt mode the longest wait", ge=0.0)
    mode: SchedulerMode = _setting(
        SchedulerMode.LITERAL, "SCHEDULER_MODE",
        "`literal`: REQ-0065 to the letter, a full interval after every poll; `prompt`: polls again at "
        "once after a full batch, wakes at the next trigger or on a NOTIFY (see \"How the loop works\")")
    listen: bool = _setting(
        True, "SCHEDULER_LISTEN",
        "prompt mode's LISTEN connection for wake-ups from other replicas (`false`: timed wake-ups only)")
    batch_size: int = _setting(20, "SCHEDULER_BATCH_SIZE", "rows claimed per poll", ge=1)
    scheduler_enabled: bool = _setting(
        True, "SCHEDULER_ENABLED", "run the loop in this process (false: API only)")
    jwt_secret: str | None = _setting(
        None, "SCHEDULER_JWT_SECRET", "HS256 secret", shown="generated by `serve` in development", repr=False)
    jwt_public_key: str | None = _setting(
        None, "SCHEDULER_JWT_PUBLIC_KEY", "RS256 public key (PEM text or a file path)")
    jwks_url: str | None = _setting(None, "SCHEDULER_JWKS_URL", "RS256 keys from a JWKS endpoint")
    jwt_audience: str = _setting("svc-nudging", "SCHEDULER_JWT_AUDIENCE", "required `aud`", min_length=1)
    jwt_issuer: str | None = _setting(None, "SCHEDULER_JWT_ISSUER", "required `iss`, when set")
    # The host's identity provider names its grants its own way (DEC-AUTH-1): which claims
    # hold them, and which of their values grant this service's two permissions.
    jwt_scope_claims: str = _setting(
        "scope scp", "SCHEDULER_JWT_SCOPE_CLAIMS",
        "the token claims read for grants (a space-separated string or a list of strings each), "
        "space-separated names, e.g. `roles`", pattern=_NAMES)
    jwt_admin_scopes: str = _setting(
        "nudging.admin", "SCHEDULER_JWT_ADMIN_SCOPES",
        "grant values that give `admin` (and `ingest`), space-separated, e.g. `admin nudging.admin`",
        pattern=_NAMES)
    jwt_ingest_scopes: str = _setting(
        "nudging.ingest", "SCHEDULER_JWT_INGEST_SCOPES", "grant values that give `ingest`, space-separated",
        pattern=_NAMES)
    jwt_leeway_seconds: float = _setting(
        60.0, "SCHEDULER_JWT_LEEWAY_SECONDS",
        "a token's `exp`, `nbf` and `iat` are judged with this much leeway for clocks that differ (an "
        "identity provider's from the database's)", ge=0.0, le=3600.0)
    environment: Environment = _setting(
        "development", "SCHEDULER_ENV",
        "`production` refuses to start without a real way to verify tokens, and never starts an embedded "
        "PostgreSQL (DATABASE_URL is required)")
    rules_dir: Path | None = _setting(
        None, "SCHEDULER_RULES_DIR", "a directory of rule files (`*.json`)", shown="the shipped examples")
    default_expiry_seconds: int | None = _setting(
        None, "SCHEDULER_DEFAULT_EXPIRY_SECONDS",
        "a default window for scheduled events stored without `expires_at`, in whole seconds (at least 1): "
        "stored as the row's `expires_at`, `trigger_at` plus this, so a row claimed later ends `expired` "
        "instead of dispatched (changing it rewrites no stored row); unset: no expiry unless the sender "
        "sends one (DEC-EXPIRY)",
        shown="unset (never expires)", ge=1, le=100 * 365 * 86400)
    max_body_bytes: int = _setting(
        64 * 1024, "SCHEDULER_MAX_BODY_BYTES", "larger bodies are a 413", ge=1024)
    batch_max_events: int = _setting(
        1000, "SCHEDULER_BATCH_MAX_EVENTS",
        "events one `POST /admin/scheduled-events/batch` (and one chunk of `scheduler events import`) may hold; "
        "more is a 413", ge=1, le=10_000)
    batch_max_body_bytes: int = _setting(
        8 * 1024 * 1024, "SCHEDULER_BATCH_MAX_BODY_BYTES",
        "larger batch bodies are a 413 (each item is still bounded by SCHEDULER_MAX_BODY_BYTES: a 422 for that item)",
        shown="8 MiB", ge=1024)
    request_header_timeout_seconds: float = _setting(
        10.0, "SCHEDULER_REQUEST_HEADER_TIMEOUT_SECONDS",
        "`scheduler serve` waits this long for a request's line and headers, from the connection's opening or the "
        "request's first byte: then a 408 and the connection is closed (SEC-20.1)", gt=0.0, le=3600.0)
    request_body_timeout_seconds: float = _setting(
        30.0, "SCHEDULER_REQUEST_BODY_TIMEOUT_SECONDS",
        "`scheduler serve` waits this long for a request's whole body after its headers: then a 408 (after an "
        "early answer: the connection is closed) (SEC-20.2)", gt=0.0, le=3600.0)
    statement_timeout_ms: int = _setting(
        30_000, "SCHEDULER_STATEMENT_TIMEOUT_MS", "PostgreSQL `statement_timeout` for every connection", ge=0)
    lock_timeout_ms: int = _setting(
        10_000, "SCHEDULER_LOCK_TIMEOUT_MS", "PostgreSQL `lock_timeout` for every connection", ge=0)
    pool_timeout_seconds: float = _setting(
        10.0, "SCHEDULER_POOL_TIMEOUT_SECONDS",
        "how long a request waits for a connection before a 503", ge=0.1)
    pool_ping_after_idle_seconds: float = _setting(
        1.0, "SCHEDULER_POOL_PING_AFTER_IDLE_SECONDS",
        "a poll's pooled connection used less than this ago is not pinged before use (requests always "
        "are); `0`: ping before every poll too", ge=0)
    retention_days: int = _setting(
        30, "SCHEDULER_RETENTION_DAYS",
        "dispatched, cancelled and expired rows older than this are deleted with their history (`0`: keep "
        "everything)",
        ge=0)
    notification_retention_days: int = _setting(
        0, "SCHEDULER_NOTIFICATION_RETENTION_DAYS",
        "notifications older than this are deleted with their deliveries, and a host's delivered outbox rows "
        "with them; a notification with a queued, retrying or undeliverable delivery is kept (`0`: keep "
        "every notification; else at least 2, the daily cap's window)", ge=0)
    replica_retention_seconds: int = _setting(
        86_400, "SCHEDULER_REPLICA_RETENTION_SECONDS",
        "a replica's heartbeat silent this long (a killed replica's) leaves `/admin/replicas`, the console "
        "and `scheduler_replicas`: retention's hourly run deletes it (a day; OBS-2)", ge=3600)
    transaction_pooling: bool = _setting(
        False, "SCHEDULER_TRANSACTION_POOLING",
        "`true` behind a transaction-pooling proxy (PgBouncer `pool_mode = transaction`): no prepared "
        "statements, timeouts sent per transaction; see below")
    metrics_require_admin: bool = _setting(
        False, "SCHEDULER_METRICS_REQUIRE_ADMIN", "`GET /metrics` needs an admin token")
    console_refresh_seconds: float = _setting(
        2.0, "SCHEDULER_CONSOLE_REFRESH_SECONDS", "how often the console's overview updates", ge=0.1)
    # A frozen peer holds nothing for long: DEC-11 says why 10 s.
    idle_in_transaction_timeout_ms: int = _setting(
        10_000, "SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        "PostgreSQL ends a session idle inside a transaction this long (a frozen replica), releasing its "
        "batch's locks to the other replicas; per transaction behind a pooler; `0` disables (DEC-11)", ge=0)
    tcp_keepalives_idle_seconds: int = _setting(
        30, "SCHEDULER_TCP_KEEPALIVES_IDLE_SECONDS",
        "TCP keepalive probes on every database connection after this much silence (then every 10 s, "
        "3 times); TCP connections only", ge=1)
    tcp_user_timeout_ms: int = _setting(
        30_000, "SCHEDULER_TCP_USER_TIMEOUT_MS",
        "libpq's `tcp_user_timeout`: a send unacknowledged this long ends the connection (`0`: the "
        "kernel's default)", ge=0)
    clock_skew_warn_seconds: float = _setting(
        1.0, "SCHEDULER_CLOCK_SKEW_WARN_SECONDS",
        "the log warns once when this host's clock is further than this from the database's (the service "
        "uses the database's clock either way, DEC-10)", ge=0.0)
    session_max_seconds: int = _setting(
        8 * 3600, "SCHEDULER_SESSION_MAX_SECONDS",
        "a browser session's (console, inbox page) absolute lifetime (8 h; never past its token's `exp`)", ge=60)
    session_idle_seconds: int = _setting(
        30 * 60, "SCHEDULER_SESSION_IDLE_SECONDS", "a browser session unused this long ends (30 min)", ge=60)
    log_format: LogFormat = _setting(
        "text", "SCHEDULER_LOG_FORMAT",
        "`json`: one JSON object a line (`time`, `level`, `logger`, `message`, and `event_id`, `replica`, "
        "`trace_id` where they exist); secrets are redacted in both formats")
    # Outbound delivery (specs/delivery.md): the built-in channels and how they retry.
    webhook_url: str | None = _setting(
        None, "SCHEDULER_WEBHOOK_URL",
        "the webhook channel: one `POST` of JSON per sent notification to this `http(s)` URL (Standard "
        "Webhooks headers; unset: no webhook)", max_length=2048)
    webhook_secret: str | None = _setting(
        None, "SCHEDULER_WEBHOOK_SECRET",
        "signs each webhook (`webhook-signature`, Standard Webhooks): `whsec_` and the base64 of 24 to 64 "
        "random bytes; needs SCHEDULER_WEBHOOK_URL; never logged", repr=False)
    push_allowed_hosts: str = _setting(
        DEFAULT_ALLOWED_HOSTS, "SCHEDULER_PUSH_ALLOWED_HOSTS",
        "the push services a participant's subscription may name, space-separated hosts or `*.domain`, "
        "each with an optional `:port` (else 443); any other endpoint is a 422, never an IP address",
        shown="the public push services: `fcm.googleapis.com updates.push.services.mozilla.com "
              "*.push.apple.com *.notify.windows.com`")
    vapid_private_key: str | None = _setting(
        None, "SCHEDULER_VAPID_PRIVATE_KEY",
        "the web-push channel's VAPID key (P-256): PEM, or the base64url of its 32 bytes "
        "(`scheduler vapid-keys` makes one); unset: no web push; never logged", repr=False)
    vapid_subject: str | None = _setting(
        None, "SCHEDULER_VAPID_SUBJECT",
        "the contact the push services are given (`mailto:ops@example.org` or an `https://` URL); "
        "required with SCHEDULER_VAPID_PRIVATE_KEY")
    delivery_timeout_seconds: float = _setting(
        15.0, "SCHEDULER_DELIVERY_TIMEOUT_SECONDS",
        "bounds one send on any channel, from connecting to the answer; past it the send is retried",
        gt=0.0, le=300.0)
    delivery_backoff_seconds: float = _setting(
        5.0, "SCHEDULER_DELIVERY_BACKOFF_SECONDS",
        "the base of a failed send's exponential backoff with full jitter: a wait of up to base * "
        "2^(attempt - 1), capped, never shorter than the provider's `Retry-After`", ge=0.1, le=3600.0)
    delivery_backoff_cap_seconds: float = _setting(
        3600.0, "SCHEDULER_DELIVERY_BACKOFF_CAP_SECONDS",
        "the longest wait between two attempts, and the most of a `Retry-After` honoured (at least the base)",
        ge=1.0, le=7.0 * 86400)
    delivery_max_attempts: int = _setting(
        12, "SCHEDULER_DELIVERY_MAX_ATTEMPTS",
        "attempts a delivery gets in all, the first included; after the last it is `undeliverable`", ge=1, le=100)
    delivery_concurrency: int = _setting(
        4, "SCHEDULER_DELIVERY_CONCURRENCY", "sends one replica runs at once", ge=1, le=256)
    delivery_stale_seconds: int = _setting(
        600, "SCHEDULER_DELIVERY_STALE_SECONDS",
        "`/health/scheduler` says `degraded` (still 200) once an outbox row has been due and unsent for "
        "longer than this: queued, or retrying past its next attempt", ge=10, le=7 * 86400)

    if not TYPE_CHECKING:  # mypy keeps the typed signature pydantic's plugin writes

        def __init__(self, **values: Any) -> None:
            try:
                super().__init__(**values)
            except ValidationError as exc:
                raise ConfigError(_explain(exc)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the arguments: a ``Settings`` built in code never depends on the process's
        environment; ``from_env`` is the one place that reads it."""
        return (init_settings,)

    @field_validator("environment", "mode", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("database_schema", mode="after")
    @classmethod
    def _own_schema(cls, value: str) -> str:
        problem = schema_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("database_url", mode="after")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        problem = database_url_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("jwt_public_key", mode="after")
    @classmethod
    def _key_from_file(cls, value: str | None) -> str | None:
        if value and not value.lstrip().startswith("-----") and Path(value).is_file():
            return Path(value).read_text()
        return value

    @field_validator("webhook_url", mode="after")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is not None:
            problem = _http_url_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("webhook_secret", mode="after")
    @classmethod
    def _webhook_secret(cls, value: str | None, info: ValidationInfo) -> str | None:
        from scheduler.delivery.signing import parse_secret

        if value is not None:
            parse_secret(value)
            if "webhook_url" in info.data and info.data["webhook_url"] is None:
                raise ValueError("is set but SCHEDULER_WEBHOOK_URL is not: there is nothing to sign")
        return value

    @field_validator("push_allowed_hosts", mode="after")
    @classmethod
    def _push_hosts(cls, value: str) -> str:
        AllowedHosts.parse(value)
        return value

    @field_validator("vapid_private_key", mode="after")
    @classmethod
    def _vapid_key(cls, value: str | None) -> str | None:
        from scheduler.delivery.vapid import VapidKey

        if value is not None:
            VapidKey.parse(value)
        return value

    @field_validator("vapid_subject", mode="after")
    @classmethod
    def _vapid_subject(cls, value: str | None, info: ValidationInfo) -> str | None:
        from scheduler.delivery.vapid import check_subject

        if value is not None:
            return check_subject(value)
        if info.data.get("vapid_private_key"):
            raise ValueError("is required with SCHEDULER_VAPID_PRIVATE_KEY: the push services are given a contact")
        return value

    @field_validator("notification_retention_days", mode="after")
    @classmethod
    def _keeps_the_cap_window(cls, value: int) -> int:
        if value == 1:
            raise ValueError("must be 0 (keep every notification) or at least 2: the daily cap reads the last "
                             "48 hours of notifications")
        return value

    @field_validator("delivery_backoff_cap_seconds", mode="after")
    @classmethod
    def _cap_over_base(cls, value: float, info: ValidationInfo) -> float:
        base = info.data.get("delivery_backoff_seconds")
        if base is not None and value < base:
            raise ValueError(f"must be at least SCHEDULER_DELIVERY_BACKOFF_SECONDS ({base:g})")
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``); a blank variable is unset."""
        return cls(**_Environment(cls, os.environ if env is None else env)())

    @property
    def default_expiry(self) -> timedelta | None:
        """``default_expiry_seconds`` as the window ``core.store.store_event`` takes."""
        return None if self.default_expiry_seconds is None else timedelta(seconds=self.default_expiry_seconds)

    @property
    def replica_retention(self) -> timedelta:
        """``replica_retention_seconds`` as the window ``operations.retention.Retention`` takes."""
        return timedelta(seconds=self.replica_retention_seconds)

    def with_(self, **changes: Any) -> Settings:
        """A copy with some fields changed, validated like any other construction."""
        return type(self)(**{**self.model_dump(), **changes})

    @property
    def secret_file(self) -> Path:
        """Where ``serve`` keeps the generated development secret."""
        return self.data_dir / "jwt-secret"

    def effective_jwt_secret(self) -> str | None:
        """The configured secret, or the one ``serve`` generated into the data directory."""
        if self.jwt_secret:
            return self.jwt_secret
        if self.secret_file.is_file():
            return self.secret_file.read_text().strip() or None
        return None


def _http_url_problem(url: str) -> str | None:
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


def log_format_of(env: Mapping[str, str]) -> str:
    """The log format to start logging in, before the settings are validated: a value that
    is not ``text`` or ``json`` logs as text (``Settings.from_env`` then refuses it)."""
    raw = (env.get("SCHEDULER_LOG_FORMAT") or "").strip().lower()
    return raw if raw in get_args(LogFormat) else "text"


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source, over a given mapping instead of ``os.environ``
    (tests pass their own), with blank values treated as unset."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name: value.strip() for name, value in self._environ.items() if value and value.strip()}


def env_name(field: str) -> str:
    """The variable a field is read from."""
    alias = Settings.model_fields[field].validation_alias
    assert isinstance(alias, str), field
    return alias


def _explain(exc: ValidationError) -> str:
    """pydantic's errors as one line per setting, each naming its variable."""
    return "; ".join(_explain_one(error) for error in exc.errors())


class _NotShown:
    def __repr__(self) -> str:
        return "a value not shown (a secret)"

    __str__ = __repr__


def _explain_one(error: ErrorDetails) -> str:
    key = str(error["loc"][0]) if error["loc"] else "settings"
    by_env = {env_name(name): name for name in Settings.model_fields}
    field = key if key in Settings.model_fields else by_env.get(key)
    if field is None:
        return f"unknown setting {key!r}"
    name, raw, kind, ctx = env_name(field), error.get("input"), error["type"], error.get("ctx", {})
    if Settings.model_fields[field].repr is False:  # a URL with a password, a secret: never in a message
        if kind == "value_error":
            return f"{name} {str(error['msg']).removeprefix('Value error, ')}"
        raw = _NotShown()
    if kind in {"int_parsing", "int_from_float", "int_type"}:
        return f"{name} must be a whole number, got {raw!r}"
    if kind in {"float_parsing", "float_type"}:
        unit = "a number of seconds" if field.endswith("_seconds") else "a number"
        return f"{name} must be {unit}, got {raw!r}"
    if kind in {"bool_parsing", "bool_type"}:
        return f"{name} must be true or false, got {raw!r}"
    if kind == "greater_than_equal":
        return f"{name} must be at least {ctx['ge']}, got {raw}"
    if kind == "greater_than":
        return f"{name} must be more than {ctx['gt']}, got {raw}"
    if kind == "less_than_equal":
        return f"{name} must be at most {ctx['le']}, got {raw}"
    if kind == "string_pattern_mismatch":
        return (f"{name} must be a lower-case PostgreSQL name (letters, digits, underscores; at most 63), "
                f"got {raw!r}")
    if kind == "value_error":
        return f"{name} {str(error['msg']).removeprefix('Value error, ')}, got {raw!r}"
    if kind in {"literal_error", "enum"}:
        choices = str(ctx.get("expected", "")).replace("'", "")
        return f"{name} must be {choices}, got {raw!r}"
    return f"{name}: {error['msg']}, got {raw!r}"


# The README's configuration table.

README = Path("README.md")  # run from the checkout's root
TABLE_HEADER = "| variable | default | meaning |\n| --- | --- | --- |\n"


def _shown_default(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("readme_default"), str):
        return str(extra["readme_default"])
    value = field.default
    if value is None:
        return "\u2013"  # an en dash, as the README shows "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def markdown_table() -> str:
    """The README's configuration table, one row per declared setting, in declaration order."""
    rows = [f"| `{env_name(name)}` | {_shown_default(field)} | {field.description} |\n"
            for name, field in Settings.model_fields.items()]
    return TABLE_HEADER + "".join(rows)


def readme_table(text: str) -> str:
    """The configuration table as it stands in the README's text (header included)."""
    start = text.index(TABLE_HEADER, text.index("## Configuration"))
    end = text.find("\n\n", start)
    return text[start:end + 1]


def write_readme(path: Path = README) -> bool:
    """Put the generated table in the README; True when it changed."""
    text = path.read_text()
    old = readme_table(text)
    new = markdown_table()
    if old == new:
        return False
    path.write_text(text.replace(old, new, 1))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scheduler.config``: print the configuration table, or write it into README.md."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.config",
                                     description="The settings, from their one declaration.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", action="store_true", help="print the README's configuration table")
    what.add_argument("--write-readme", nargs="?", const=README, type=Path, metavar="PATH",
                      help="write the table into the README (default: README.md here)")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    changed = write_readme(args.write_readme)
    print(f"{args.write_readme}: {'configuration table rewritten' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
