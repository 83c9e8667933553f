"""The inbox page's session: a participant pastes a token once; the page keeps none.

``POST /inbox/session`` verifies the token (any valid token: its ``sub`` is the participant)
and opens a ``participant`` session in the database (``scheduler.web.http.sessions``); the answer
sets the ``scheduler_inbox`` cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over https)
holding only the session's random id. The page clears its text box and forgets the token; it
reads ``/me/notifications`` and the stream with the cookie alone. The cookie is accepted on the
routes under ``/me`` only, and there it grants what a participant's token grants (no scope),
whatever the token that opened it could do. ``DELETE /inbox/session`` (with the session's
CSRF token in ``X-CSRF-Token``) signs out: the session is deleted, and every replica refuses
the cookie from then on. A JSON body is required to sign in, so a form on another site cannot
sign a browser in as someone else.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import jwt
from starlette.authentication import AuthCredentials
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from scheduler.web.http.answers import InboxSessionOut, respond
from scheduler.web.http.auth import Endpoint, Principal, TokenVerifier, token_problem
from scheduler.web.http.bodies import InboxSignInIn, parse_body, read_json
from scheduler.web.http.params import base_path, declares
from scheduler.web.http.sessions import SessionStore, WebSession

COOKIE = "scheduler_inbox"
CSRF_HEADER = "x-csrf-token"
INBOX_SESSION = "inbox"  # the route table's name for "the inbox page's session cookie"


def _cookie_path(request: Request) -> str:
    # /inbox and /me/... share only the app's own root
    return base_path(request) + "/"


def _out(session: WebSession) -> InboxSessionOut:
    return InboxSessionOut(subject=session.subject, expires_at=session.expires_at,
                           idle_seconds=session.idle_seconds, csrf=session.csrf)


def _refused(status: int, detail: str, request: Request | None = None) -> Response:
    response = JSONResponse({"detail": detail}, status_code=status)
    if request is not None and request.cookies.get(COOKIE):
        _clear(request, response)
    return response


def _clear(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, path=_cookie_path(request), secure=request.url.scheme == "https",
                           httponly=True, samesite="strict")


def with_inbox_session(store: SessionStore, endpoint: Endpoint) -> Endpoint:
    """Let a ``/me`` endpoint also serve the inbox page's session cookie. A request with an
    ``Authorization`` header is left to the bearer token alone (a bad token stays a 401)."""

    @functools.wraps(endpoint)
    async def wrapper(request: Request) -> Response:
        secret = request.cookies.get(COOKIE)
        if secret and "authorization" not in request.headers:
            session = await run_in_threadpool(store.resolve, secret, "participant")
            if session is not None:
                # a participant's powers only: no scope, whatever the signed-in token held
                request.scope["user"] = Principal(session.subject, ())
                request.scope["auth"] = AuthCredentials(["authenticated"])
                request.scope["inbox_session"] = session
        response: Response = await endpoint(request)
        return response

    return wrapper


def session_check(store: SessionStore, request: Request) -> Callable[[], Awaitable[bool]] | None:
    """For a request served by the session cookie: a check that its session is still open
    (a long stream asks it as it runs); None for a bearer token's request."""
    session = request.scope.get("inbox_session")
    if not isinstance(session, WebSession):
        return None
    secret = session.secret

    async def still_open() -> bool:
        return await run_in_threadpool(store.is_open, secret, "participant")

    return still_open


def inbox_session_routes(store: SessionStore, verifier: TokenVerifier, max_body_bytes: int) -> list[BaseRoute]:
    """``/inbox/session``: sign in (POST), who am I (GET), sign out (DELETE)."""

    @declares()
    async def sign_in(request: Request) -> Response:
        """Open a participant session for a valid token; the cookie holds only the session's id."""
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            return _refused(415, "send the token as JSON (Content-Type: application/json)")
        body = parse_body(InboxSignInIn, await read_json(request, max_body_bytes))
        try:
            claims: dict[str, Any] = await verifier.verify_async(body.token.strip())
        except jwt.PyJWTError as exc:
            return _refused(401, token_problem(exc))
        seconds_left = verifier.seconds_left(claims)
        session = await run_in_threadpool(lambda: store.create(
            str(claims["sub"]), "participant", token_seconds_left=seconds_left,
            user_agent=request.headers.get("user-agent")))
        response = respond(_out(session), 201)
        lifetime = max(int((session.expires_at - session.created_at).total_seconds()), 0)
        response.set_cookie(COOKIE, session.secret, max_age=lifetime,
                            path=_cookie_path(request), secure=request.url.scheme == "https", httponly=True,
                            samesite="strict")
        return response

    @declares()
    async def current(request: Request) -> Response:
        """The open session of this browser (the page's CSRF token after a reload), or 401."""
        session = await run_in_threadpool(store.resolve, request.cookies.get(COOKIE), "participant")
        if session is None:
            return _refused(401, "no inbox session: sign in with a token", request)
        return respond(_out(session))

    @declares()
    async def sign_out(request: Request) -> Response:
        """Delete the session (it needs its CSRF token): every replica refuses the cookie from now on."""
        session = await run_in_threadpool(store.resolve, request.cookies.get(COOKIE), "participant")
        if session is None:
            return _refused(401, "no inbox session: sign in with a token", request)
        if not session.csrf_ok(request.headers.get(CSRF_HEADER)):
            return _refused(403, "missing or wrong X-CSRF-Token: reload the page and try again")
        await run_in_threadpool(store.sign_out, session.secret)
        response = Response(status_code=204)
        _clear(request, response)
        return response

    current.permission = INBOX_SESSION  # type: ignore[attr-defined]
    sign_out.permission = INBOX_SESSION  # type: ignore[attr-defined]
    return [
        Route("/inbox/session", sign_in, methods=["POST"]),
        Route("/inbox/session", current, methods=["GET"]),
        Route("/inbox/session", sign_out, methods=["DELETE"]),
    ]


__all__ = ["COOKIE", "CSRF_HEADER", "inbox_session_routes", "session_check", "with_inbox_session"]
