"""The host's own authentication: its tokens (audience ``host-api``, a ``roles`` claim), checked
its own way and mapped onto the scheduler's two permissions (``admin``, ``ingest``).

The scheduler takes any Starlette ``AuthenticationBackend`` (``SchedulerService(authentication=
...)``) and checks exactly what it grants; ``authenticated(subject, permissions)`` builds the
answer. This host signs its tokens with HS256 and a secret from ``HOST_TOKEN_SECRET``.
"""

from __future__ import annotations

import os

import jwt
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
)
from starlette.requests import HTTPConnection

from scheduler import authenticated

AUDIENCE = "host-api"
ROLE_PERMISSIONS = {"admin": {"admin", "ingest"}, "sender": {"ingest"}}


def secret() -> str:
    return os.environ.get("HOST_TOKEN_SECRET", "host-development-secret-0123456789abcdef")


def mint(subject: str, roles: list[str], ttl_seconds: int = 600) -> str:
    """A host token, as the host's identity provider would mint it (for the demo and tests)."""
    import time

    now = int(time.time())
    return jwt.encode({"sub": subject, "aud": AUDIENCE, "roles": roles, "iat": now, "exp": now + ttl_seconds},
                      secret(), algorithm="HS256")


class HostTokens(AuthenticationBackend):
    """``Authorization: Bearer <host token>``; no header: anonymous (the routes answer 401)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        header = conn.headers.get("authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            raise AuthenticationError("expected a bearer token")
        try:
            claims = jwt.decode(token.strip(), secret(), algorithms=["HS256"], audience=AUDIENCE)
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"the host refuses this token: {exc}") from exc
        roles = claims.get("roles")
        granted: set[str] = set()
        for role in roles if isinstance(roles, list) else []:
            granted |= ROLE_PERMISSIONS.get(str(role), set())
        return authenticated(str(claims["sub"]), granted)
