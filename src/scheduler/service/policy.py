"""What the composition root refuses before anything runs: production without a real way to
verify tokens or with a development-grade secret (PERM-11), a host's sender that is not a
``Sender``, and a dispatcher built for another schema (DEC-DB)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping

from scheduler.config import ConfigError, Settings
from scheduler.nudging.decision import NudgingPlatform
from scheduler.nudging.orchestrator import WebChannel
from scheduler.types import Dispatcher, Sender

logger = logging.getLogger(__name__)


def check_security(settings: Settings, *, host_authentication: bool) -> None:
    """Production must be told explicitly how to verify tokens, or be given the host's own
    authentication, which then decides every request (PERM-11): the secret ``serve`` generates
    into the data directory is a development convenience. Development says so in the log."""
    if settings.environment == "production":
        if not (host_authentication or settings.jwt_secret or settings.jwt_public_key or settings.jwks_url):
            raise ConfigError(
                "production mode needs SCHEDULER_JWT_SECRET, SCHEDULER_JWT_PUBLIC_KEY or SCHEDULER_JWKS_URL, "
                "or the host's own authentication (SchedulerService(authentication=...)) "
                f"(a generated development secret in {settings.secret_file} is not accepted)"
            )
        secret = settings.jwt_secret or ""
        if secret and _weak_secret(secret):
            raise ConfigError("production mode refuses a development-grade SCHEDULER_JWT_SECRET "
                              "(use 32+ random characters)")
    else:
        logger.warning(
            "running in DEVELOPMENT mode (SCHEDULER_ENV is not 'production'): development secrets "
            "are accepted; set SCHEDULER_ENV=production and a real key before exposing this service"
        )


def _weak_secret(secret: str) -> bool:
    lowered = secret.lower()
    markers = ("dev", "test", "secret", "changeme", "example", "password")
    return len(secret) < 32 or len(set(secret)) < 12 or any(m in lowered for m in markers)


def checked_senders(senders: Mapping[str, Sender] | None) -> dict[str, Sender]:
    """A host's senders by channel name: each a ``Sender`` (an ``async def send``), named by a
    channel the in-app one is not."""
    checked: dict[str, Sender] = {}
    for name, sender in (senders or {}).items():
        if not isinstance(name, str) or not name or len(name) > 32 or name == WebChannel.name:
            raise ValueError(f"a sender's channel is a name of 1 to 32 characters other than 'web', got {name!r}")
        if not isinstance(sender, Sender) or not inspect.iscoroutinefunction(sender.send):
            raise TypeError(f"the sender for {name!r} is not a Sender: it needs an async def send(delivery)")
        checked[name] = sender
    return checked


def dispatcher_schema_problem(dispatcher: Dispatcher, schema: str) -> str | None:
    """Why a ``NudgingPlatform`` the host built for another schema cannot serve ``schema`` (it
    would write its decisions there), in a sentence; ``None`` for any other dispatcher."""
    decisions = getattr(dispatcher, "decisions", None) if isinstance(dispatcher, NudgingPlatform) else None
    if decisions is None or decisions.schema == schema:
        return None
    return (f"the dispatcher passed to SchedulerService decides in schema {decisions.schema!r}, the service's "
            f"is {schema!r} (SCHEDULER_DATABASE_SCHEMA): build it with "
            f"NudgingPlatform(catalogue, decisions=Database(engine, {schema!r}).decisions)")
