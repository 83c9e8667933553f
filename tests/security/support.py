"""Shared builders for the security tests: the route table, forged tokens, keys."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.routing import Route

from tests.conftest import TEST_SECRET

ROUTES_SPEC = Path(__file__).resolve().parents[2] / "specs" / "routes.md"
PERMISSIONS = ("open", "participant", "ingest", "admin", "console", "inbox")
_ROW = re.compile(r"^\|\s*`?(GET|POST|PUT|PATCH|DELETE)`?\s*\|\s*`([^`]+)`\s*\|\s*`?(\w+)`?\s*\|")


@dataclass(frozen=True, order=True)
class RouteEntry:
    method: str
    path: str
    permission: str

    def concrete_path(self) -> str:
        """The path with every ``{param}`` filled in, so the route can be called."""
        return re.sub(r"\{[^}]+\}", "some-id", self.path)


def spec_table() -> list[RouteEntry]:
    """The route table in specs/routes.md: one row per method and path."""
    entries = []
    for line in ROUTES_SPEC.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match:
            entries.append(RouteEntry(match[1], match[2], match[3]))
    return sorted(entries)


def app_table(routes: list[Any]) -> list[RouteEntry]:
    """What the running app serves: each method of each route, with the permission its
    endpoint carries (``scheduler.web.http.auth.require`` sets ``.permission``), else ``open``."""
    entries = []
    for route in routes:
        assert isinstance(route, Route), f"unexpected route type {type(route).__name__}: {route!r}"
        permission = getattr(route.endpoint, "permission", "open")
        for method in sorted((route.methods or set()) - {"HEAD"}):
            entries.append(RouteEntry(method, route.path_format, permission))
    return sorted(entries)


def claims(**overrides: Any) -> dict[str, Any]:
    """A valid admin token's claims, with some replaced (``None`` deletes a claim)."""
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "operator-1", "aud": "svc-nudging", "iat": now, "nbf": now, "exp": now + 600,
        "scope": "nudging.admin",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def hs256(payload: dict[str, Any], secret: str = TEST_SECRET) -> str:
    return jwt.encode(payload, secret, algorithm="HS256")


@cache
def rsa_private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@cache
def other_rsa_private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey | None = None) -> str:
    key = key or rsa_private_key()
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def rs256(payload: dict[str, Any], key: rsa.RSAPrivateKey | None = None) -> str:
    return jwt.encode(payload, key or rsa_private_key(), algorithm="RS256")


def unsigned(payload: dict[str, Any]) -> str:
    """``alg: none``: a token with no signature at all."""
    return jwt.encode(payload, None, algorithm="none")  # type: ignore[arg-type]  # alg none has no key


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
