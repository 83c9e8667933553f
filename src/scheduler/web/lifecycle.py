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

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.core.store import _jsonable, event_to_json, set_change_context
from scheduler.database.queries import statement
from scheduler.web.auth import Principal, require
from scheduler.web.http import respond
from scheduler.web.params import declares, text_param
from scheduler.web.schemas import (
    CancelConflictOut,
    HistoryEntryOut,
    ScheduledEventOut,
)

if TYPE_CHECKING:
    from scheduler.web.app import SchedulerService

CancelOutcome = Literal["cancelled", "already_cancelled", "dispatched", "missing"]


@dataclass(frozen=True)
class CancelResult:
    """What a cancel found: the row (None when missing) and what became of it."""

    outcome: CancelOutcome
    row: dict[str, Any] | None


def cancel_event(
    sessions: sessionmaker[Session],
    *,
    now: datetime,
    event_id: str | None = None,
    external_key: str | None = None,
    actor: str | None = None,
) -> CancelResult:
    """Cancel the row named by ``event_id`` or ``external_key``, in one transaction.

    Cancelling twice answers the same row and writes nothing the second time; a
    dispatched row stays dispatched (the caller answers 409).
    """
    if (event_id is None) == (external_key is None):
        raise ValueError("name the row by exactly one of event_id and external_key")
    with sessions.begin() as session:
        if event_id is not None:
            locked = session.execute(statement("lock_event_by_id"), {"id": event_id}).mappings().first()
        else:
            locked = session.execute(
                statement("lock_event_by_key"), {"external_key": external_key}
            ).mappings().first()
        if locked is None:
            return CancelResult("missing", None)
        if locked["status"] == "dispatched":
            return CancelResult("dispatched", event_to_json(locked))
        if locked["status"] == "cancelled":
            return CancelResult("already_cancelled", event_to_json(locked))
        set_change_context(session, "cancelled", actor)
        row = session.execute(statement("cancel_event"), {"id": locked["id"], "now": now}).mappings().one()
        return CancelResult("cancelled", event_to_json(row))


def event_history(sessions: sessionmaker[Session], event_id: str) -> list[dict[str, Any]] | None:
    """Every change of a row, oldest first; None when neither the row nor any history exists."""
    with sessions.begin() as session:
        entries = [_jsonable(r) for r in session.execute(statement("event_history"), {"id": event_id}).mappings()]
        if entries:
            return entries
        exists = session.execute(statement("get_event"), {"id": event_id}).first()
        return [] if exists is not None else None


def actor_of(request: Request) -> str | None:
    """Who made a change: the token's subject."""
    user = request.user
    return user.subject if isinstance(user, Principal) else None


def lifecycle_routes(service: SchedulerService) -> list[BaseRoute]:
    """Cancel (by id, by key) and history, bound to ``service``'s database and clock."""

    def answer(result: CancelResult) -> Response:
        if result.outcome == "missing":
            raise HTTPException(404, "no scheduled event with that id or key")
        if result.outcome == "dispatched":
            conflict = CancelConflictOut(detail="already dispatched: a dispatched event cannot be cancelled",
                                         event=ScheduledEventOut.model_validate(result.row))
            return respond(conflict, 409)
        return respond(ScheduledEventOut.model_validate(result.row))

    async def cancel(request: Request, **row: str | None) -> Response:
        result = await run_in_threadpool(
            partial(cancel_event, service.sessions, now=service.clock.now(), actor=actor_of(request), **row)
        )
        return answer(result)

    @require("ingest")
    @declares()
    async def cancel_by_id(request: Request) -> Response:
        """Cancel a pending or failed row (200 with the row; 409 once dispatched)."""
        return await cancel(request, event_id=text_param("event_id", str(request.path_params["event_id"])))

    @require("ingest")
    @declares()
    async def cancel_by_key(request: Request) -> Response:
        """Cancel the row of an external key, as cancel_by_id does."""
        return await cancel(
            request, external_key=text_param("external_key", str(request.path_params["external_key"]))
        )

    @require("admin")
    @declares()
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
