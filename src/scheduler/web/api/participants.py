"""The operators' routes about participants: their notifications and their preferences.

``ParticipantRoutes`` receives the database, the clock and the body limit.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import participants
from scheduler.database.database import Database
from scheduler.types import Clock, DeliveryRowStatus, NotificationStatus
from scheduler.web.http.auth import require
from scheduler.web.http.params import Param, declares, query
from scheduler.web.http.plumbing import parse_body, path_param, read_json, respond
from scheduler.web.http.schemas import DeliveryOut, NotificationOut, PreferencesIn, PreferencesOut


class ParticipantRoutes:
    """``GET /admin/notifications``, ``GET /admin/deliveries`` and ``PUT /admin/participants/{user_id}/preferences``."""

    def __init__(self, *, database: Database, clock: Clock, max_body_bytes: int) -> None:
        self.database = database
        self.clock = clock
        self.max_body_bytes = max_body_bytes

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/admin/notifications", self.list_notifications, methods=["GET"]),
            Route("/admin/deliveries", self.list_deliveries, methods=["GET"]),
            Route("/admin/participants/{user_id}/preferences", self.set_preferences, methods=["PUT"]),
        ]

    @require("admin")
    @declares(user_id=Param.string(), status=Param.enum(NotificationStatus),
              limit=Param.integer(1, 1000, default=100, description="at most this many rows"))
    async def list_notifications(self, request: Request) -> Response:
        q = query(request)
        rows = await run_in_threadpool(
            participants.list_notifications,
            self.database,
            user_id=q["user_id"],
            status=q["status"],
            limit=q["limit"],
        )
        return respond([NotificationOut.model_validate(r) for r in rows])

    @require("admin")
    @declares(status=Param.enum(DeliveryRowStatus), channel=Param.string(max_length=32),
              user_id=Param.string(), notification_id=Param.string(max_length=64),
              limit=Param.integer(1, 1000, default=100, description="at most this many rows"))
    async def list_deliveries(self, request: Request) -> Response:
        """The delivery log and the outbox, newest first (OUTBOX-6)."""
        q = query(request)
        rows = await run_in_threadpool(
            participants.list_deliveries, self.database, status=q["status"], channel=q["channel"],
            user_id=q["user_id"], notification_id=q["notification_id"], limit=q["limit"])
        return respond([DeliveryOut.model_validate(r) for r in rows])

    @require("admin")
    @declares()
    async def set_preferences(self, request: Request) -> Response:
        user_id = path_param(request, "user_id")
        body = parse_body(PreferencesIn, await read_json(request, self.max_body_bytes))
        row = await run_in_threadpool(
            participants.set_preferences,
            self.database,
            user_id,
            enabled_kinds=body.enabled_kinds,
            max_per_day=body.max_per_day,
            now=self.clock.now(),
        )
        return respond(PreferencesOut.model_validate(row))
