"""Settings, read once from the environment. A bad value is a clear error naming the variable."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler.types import SchedulerMode


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _str(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return raw if raw and raw.strip() else None


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class Settings:
    """Everything the service reads from its environment (see the README's table)."""

    database_url: str | None = None
    data_dir: Path = Path(".scheduler")
    poll_seconds: float = 30.0
    batch_size: int = 20
    scheduler_enabled: bool = True
    jwt_secret: str | None = None
    jwt_public_key: str | None = None
    jwks_url: str | None = None
    jwt_audience: str = "svc-nudging"
    jwt_issuer: str | None = None
    rules_dir: Path | None = None
    max_body_bytes: int = 64 * 1024
    statement_timeout_ms: int = 30_000
    lock_timeout_ms: int = 10_000
    pool_timeout_seconds: float = 10.0
    environment: str = "development"
    retention_days: int = 30  # dispatched and cancelled rows older than this are deleted; 0 keeps all
    mode: SchedulerMode = SchedulerMode.LITERAL
    listen: bool = True
    transaction_pooling: bool = False
    metrics_require_admin: bool = False  # GET /metrics needs the admin permission (issue 9)
    console_refresh_seconds: float = 2.0  # how often the console's overview stream sends
    # A session idle inside a transaction longer than this is ended by PostgreSQL, releasing
    # its locks (a frozen replica, issue 14); 0 disables. Why 10 s: specs/decisions.md DEC-11.
    idle_in_transaction_timeout_ms: int = 10_000
    # Dead peers on the client's TCP connections: keepalive probes after this much silence,
    # and unacknowledged data for at most tcp_user_timeout_ms (libpq; Unix sockets ignore both).
    tcp_keepalives_idle_seconds: int = 30
    tcp_user_timeout_ms: int = 30_000
    # The log warns (once) when the host clock is further than this from the database's.
    clock_skew_warn_seconds: float = 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``)."""
        env = os.environ if env is None else env
        environment = (env.get("SCHEDULER_ENV") or "development").strip().lower()
        if environment not in {"development", "production"}:
            raise ConfigError(f"SCHEDULER_ENV must be development or production, got {environment!r}")
        public_key = _str(env, "SCHEDULER_JWT_PUBLIC_KEY")
        if public_key and not public_key.lstrip().startswith("-----") and Path(public_key).is_file():
            public_key = Path(public_key).read_text()
        rules_dir = _str(env, "SCHEDULER_RULES_DIR")
        raw_mode = (env.get("SCHEDULER_MODE") or "literal").strip().lower()
        try:
            mode = SchedulerMode(raw_mode)
        except ValueError:
            raise ConfigError(f"SCHEDULER_MODE must be literal or prompt, got {raw_mode!r}") from None
        return cls(
            database_url=_str(env, "DATABASE_URL"),
            data_dir=Path(_str(env, "SCHEDULER_DATA_DIR") or ".scheduler"),
            poll_seconds=_float(env, "SCHEDULER_POLL_SECONDS", 30.0, 0.0),
            batch_size=_int(env, "SCHEDULER_BATCH_SIZE", 20, 1),
            scheduler_enabled=_bool(env, "SCHEDULER_ENABLED", True),
            jwt_secret=_str(env, "SCHEDULER_JWT_SECRET"),
            jwt_public_key=public_key,
            jwks_url=_str(env, "SCHEDULER_JWKS_URL"),
            jwt_audience=_str(env, "SCHEDULER_JWT_AUDIENCE") or "svc-nudging",
            jwt_issuer=_str(env, "SCHEDULER_JWT_ISSUER"),
            rules_dir=Path(rules_dir) if rules_dir else None,
            max_body_bytes=_int(env, "SCHEDULER_MAX_BODY_BYTES", 64 * 1024, 1024),
            statement_timeout_ms=_int(env, "SCHEDULER_STATEMENT_TIMEOUT_MS", 30_000, 0),
            lock_timeout_ms=_int(env, "SCHEDULER_LOCK_TIMEOUT_MS", 10_000, 0),
            pool_timeout_seconds=_float(env, "SCHEDULER_POOL_TIMEOUT_SECONDS", 10.0, 0.1),
            environment=environment,
            retention_days=_int(env, "SCHEDULER_RETENTION_DAYS", 30, 0),
            mode=mode,
            listen=_bool(env, "SCHEDULER_LISTEN", True),
            transaction_pooling=_bool(env, "SCHEDULER_TRANSACTION_POOLING", False),
            metrics_require_admin=_bool(env, "SCHEDULER_METRICS_REQUIRE_ADMIN", False),
            console_refresh_seconds=_float(env, "SCHEDULER_CONSOLE_REFRESH_SECONDS", 2.0, 0.1),
            idle_in_transaction_timeout_ms=_int(env, "SCHEDULER_IDLE_IN_TRANSACTION_TIMEOUT_MS", 10_000, 0),
            tcp_keepalives_idle_seconds=_int(env, "SCHEDULER_TCP_KEEPALIVES_IDLE_SECONDS", 30, 1),
            tcp_user_timeout_ms=_int(env, "SCHEDULER_TCP_USER_TIMEOUT_MS", 30_000, 0),
            clock_skew_warn_seconds=_float(env, "SCHEDULER_CLOCK_SKEW_WARN_SECONDS", 1.0, 0.0),
        )

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed (tests and embedding code use this)."""
        return replace(self, **changes)  # type: ignore[arg-type]

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
