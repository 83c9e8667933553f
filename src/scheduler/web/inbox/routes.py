"""The participant's inbox routes: ``/me/notifications``, its live stream, the ``/inbox`` page
and the page's session (``/inbox/session``, ``scheduler.web.inbox.session``).

A page reads the caller's delivered notifications newest first (keyset ``?before=``); the
stream replays what the client missed (``Last-Event-ID`` or ``?after=``) and then follows
the process's ``Inbox`` hub (``scheduler.web.inbox.hub``). A participant reads their own
inbox; an admin may name another (``?user_id=``). The ``/me`` routes take a bearer token or
the inbox page's session cookie; a stream opened by the cookie stops when its session ends.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from scheduler.database.database import Database, row_as_json
from scheduler.web.http.answers import InboxPageOut, respond
from scheduler.web.http.auth import CHALLENGE, PARTICIPANT, TokenVerifier, require, subject_of
from scheduler.web.http.params import Param, declares, query, stream_id
from scheduler.web.http.sessions import SessionStore
from scheduler.web.http.sse import Streams
from scheduler.web.inbox.hub import Inbox, sse_stream, stream_head
from scheduler.web.inbox.session import inbox_session_routes, session_check, with_inbox_session

PAGE = Path(__file__).parent / "pages" / "inbox.html"


def page_headers(html: str) -> dict[str, str]:
    """The ``/inbox`` page's headers: a Content-Security-Policy as strict as the console's.

    The page signs a participant in with a token and shows text a sender wrote, so nothing but its
    own inline script and style may run (allowed by their hashes, not ``'unsafe-inline'``),
    it talks only to its own origin, its only worker is its own service worker (web push,
    ``web.inbox.push``), and no other site may frame it.
    """

    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
        digests = (base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() for body in found)
        return " ".join(f"'sha256-{d}'" for d in digests) or "'none'"

    return {
        "Content-Security-Policy": f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
                                   "img-src 'self'; connect-src 'self'; worker-src 'self'; form-action 'self'; "
                                   "frame-ancestors 'none'; base-uri 'none'",
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _whose(request: Request) -> str:
    """The participant whose inbox this is: the token's subject; an admin may name another."""
    subject = subject_of(request.user)
    if subject is None:
        raise HTTPException(401, "missing bearer token", headers=CHALLENGE)
    wanted: str | None = query(request)["user_id"]
    if wanted is None or wanted == subject:
        return subject
    if "admin" not in request.auth.scopes:
        raise HTTPException(403, "missing permission: nudging.admin (admin) to read another participant's inbox")
    return wanted


USER_ID = Param.string("another participant's inbox (admin only)")


def page_with_push_key(html: str, vapid_public_key: str | None) -> str:
    """The page offering web push with ``vapid_public_key`` (its ``applicationServerKey``, the
    base64url of a P-256 point: nothing to escape), or not offering it without one."""
    return html.replace('<meta name="vapid-public-key" content="">',
                        f'<meta name="vapid-public-key" content="{vapid_public_key or ""}">')


def inbox_routes(*, database: Database, inbox: Inbox, store: SessionStore, verifier: TokenVerifier,
                 max_body_bytes: int, streams: Streams, vapid_public_key: str | None = None) -> list[BaseRoute]:
    """``/me/notifications``, its stream, the ``/inbox`` page and its session, over
    ``database``, the process's ``inbox`` hub, the web sessions' ``store`` and its open
    ``streams`` (ended at once when the server stops); the page offers web push with
    ``vapid_public_key`` (PUSH-9)."""

    @require(PARTICIPANT)
    @declares(user_id=USER_ID, before=Param.cursor("the previous page's next"),
              limit=Param.integer(1, 200, default=50, description="at most this many notifications"))
    async def my_notifications(request: Request) -> Response:
        """The caller's delivered notifications, newest first, keyset-paginated (?before=)."""
        user_id = _whose(request)
        before_at, before_id = query(request)["before"] or (None, None)
        limit = query(request)["limit"]

        def read() -> list[dict[str, Any]]:
            with database.begin() as session:
                return [row_as_json(r) for r in database.inbox.participant_notifications(
                    session, user_id=user_id, before_at=before_at, before_id=before_id, limit=limit)]

        items = await run_in_threadpool(read)
        last = items[-1] if len(items) == limit else None
        page = InboxPageOut.model_validate(
            {"items": items, "next": f"{last['created_at']}~{last['id']}" if last else None})
        return respond(page)

    @require(PARTICIPANT)
    @declares(user_id=USER_ID, after=Param.stream_id("replay what came after this event id (as Last-Event-ID)"))
    async def my_stream(request: Request) -> Response:
        """Server-sent events; ``Last-Event-ID`` (or ``?after=``) replays what was missed."""
        header = request.headers.get("last-event-id")
        after = stream_id("Last-Event-ID", header) if header else query(request)["after"]
        user_id = _whose(request)
        if after is None:
            after = -1
        head = await run_in_threadpool(stream_head, database)
        # no position: from now on; a position past the head (a restored database) would
        # hide every new notification until the numbers caught up: start from the head
        if after < 0 or after > head:
            after = head
        check = session_check(store, request)
        return streams.response(lambda closing: sse_stream(inbox, user_id, after, closing, check),
                                headers={"Cache-Control": "no-cache"})

    page_html = page_with_push_key(PAGE.read_text(), vapid_public_key)
    headers = page_headers(page_html)

    @declares()
    async def page(request: Request) -> Response:
        """The participant's page: it holds no data; the token it is given reads the rest."""
        return HTMLResponse(page_html, headers=headers)

    return [
        Route("/me/notifications", with_inbox_session(store, my_notifications), methods=["GET"]),
        Route("/me/notifications/stream", with_inbox_session(store, my_stream), methods=["GET"]),
        Route("/inbox", page, methods=["GET"]),
        *inbox_session_routes(store, verifier, max_body_bytes),
    ]

