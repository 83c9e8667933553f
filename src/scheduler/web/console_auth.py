"""The console's sign-in: an admin token pasted once becomes an HttpOnly cookie.

The cookie holds the token itself (so it expires with it and any replica can verify it):
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's request carries
it), ``Secure`` over https, scoped to the console's path, ``Max-Age`` = the token's
remaining lifetime. Each state-changing form carries a CSRF token derived from the
session's token with HMAC: a page of another origin can neither read the cookie nor
compute the value. The sign-in form itself uses a double-submit cookie.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import jwt
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from scheduler.web.auth import SCOPE_PERMISSIONS, TokenVerifier, scopes_of

COOKIE = "scheduler_console"
SIGNIN_COOKIE = "scheduler_console_signin"
CSRF_FIELD = "csrf"
_CSRF_KEY = b"scheduler-console-csrf-v1"

ConsoleEndpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class ConsoleSession:
    subject: str
    token: str
    expires_at: int

    @property
    def csrf(self) -> str:
        return csrf_for(self.token)


def csrf_for(token: str) -> str:
    return hmac.new(_CSRF_KEY, token.encode(), hashlib.sha256).hexdigest()


class NotAdmin(Exception):
    """A valid token that lacks the admin permission."""


async def session_from_token(verifier: TokenVerifier, token: str) -> ConsoleSession:
    """Verify ``token`` for the console: ``jwt.PyJWTError`` if invalid, ``NotAdmin`` if not admin.
    (A JWKS fetch runs off the event loop, as for the API.)"""
    claims: dict[str, Any] = await verifier.verify_async(token)
    permissions = {p for s in scopes_of(claims) for p in SCOPE_PERMISSIONS.get(s, ())}
    if "admin" not in permissions:
        raise NotAdmin(str(claims.get("sub")))
    return ConsoleSession(str(claims["sub"]), token, int(claims["exp"]))


def base_path(request: Request) -> str:
    """Where the app is mounted (``""`` standalone, ``/nudging`` when embedded)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def cookie_path(request: Request) -> str:
    return base_path(request) + "/console"


def set_session_cookie(request: Request, response: Response, session: ConsoleSession) -> None:
    response.set_cookie(
        COOKIE, session.token, max_age=max(session.expires_at - int(time.time()), 0),
        path=cookie_path(request), secure=request.url.scheme == "https", httponly=True, samesite="strict",
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, path=cookie_path(request), secure=request.url.scheme == "https",
                           httponly=True, samesite="strict")


def set_signin_nonce(request: Request, response: Response, nonce: str) -> None:
    response.set_cookie(SIGNIN_COOKIE, nonce, max_age=3600, path=cookie_path(request),
                        secure=request.url.scheme == "https", httponly=True, samesite="strict")


def signin_nonce_ok(request: Request, submitted: str | None) -> bool:
    expected = request.cookies.get(SIGNIN_COOKIE)
    return bool(expected and submitted and hmac.compare_digest(expected, submitted))


def csrf_ok(session: ConsoleSession, submitted: str | None) -> bool:
    return bool(submitted) and hmac.compare_digest(session.csrf, str(submitted))


def console_session(request: Request) -> ConsoleSession:
    session = request.scope.get("console_session")
    assert isinstance(session, ConsoleSession)
    return session


def console_admin(verifier_of: Callable[[], TokenVerifier],
                  forbidden: Callable[[Request, str], Response]) -> Callable[[ConsoleEndpoint], ConsoleEndpoint]:
    """Guard a console page: no (valid) cookie redirects to sign-in; a non-admin token is 403.

    The endpoint is marked ``permission = "console"`` for the route table in specs/routes.md.
    """

    def decorator(endpoint: ConsoleEndpoint) -> ConsoleEndpoint:
        @functools.wraps(endpoint)
        async def wrapper(request: Request) -> Response:
            token = request.cookies.get(COOKIE)
            try:
                if not token:
                    raise jwt.InvalidTokenError("no session")
                session = await session_from_token(verifier_of(), token)
            except jwt.PyJWTError:
                target = base_path(request) + "/console/sign-in"
                if request.method == "GET":
                    target += "?next=" + quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""), safe="")
                return RedirectResponse(target, status_code=303)
            except NotAdmin:
                return forbidden(request, "this token lacks the admin permission (nudging.admin)")
            request.scope["console_session"] = session
            return await endpoint(request)

        wrapper.permission = "console"  # type: ignore[attr-defined]
        return wrapper

    return decorator
