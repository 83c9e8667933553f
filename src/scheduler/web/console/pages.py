"""The operator console at ``/console``: server-rendered pages (Jinja2) for admins.

Overview (live over server-sent events), events with filters and keyset pagination, an
event's detail with its notifications and action history, reset and bulk reset (dry-run
count first, a required reason), cancel and bulk cancel (``cancel``), the audit trail
and the open sessions. Sign-in, sessions and CSRF: ``auth`` and ``scheduler.web.http.sessions``.
Pages are sent with a Content-Security-Policy that allows only the package's own script
and style, so even a bug in escaping could not run injected script.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import anyio
import jwt
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from scheduler.application import audit, commands, events, participants
from scheduler.database.database import Database
from scheduler.operations.overview import overview
from scheduler.types import Clock, EventStatus
from scheduler.web.console.bulk import bulk_action
from scheduler.web.console.cancel import cancel_routes
from scheduler.web.console.deliveries import delivery_routes
from scheduler.web.console.sign_in import (
    CSRF_FIELD,
    NotAdmin,
    clear_session_cookie,
    console_admin,
    console_session,
    csrf_ok,
    set_session_cookie,
    set_signin_nonce,
    signin_nonce_ok,
    verify_admin,
)
from scheduler.web.console.view import PACKAGE, ConsoleView
from scheduler.web.http.auth import TokenVerifier, token_problem
from scheduler.web.http.event_filter import CURSOR, EVENT_FILTER, event_query
from scheduler.web.http.params import (
    Endpoint,
    Param,
    Unprocessable,
    base_path,
    declares,
    path_param,
    query,
)
from scheduler.web.http.sessions import SessionStore
from scheduler.web.http.sse import Streams, wait_or_close

STATIC = PACKAGE / "static"
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
PAGE_SIZE = 50


class Console(ConsoleView):
    """The console's routes, bound to the service's database, clock and token verifier; its
    rendering is ``ConsoleView``'s, which the bulk and cancel routes are handed."""

    def __init__(self, database: Database, clock: Clock, verifier: TokenVerifier, store: SessionStore,
                 *, refresh_seconds: float = 2.0, stream_seconds: float = 300.0,
                 streams: Streams | None = None, max_body_bytes: int = 64 * 1024) -> None:
        super().__init__(database, clock, max_body_bytes=max_body_bytes)
        self.streams = streams or Streams()
        self.verifier = verifier
        self.store = store
        self.refresh_seconds = refresh_seconds
        self.stream_seconds = stream_seconds
        admin = console_admin(store)

        def guard(endpoint: Endpoint) -> Endpoint:
            return admin(self.refusals_as_page(endpoint))

        self.routes = [
            Route("/console", guard(self.overview_page), methods=["GET"]),
            Route("/console/stream", guard(self.stream), methods=["GET"]),
            Route("/console/events", guard(self.events_page), methods=["GET"]),
            Route("/console/events/{event_id}", guard(self.event_page), methods=["GET"]),
            Route("/console/events/{event_id}/reset", guard(self.reset), methods=["POST"]),
            Route("/console/bulk-reset", guard(self.bulk_page), methods=["GET"]),
            Route("/console/bulk-reset", guard(self.bulk_reset), methods=["POST"]),
            *cancel_routes(self, guard),
            *delivery_routes(self, guard),
            Route("/console/audit", guard(self.audit_page), methods=["GET"]),
            Route("/console/sessions", guard(self.sessions_page), methods=["GET"]),
            Route("/console/sessions/{session_id}/end", guard(self.end_session), methods=["POST"]),
            Route("/console/sign-out", guard(self.sign_out), methods=["POST"]),
            Route("/console/sign-in", self.refusals_as_page(self.sign_in_page), methods=["GET"]),
            Route("/console/sign-in", self.refusals_as_page(self.sign_in), methods=["POST"]),
            Route("/console/static/{name}", self.refusals_as_page(self.static), methods=["GET"]),
        ]

    # -- rendering (``ConsoleView``: page, form, csrf_refused) ---------------------------

    def refusals_as_page(self, endpoint: Endpoint) -> Endpoint:
        """A malformed query parameter or path segment is the 422 error page, naming each field."""

        @functools.wraps(endpoint)
        async def wrapper(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Unprocessable as exc:
                return self.page(request, "error.html", {"message": f"malformed request: {exc.detail}"}, 422)

        return wrapper

    @declares()
    async def static(self, request: Request) -> Response:
        # Only a file of the package's own static directory: any other name, a malformed or
        # overlong one included (past the file system's limit, ENAMETOOLONG), is not found.
        try:
            name = path_param(request, "name")
        except Unprocessable:
            return Response("not found", status_code=404, media_type="text/plain")
        path = STATIC / name
        if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not _is_file(path):
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(path.read_bytes(), media_type=STATIC_TYPES[path.suffix],
                        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})

    # -- sign in and out ---------------------------------------------------------------

    @declares(next=Param.string("the console page to show after sign-in", max_length=4000))
    async def sign_in_page(self, request: Request) -> Response:
        return self._sign_in_form(request, query(request)["next"] or "", None, 200)

    def _sign_in_form(self, request: Request, next_path: str, error: str | None, status: int) -> Response:
        nonce = secrets.token_urlsafe(24)
        page = self.page(request, "sign_in.html", {"next": next_path, "error": error, "nonce": nonce}, status)
        set_signin_nonce(request, page, nonce)
        return page

    @declares()
    async def sign_in(self, request: Request) -> Response:
        form = await self.form(request)
        if not signin_nonce_ok(request, _field(form, "nonce")):
            return self.page(request, "error.html", {"message": "the sign-in form expired: load it again"}, 403)
        token = (_field(form, "token") or "").strip()
        error, status = None, 200
        try:
            # the token is checked once, here, by the verifier (its exp by PyJWT's clock)
            admin = await verify_admin(self.verifier, token)
        except jwt.PyJWTError as exc:
            error, status = f"this token is not valid here: {token_problem(exc)}", 401
        except NotAdmin:
            error, status = "this token lacks the admin permission (nudging.admin)", 403
        if error is not None:
            return self._sign_in_form(request, _field(form, "next") or "", error, status)
        session = await run_in_threadpool(lambda: self.store.create(
            admin.subject, "admin", token_seconds_left=admin.seconds_left,
            user_agent=request.headers.get("user-agent")))
        target = _safe_next(request, _field(form, "next"))
        response = RedirectResponse(target, status_code=303)
        set_session_cookie(request, response, session)
        return response

    @declares()
    async def sign_out(self, request: Request) -> Response:
        """Delete the session: its cookie is refused by every replica from now on."""
        form = await self.form(request)
        if not csrf_ok(console_session(request), _field(form, CSRF_FIELD)):
            return self.csrf_refused(request)
        await run_in_threadpool(self.store.sign_out, console_session(request).secret)
        response = RedirectResponse(base_path(request) + "/console/sign-in", status_code=303)
        clear_session_cookie(request, response)
        return response

    # -- overview ----------------------------------------------------------------------

    @declares()
    async def overview_page(self, request: Request) -> Response:
        data = await run_in_threadpool(overview, self.database, self.clock.now())
        return self.page(request, "overview.html", {"o": data, "refresh_ms": int(self.refresh_seconds * 1000)})

    @declares(once=Param.flag("send one overview and end"))
    async def stream(self, request: Request) -> Response:
        """Server-sent events: the overview every ``refresh_seconds``; ``?once=1`` sends one.
        A stream ends after ``stream_seconds`` (the browser's EventSource reconnects), as soon
        as its session has ended, and at once when the server stops (with a retry hint)."""
        once = query(request)["once"]
        secret = console_session(request).secret

        async def overviews(closing: anyio.Event) -> AsyncIterator[str]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.stream_seconds
            while True:
                data = await run_in_threadpool(overview, self.database, self.clock.now())
                yield f"event: overview\ndata: {json.dumps(data, default=str)}\n\n"
                if once or loop.time() >= deadline:
                    return
                if await wait_or_close(closing, self.refresh_seconds):
                    return  # the server stops: the stream ends with a retry hint
                if await request.is_disconnected():
                    return
                # a session signed out or ended elsewhere stops its stream (not counted as use)
                if not await run_in_threadpool(self.store.is_open, secret, "admin"):
                    return

        return self.streams.response(overviews, headers={"Cache-Control": "no-store"})

    # -- events ------------------------------------------------------------------------

    @declares(**EVENT_FILTER, cursor=CURSOR)
    async def events_page(self, request: Request) -> Response:
        where = event_query(query(request), limit=PAGE_SIZE)  # pages of PAGE_SIZE
        try:
            # Pending rows come next due first, on the pending index (the claim's order);
            # the others newest change first, on the (updated_at, id) indexes.
            page = await run_in_threadpool(events.list_events, self.database, where, where.default_order())
        except events.QueryError as exc:
            return self.page(request, "error.html", {"message": str(exc)}, 422)
        chosen = where.as_json()
        next_link = urlencode({**chosen, "cursor": page.next_cursor.encode()}) if page.next_cursor else None
        return self.page(request, "events.html", {
            "rows": page.rows, "f": chosen, "statuses": [str(s) for s in EventStatus], "next_link": next_link,
            "filter_query": urlencode(chosen), "first_page": where.cursor is None,
            "pending": where.status == EventStatus.PENDING,
        })

    @declares(done=Param.string("the action just done, to confirm it"))
    async def event_page(self, request: Request) -> Response:
        event_id = path_param(request, "event_id")
        row, notifications, actions = await run_in_threadpool(self._detail, event_id)
        if row is None:
            return self.page(request, "error.html", {"message": "no scheduled event with that id"}, 404)
        changes = await run_in_threadpool(audit.event_history, self.database, event_id) or []
        facts = json.dumps(row.pop("facts"), indent=2, sort_keys=True, ensure_ascii=False)
        # the participant's zone and quiet hours: why a row is held until its not_before (QUIET-1)
        preferences = await run_in_threadpool(participants.get_preferences, self.database, row["user_id"])
        return self.page(request, "event.html", {"row": row, "facts": facts, "notifications": notifications,
                                                 "actions": actions, "changes": changes,
                                                 "preferences": preferences, "done": query(request)["done"]})

    def _detail(self, event_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
        found = events.get_event(self.database, event_id)
        if found is None:
            return None, [], []
        row = {**found.as_json(), "facts": found.facts}
        return row, audit.event_notifications(self.database, event_id), audit.event_actions(self.database, event_id)

    @declares()
    async def reset(self, request: Request) -> Response:
        form = await self.form(request)
        session = console_session(request)
        if not csrf_ok(session, _field(form, CSRF_FIELD)):
            return self.csrf_refused(request)
        event_id = path_param(request, "event_id")
        actor = commands.Actor(session.subject, "console")
        result = await run_in_threadpool(lambda: commands.reset(
            self.database, event_id, now=self.clock.now(), actor=actor, reason=_field(form, "reason")))
        if result.event is None:
            return self.page(request, "error.html", {"message": "no scheduled event with that id"}, 404)
        return RedirectResponse(f"{base_path(request)}/console/events/{event_id}?done=reset", status_code=303)

    # -- bulk reset --------------------------------------------------------------------

    @declares(**EVENT_FILTER)
    async def bulk_page(self, request: Request) -> Response:
        where = event_query(query(request))
        as_of = self.clock.now()
        count = await run_in_threadpool(commands.count_matching, self.database, where, commands.RESETTABLE)
        return self.page(request, "bulk_reset.html", {
            "f": where.as_json(), "count": count, "cap": commands.BULK_CAP, "as_of": as_of.isoformat(),
            "filter_query": urlencode(where.as_json()), "error": None, "reason": "",
        })

    @declares()
    async def bulk_reset(self, request: Request) -> Response:
        """Reset what the dry run counted (rows changed since are left alone), with a reason."""
        return await bulk_action(self, request, noun="reset", form_template="bulk_reset.html",
                                 done_template="bulk_done.html", command=commands.bulk_reset)

    # -- audit -------------------------------------------------------------------------

    @declares(before_id=Param.integer(1, 2**63 - 1, description="the previous page's last id"))
    async def audit_page(self, request: Request) -> Response:
        before_id = query(request)["before_id"]
        rows = await run_in_threadpool(
            lambda: audit.list_actions(self.database, limit=PAGE_SIZE + 1, before_id=before_id))
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        return self.page(request, "audit.html", {"rows": rows, "next_before": rows[-1]["id"] if more else None})

    # -- sessions ----------------------------------------------------------------------

    @declares(done=Param.string("the action just done, to confirm it"))
    async def sessions_page(self, request: Request) -> Response:
        """The open sessions of the console and the inbox, each with a button that ends it."""
        rows = await run_in_threadpool(self.store.list_open)
        return self.page(request, "sessions.html", {"rows": rows, "mine": console_session(request).id,
                                                    "done": query(request)["done"]})

    @declares()
    async def end_session(self, request: Request) -> Response:
        form = await self.form(request)
        session = console_session(request)
        if not csrf_ok(session, _field(form, CSRF_FIELD)):
            return self.csrf_refused(request)
        ended = await run_in_threadpool(lambda: self.store.end(
            path_param(request, "session_id"), actor=session.subject, source="console"))
        if ended is None:
            return self.page(request, "error.html", {"message": "no open session with that id"}, 404)
        if ended["id"] == session.id:  # the operator ended their own session: signed out
            response = RedirectResponse(base_path(request) + "/console/sign-in", status_code=303)
            clear_session_cookie(request, response)
            return response
        return RedirectResponse(f"{base_path(request)}/console/sessions?done=ended", status_code=303)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a name longer than the file system allows
        return False


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _safe_next(request: Request, raw: str | None) -> str:
    """Only a path inside the console (never another host) is followed after sign-in.

    Anything else lands on the console: another scheme or host (``https://h/``, ``//h/``,
    ``/\\h``, which browsers read as ``//h``), control characters (which browsers strip),
    a path beside the console (``/console.evil``, ``/consolex``) or one that climbs out of it
    with dot segments, literal or percent-encoded (browsers resolve ``%2e%2e`` as ``..``).
    """
    console = base_path(request) + "/console"
    if not raw or "\\" in raw or any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        return console
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc or not (parts.path == console or parts.path.startswith(console + "/")):
        return console
    if any(segment in (".", "..") for segment in unquote(parts.path).split("/")):
        return console
    return raw

