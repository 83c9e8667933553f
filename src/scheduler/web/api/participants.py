"""The operators' routes about participants: their notifications and their preferences.

``ParticipantRoutes`` receives the database, the clock and the body limit.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from scheduler.application import deliveries, participants
from scheduler.application.commands import Actor
from scheduler.database.database import Database
from scheduler.nudging.local_time import (
    LocalTimeError,
    QuietHours,
    parse_quiet_hours,
    parse_time_zone,
)
from scheduler.types import Clock, DeliveryRowStatus, NotificationStatus
from scheduler.web.http.answers import DeliveryOut, NotificationOut, PreferencesOut, respond
from scheduler.web.http.auth import require
from scheduler.web.http.bodies import PreferencesIn, parse_body, read_json
from scheduler.web.http.params import Param, Unprocessable, declares, path_param, query


class ParticipantRoutes:
    """``GET /admin/notifications``, ``GET /admin/deliveries``, ``POST
    /admin/deliveries/{delivery_id}/retry`` and ``GET``/``PUT
    /admin/participants/{user_id}/preferences``."""

    def __init__(self, *, database: Database, clock: Clock, max_body_bytes: int) -> None:
        self.database = database
        self.clock = clock
        self.max_body_bytes = max_body_bytes

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/admin/notifications", self.list_notifications, methods=["GET"]),
            Route("/admin/deliveries", self.list_deliveries, methods=["GET"]),
            Route("/admin/deliveries/{delivery_id}/retry", self.retry_delivery, methods=["POST"]),
            Route("/admin/participants/{user_id}/preferences", self.set_preferences, methods=["PUT"]),
            Route("/admin/participants/{user_id}/preferences", self.get_preferences, methods=["GET"]),
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
    async def retry_delivery(self, request: Request) -> Response:
        """Queue a retrying or undeliverable delivery again, now (OUTBOX-10); audited with the
        token's subject. 404: no such delivery; 409: not retryable (queued, delivered, an in-app
        row, or being sent right now)."""
        delivery_id = deliveries.delivery_id_of(path_param(request, "delivery_id"))
        actor = Actor(request.user.display_name, "api")
        done = await run_in_threadpool(
            lambda: deliveries.retry_delivery(self.database, delivery_id, now=self.clock.now(), actor=actor))
        if done.outcome == "missing":
            raise HTTPException(404, "no delivery with that id")
        if done.outcome == "not_retryable":
            status = done.delivery["status"] if done.delivery else "?"
            raise HTTPException(409, f"the delivery is {status}: only a retrying or undeliverable delivery that "
                                     "no worker is sending right now can be retried")
        return respond(DeliveryOut.model_validate(done.delivery))

    @require("admin")
    @declares()
    async def set_preferences(self, request: Request) -> Response:
        user_id = path_param(request, "user_id")
        body = parse_body(PreferencesIn, await read_json(request, self.max_body_bytes))
        zone, quiet = local_time_of(body)
        row = await run_in_threadpool(
            participants.set_preferences,
            self.database,
            user_id,
            enabled_kinds=body.enabled_kinds,
            max_per_day=body.max_per_day,
            now=self.clock.now(),
            time_zone=zone,
            quiet_hours=quiet,
        )
        return respond(PreferencesOut.model_validate(row))

    @require("admin")
    @declares()
    async def get_preferences(self, request: Request) -> Response:
        """A participant's preferences: the defaults when none were set."""
        user_id = path_param(request, "user_id")
        row = await run_in_threadpool(participants.get_preferences, self.database, user_id)
        return respond(PreferencesOut.model_validate(row))


def local_time_of(body: PreferencesIn) -> tuple[str, QuietHours | None]:
    """The body's zone name and quiet hours, parsed strictly (LOCAL-1, LOCAL-2): every problem
    a 422 naming its field (``time_zone``, ``quiet_hours.start``), in the shape of every 422."""
    errors: list[dict[str, str]] = []
    zone = quiet = None
    try:
        zone = parse_time_zone(body.time_zone).key
    except LocalTimeError as exc:
        errors.extend(exc.errors)
    try:
        quiet = parse_quiet_hours(body.quiet_hours)
    except LocalTimeError as exc:
        errors.extend(exc.errors)
    if errors or zone is None:
        raise Unprocessable(errors, "invalid body: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors))
    return zone, quiet
