"""The console's sign-in: an admin token pasted once opens a session kept in the database.

The token is verified once, at sign-in; the service then stores a session
(``scheduler.web.http.sessions``) and gives the browser only its random id in the
``scheduler_console`` cookie: ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no
other site's request carries it), ``Secure`` over https, scoped to the console's path,
``Max-Age`` = the session's absolute lifetime. The cookie is not a token: the API refuses it,
and once the session is deleted (sign-out, or an admin ending it) every replica refuses it.
Each state-changing form carries the session's CSRF token (an HMAC of its id): a page of
another origin can neither read the cookie nor compute the value. The sign-in form itself
uses a double-submit cookie.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from scheduler.web.http.auth import TokenVerifier
from scheduler.web.http.params import base_path
from scheduler.web.http.sessions import SessionStore, WebSession

COOKIE = "scheduler_console"
SIGNIN_COOKIE = "scheduler_console_signin"
CSRF_FIELD = "csrf"

ConsoleEndpoint = Callable[[Request], Awaitable[Response]]
ConsoleGuard = Callable[[ConsoleEndpoint], ConsoleEndpoint]


@dataclass(frozen=True)
class VerifiedAdmin:
    """A token checked at sign-in: whose it is and how long it stays valid (in seconds)."""

    subject: str
    seconds_left: float


class NotAdmin(Exception):
    """A valid token that lacks the admin permission."""


async def verify_admin(verifier: TokenVerifier, token: str) -> VerifiedAdmin:
    """Verify ``token`` for the console: ``jwt.PyJWTError`` if invalid, ``NotAdmin`` if not admin.
    (A JWKS fetch runs off the event loop, as for the API.)"""
    claims: dict[str, Any] = await verifier.verify_async(token)
    if "admin" not in verifier.grants.permissions(claims):
        raise NotAdmin(str(claims.get("sub")))
    return VerifiedAdmin(str(claims["sub"]), verifier.seconds_left(claims))


def cookie_path(request: Request) -> str:
    return base_path(request) + "/console"


def set_session_cookie(request: Request, response: Response, session: WebSession) -> None:
    max_age = int((session.expires_at - session.created_at).total_seconds())
    response.set_cookie(
        COOKIE, session.secret, max_age=max(max_age, 0),
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


def csrf_ok(session: WebSession, submitted: str | None) -> bool:
    return session.csrf_ok(submitted)


def console_session(request: Request) -> WebSession:
    session = request.scope.get("console_session")
    assert isinstance(session, WebSession)
    return session


def console_admin(store: SessionStore) -> ConsoleGuard:
    """Guard a console page: without an open admin session (no cookie, an unknown, signed-out,
    ended, expired or idle one) it redirects to sign-in.

    The endpoint is marked ``permission = "console"`` for the route table in specs/routes.md.
    """

    def decorator(endpoint: ConsoleEndpoint) -> ConsoleEndpoint:
        @functools.wraps(endpoint)
        async def wrapper(request: Request) -> Response:
            secret = request.cookies.get(COOKIE)
            session = await run_in_threadpool(store.resolve, secret, "admin") if secret else None
            if session is None:
                if "text/event-stream" in request.headers.get("accept", ""):
                    # An EventSource (the overview's live stream reconnecting after a sign-out)
                    # is told to stop (204), not sent to the sign-in page: rendering that page
                    # would replace the sign-in nonce of a form open in another tab.
                    response = Response(status_code=204)
                    if secret:
                        clear_session_cookie(request, response)
                    return response
                target = base_path(request) + "/console/sign-in"
                if request.method == "GET":
                    asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    target += "?next=" + quote(asked, safe="")
                response = RedirectResponse(target, status_code=303)
                if secret:
                    clear_session_cookie(request, response)  # a dead session's cookie is of no use
                return response
            request.scope["console_session"] = session
            return await endpoint(request)

        wrapper.permission = "console"  # type: ignore[attr-defined]
        return wrapper

    return decorator
