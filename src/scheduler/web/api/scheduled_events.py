"""The routes over stored rows: list, read, reset, cancel and history of scheduled events.

Each route is a thin adapter over ``scheduler.application``: it parses what the caller
sent, runs the query or the command with the caller as its actor, and answers the record
as JSON. ``EventRoutes`` receives the database and the clock, nothing else.

Cancel puts a ``pending`` or ``failed`` row in the terminal status ``cancelled``; the claim
reads only ``pending`` rows, so it never takes one, and a re-post of the key re-arms it as
REQ-0064 says for any row. The command locks the row first, so a cancel that meets a batch
dispatching the row waits for it: either the batch committed first and the cancel answers
409, or the cancel committed first and no claim takes the row.
"""

from __future__ import annotations

from functools import partial
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import audit, commands, events
from scheduler.database.database import Database
from scheduler.types import Clock
from scheduler.web.http.answers import (
    CancelConflictOut,
    HistoryEntryOut,
    ScheduledEventOut,
    respond,
)
from scheduler.web.http.auth import actor_of, require
from scheduler.web.http.event_filter import CURSOR, EVENT_FILTER, event_query
from scheduler.web.http.params import Param, Unprocessable, declares, path_param, query, query_pairs

LIMIT = Param.integer(1, events.MAX_LIMIT, default=100, description="at most this many rows")


def _out(record: events.EventRecord) -> ScheduledEventOut:
    return ScheduledEventOut.model_validate(record.as_json())


class EventRoutes:
    """``/admin/scheduled-events`` (GET), ``.../{event_id}`` (GET, DELETE), ``.../reset``,
    ``.../history`` and ``.../by-key/{external_key}`` (DELETE)."""

    def __init__(self, *, database: Database, clock: Clock) -> None:
        self.database = database
        self.clock = clock

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/admin/scheduled-events", self.list_events, methods=["GET"]),
            Route("/admin/scheduled-events/{event_id}", self.get_event, methods=["GET"]),
            Route("/admin/scheduled-events/{event_id}/reset", self.reset, methods=["POST"]),
            Route("/admin/scheduled-events/{event_id}", self.cancel_by_id, methods=["DELETE"]),
            Route("/admin/scheduled-events/by-key/{external_key:path}", self.cancel_by_key, methods=["DELETE"]),
            Route("/admin/scheduled-events/{event_id}/history", self.history, methods=["GET"]),
        ]

    @require("admin")
    @declares(**EVENT_FILTER, cursor=CURSOR, limit=LIMIT)
    async def list_events(self, request: Request) -> Response:
        """Rows by the one query model, newest change first; the next page's cursor is in
        ``X-Next-Cursor`` and ``Link`` (rel="next"), so the body stays a plain list."""
        page = await run_in_threadpool(self._page, event_query(query(request)))
        response = respond([ScheduledEventOut.model_validate(r) for r in page.rows])
        if page.next_cursor is not None:
            token = page.next_cursor.encode()
            params = [(k, v) for k, v in query_pairs(request.scope.get("query_string", b""))
                      if k != "cursor" and v != ""] + [("cursor", token)]
            response.headers["X-Next-Cursor"] = token
            response.headers["Link"] = f'<{request.url.replace(query=urlencode(params))}>; rel="next"'
        return response

    def _page(self, where: events.EventQuery) -> events.EventPage:
        try:
            return events.list_events(self.database, where, events.EventOrder.CHANGED)
        except events.QueryError as exc:  # a cursor of another list
            raise Unprocessable.field(exc.field, exc.problem) from None

    @require("admin")
    @declares()
    async def get_event(self, request: Request) -> Response:
        event_id = path_param(request, "event_id")
        row = await run_in_threadpool(events.get_event, self.database, event_id)
        if row is None:
            raise HTTPException(404, "no scheduled event with that id")
        return respond(_out(row))

    @require("admin")
    @declares()
    async def reset(self, request: Request) -> Response:
        """The reset by hand: the row goes back to pending, cleared (any status, a cancelled
        one too: DEC-12); audited with the token's subject."""
        event_id = path_param(request, "event_id")
        actor = commands.Actor(request.user.display_name, "api")
        result = await run_in_threadpool(
            lambda: commands.reset(self.database, event_id, now=self.clock.now(), actor=actor))
        if result.event is None:
            raise HTTPException(404, "no scheduled event with that id")
        return respond(_out(result.event))

    async def _cancel(self, request: Request, **row: str) -> Response:
        actor = commands.Actor(actor_of(request) or "unknown", "api")
        result = await run_in_threadpool(
            partial(commands.cancel, self.database, now=self.clock.now(), actor=actor, **row))
        if result.event is None:
            raise HTTPException(404, "no scheduled event with that id or key")
        if result.outcome == "dispatched":
            conflict = CancelConflictOut(detail="already dispatched: a dispatched event cannot be cancelled",
                                         event=_out(result.event))
            return respond(conflict, 409)
        if result.outcome == "expired":  # EXP-3: as final as dispatched
            conflict = CancelConflictOut(detail="already expired: an expired event cannot be cancelled",
                                         event=_out(result.event))
            return respond(conflict, 409)
        return respond(_out(result.event))

    @require("ingest")
    @declares()
    async def cancel_by_id(self, request: Request) -> Response:
        """Cancel a pending or failed row (200 with the row; 409 once dispatched or expired)."""
        return await self._cancel(request, event_id=path_param(request, "event_id"))

    @require("ingest")
    @declares()
    async def cancel_by_key(self, request: Request) -> Response:
        """Cancel the row of an external key, as cancel_by_id does."""
        return await self._cancel(request, external_key=path_param(request, "external_key"))

    @require("admin")
    @declares()
    async def history(self, request: Request) -> Response:
        """Every change of a row, oldest first."""
        event_id = path_param(request, "event_id")
        entries = await run_in_threadpool(audit.event_history, self.database, event_id)
        if entries is None:
            raise HTTPException(404, "no scheduled event with that id")
        return respond([HistoryEntryOut.model_validate(entry) for entry in entries])
