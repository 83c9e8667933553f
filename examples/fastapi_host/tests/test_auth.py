"""HOST-1: the host's tokens, mapped onto the scheduler's two permissions."""

from __future__ import annotations

import asyncio

import jwt
import pytest
from host_service.auth import HostTokens, mint, secret
from starlette.authentication import AuthenticationError
from starlette.requests import HTTPConnection


def _connection(authorization: str) -> HTTPConnection:
    return HTTPConnection({"type": "http", "headers": [(b"authorization", authorization.encode())]})


def _permissions(roles: list[str]) -> set[str]:
    found = asyncio.run(HostTokens().authenticate(_connection(f"Bearer {mint('ops', roles)}")))
    assert found is not None
    credentials, user = found
    assert user.display_name == "ops"
    return set(credentials.scopes) - {"authenticated"}


@pytest.mark.clause("HOST-1")
def test_roles_grant_the_schedulers_permissions() -> None:
    """HOST-1: admin is admin and ingest, sender is ingest, another role grants nothing."""
    assert _permissions(["admin"]) == {"admin", "ingest"}
    assert _permissions(["sender"]) == {"ingest"}
    assert _permissions(["viewer"]) == set()


@pytest.mark.clause("HOST-1")
def test_a_token_for_another_audience_or_another_scheme_is_refused() -> None:
    """HOST-1: a token minted for another audience, or Basic credentials, are refused (a 401)."""
    other = jwt.encode({"sub": "ops", "aud": "another-api", "roles": ["admin"]}, secret(), algorithm="HS256")
    for header in (f"Bearer {other}", "Basic b3BzOm9wcw=="):
        with pytest.raises(AuthenticationError):
            asyncio.run(HostTokens().authenticate(_connection(header)))
