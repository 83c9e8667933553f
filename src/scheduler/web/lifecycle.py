"""An event's whole life: cancel it, and read its history (issue 10).

Cancel puts a ``pending`` or ``failed`` row in the terminal status ``cancelled``; the claim
reads only ``pending`` rows, so it never takes one. A re-post of the key re-arms it as
REQ-0064 says for any row. The cancel locks the row first (``SELECT ... FOR UPDATE``): a
batch that is dispatching the row holds that lock, so the cancel waits for the batch and
then reads the row's newest version. A row is therefore never both dispatched and
cancelled: either the batch committed first and the cancel answers 409, or the cancel
committed first and the claim (which skips locked rows and reads only pending ones)
never takes it.

History is appended by a trigger on ``scheduled_events`` (migration 0003) in the same
transaction as each change; these functions only name the change and the actor.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import commands
from scheduler.application.audit import event_history
from scheduler.web.auth import Principal, require
from scheduler.web.http import respond, text_param
from scheduler.web.schemas import (
    CancelConflictOut,
    HistoryEntryOut,
    ScheduledEventOut,
)

if TYPE_CHECKING:
    from scheduler.web.app import SchedulerService

def actor_of(request: Request) -> str | None:
    """Who made a change: the token's subject."""
    user = request.user
    return user.subject if isinstance(user, Principal) else None


def lifecycle_routes(service: SchedulerService) -> list[BaseRoute]:
    """Cancel (by id, by key) and history, bound to ``service``'s database and clock."""

    def answer(result: commands.CancelResult) -> Response:
        if result.event is None:
            raise HTTPException(404, "no scheduled event with that id or key")
        event = ScheduledEventOut.model_validate(result.event.as_json())
        if result.outcome == "dispatched":
            conflict = CancelConflictOut(detail="already dispatched: a dispatched event cannot be cancelled",
                                         event=event)
            return respond(conflict, 409)
        return respond(event)

    async def cancel(request: Request, **row: str | None) -> Response:
        actor = commands.Actor(actor_of(request) or "unknown", "api")
        result = await run_in_threadpool(
            partial(commands.cancel, service.sessions, now=service.clock.now(), actor=actor, **row)
        )
        return answer(result)

    @require("ingest")
    async def cancel_by_id(request: Request) -> Response:
        """Cancel a pending or failed row (200 with the row; 409 once dispatched)."""
        return await cancel(request, event_id=text_param("event_id", str(request.path_params["event_id"])))

    @require("ingest")
    async def cancel_by_key(request: Request) -> Response:
        """Cancel the row of an external key, as cancel_by_id does."""
        return await cancel(
            request, external_key=text_param("external_key", str(request.path_params["external_key"]))
        )

    @require("admin")
    async def history(request: Request) -> Response:
        """Every change of a row, oldest first."""
        event_id = text_param("event_id", str(request.path_params["event_id"]))
        assert event_id is not None
        entries = await run_in_threadpool(event_history, service.sessions, event_id)
        if entries is None:
            raise HTTPException(404, "no scheduled event with that id")
        return respond([HistoryEntryOut.model_validate(entry) for entry in entries])

    return [
        Route("/admin/scheduled-events/{event_id}", cancel_by_id, methods=["DELETE"]),
        Route("/admin/scheduled-events/by-key/{external_key}", cancel_by_key, methods=["DELETE"]),
        Route("/admin/scheduled-events/{event_id}/history", history, methods=["GET"]),
    ]
