"""The participant's inbox routes: ``/me/notifications``, its live stream, the ``/inbox`` page
and the page's session (``/inbox/session``, ``scheduler.web.inbox_session``).

A page reads the caller's delivered notifications newest first (keyset ``?before=``); the
stream replays what the client missed (``Last-Event-ID`` or ``?after=``) and then follows
the process's ``Inbox`` hub (``scheduler.web.inbox``). A participant reads their own
inbox; an admin may name another (``?user_id=``). The ``/me`` routes take a bearer token or
the inbox page's session cookie; a stream opened by the cookie stops when its session ends.
"""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from scheduler.core.store import _jsonable
from scheduler.database.queries import statement
from scheduler.web.auth import PARTICIPANT, Principal, TokenVerifier, require
from scheduler.web.http import Unprocessable, respond, text_param
from scheduler.web.inbox import Inbox, sse_stream, stream_head
from scheduler.web.inbox_session import inbox_session_routes, session_check, with_inbox_session
from scheduler.web.schemas import InboxPageOut
from scheduler.web.sessions import SessionStore

PAGE = Path(__file__).parent / "pages" / "inbox.html"


def page_headers(html: str) -> dict[str, str]:
    """The ``/inbox`` page's headers: a Content-Security-Policy as strict as the console's.

    The page signs a participant in with a token and shows text a sender wrote, so nothing but its
    own inline script and style may run (allowed by their hashes, not ``'unsafe-inline'``),
    it talks only to its own origin, and no other site may frame it.
    """

    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
        digests = (base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() for body in found)
        return " ".join(f"'sha256-{d}'" for d in digests) or "'none'"

    return {
        "Content-Security-Policy": f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
                                   "img-src 'self'; connect-src 'self'; form-action 'self'; "
                                   "frame-ancestors 'none'; base-uri 'none'",
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _whose(request: Request) -> str:
    """The participant whose inbox this is: the token's subject; an admin may name another."""
    user = request.user
    assert isinstance(user, Principal)
    wanted = text_param("user_id", request.query_params.get("user_id") or None)
    if wanted is None or wanted == user.subject:
        return user.subject
    if "admin" not in request.auth.scopes:
        raise HTTPException(403, "missing permission: nudging.admin (admin) to read another participant's inbox")
    return wanted


def _cursor(raw: str | None) -> tuple[datetime | None, str | None]:
    if raw is None:
        return None, None
    at, sep, note_id = raw.partition("~")
    try:
        parsed = datetime.fromisoformat(at)
    except ValueError:
        parsed = None
    if not sep or parsed is None or parsed.tzinfo is None or not note_id:
        raise Unprocessable.field("before", "not a cursor from this API (use the previous page's next)")
    text_param("before", note_id)
    return parsed, note_id


def _seq(name: str, raw: str | None) -> int:
    if raw is None or raw == "":
        return -1
    if not raw.isdigit() or len(raw) > 18:
        raise Unprocessable.field(name, "must be a stream event id (a whole number)")
    return int(raw)


def inbox_routes(*, sessions: sessionmaker[Session], inbox: Inbox, store: SessionStore, verifier: TokenVerifier,
                 max_body_bytes: int) -> list[BaseRoute]:
    """``/me/notifications``, its stream, the ``/inbox`` page and its session, over
    ``sessions``, the process's ``inbox`` hub and the web sessions' ``store``."""

    @require(PARTICIPANT)
    async def my_notifications(request: Request) -> Response:
        """The caller's delivered notifications, newest first, keyset-paginated (?before=)."""
        user_id = _whose(request)
        before_at, before_id = _cursor(request.query_params.get("before") or None)
        raw_limit = request.query_params.get("limit") or "50"
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 200:
            raise Unprocessable.field("limit", "must be a whole number from 1 to 200")
        limit = int(raw_limit)

        def read() -> list[dict[str, Any]]:
            with sessions.begin() as session:
                return [_jsonable(r) for r in session.execute(
                    statement("participant_notifications"),
                    {"user_id": user_id, "before_at": before_at, "before_id": before_id, "limit": limit},
                ).mappings()]

        items = await run_in_threadpool(read)
        last = items[-1] if len(items) == limit else None
        page = InboxPageOut.model_validate(
            {"items": items, "next": f"{last['created_at']}~{last['id']}" if last else None})
        return respond(page)

    @require(PARTICIPANT)
    async def my_stream(request: Request) -> Response:
        """Server-sent events; ``Last-Event-ID`` (or ``?after=``) replays what was missed."""
        user_id = _whose(request)
        after = _seq("Last-Event-ID", request.headers.get("last-event-id"))
        if after < 0:
            after = _seq("after", request.query_params.get("after"))
        head = await run_in_threadpool(stream_head, sessions)
        # no position: from now on; a position past the head (a restored database) would
        # hide every new notification until the numbers caught up: start from the head
        if after < 0 or after > head:
            after = head
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(sse_stream(inbox, user_id, after, session_check(store, request)),
                                 media_type="text/event-stream", headers=headers)

    page_html = PAGE.read_text()
    headers = page_headers(page_html)

    async def page(request: Request) -> Response:
        """The participant's page: it holds no data; the token it is given reads the rest."""
        return HTMLResponse(page_html, headers=headers)

    return [
        Route("/me/notifications", with_inbox_session(store, my_notifications), methods=["GET"]),
        Route("/me/notifications/stream", with_inbox_session(store, my_stream), methods=["GET"]),
        Route("/inbox", page, methods=["GET"]),
        *inbox_session_routes(store, verifier, max_body_bytes),
    ]

