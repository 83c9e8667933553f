"""The open routes: liveness, the loop's health, and the OpenAPI document.

``HealthRoutes`` receives the loop, the clock, the LISTEN connection and the settings it
reports on, whether the loop task runs (``loop_alive``), and the mounted routes (for
``/openapi.json``): nothing else of the service.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from scheduler.config import Settings
from scheduler.core.clock import clock_details
from scheduler.core.loop import Scheduler
from scheduler.database.listener import Listener
from scheduler.types import Clock, SchedulerMode
from scheduler.web.http import respond
from scheduler.web.openapi import openapi_document
from scheduler.web.schemas import HealthOut, SchedulerHealthOut


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class HealthRoutes:
    """``/health``, ``/health/scheduler`` and ``/openapi.json``."""

    def __init__(self, *, scheduler: Scheduler, clock: Clock, listener: Listener, settings: Settings,
                 loop_alive: Callable[[], bool], mounted: Callable[[], Sequence[BaseRoute]]) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.listener = listener
        self.settings = settings
        self.loop_alive = loop_alive
        self.mounted = mounted

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/health/scheduler", self.scheduler_health, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"], include_in_schema=False),
        ]

    async def health(self, request: Request) -> Response:
        return respond(HealthOut(status="ok"))

    async def scheduler_health(self, request: Request) -> Response:
        """Liveness of the loop: 503 once the task has exited, its last poll failed (the
        error is in ``last_error``), or polls have stopped; 200 again after a good poll."""
        snapshot: dict[str, Any] = self.scheduler.health.snapshot()
        alive = self.loop_alive()
        snapshot["running"] = alive
        stale = self.scheduler.is_stale(self.clock.now())
        snapshot["stale"] = stale
        snapshot["poll_seconds"] = self.scheduler.poll_seconds
        snapshot["mode"] = str(self.scheduler.mode)
        snapshot["wakeups"] = self.wakeups()
        snapshot["clock"] = clock_details(self.clock)
        healthy = alive and not stale and self.scheduler.health.consecutive_failures == 0
        return respond(SchedulerHealthOut.model_validate(snapshot), 200 if healthy else 503)

    def wakeups(self) -> dict[str, Any]:
        """How this replica's loop is woken: on its interval only (literal), by LISTEN, or
        by timed wake-ups where LISTEN is unavailable (with the reason)."""
        if self.scheduler.mode is SchedulerMode.LITERAL:
            return {"by": "interval"}
        if not self.settings.listen:
            return {"by": "timer", "reason": "SCHEDULER_LISTEN is false"}
        if self.listener.available:
            return {"by": "listen", "next_wake_at": _iso(self.scheduler.waiting_until)}
        return {"by": "timer", "reason": self.listener.reason, "next_wake_at": _iso(self.scheduler.waiting_until)}

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document; under a mount (or ``--root-path``) its ``servers`` entry
        names the prefix, so clients call the mounted URLs."""
        return JSONResponse(openapi_document(self.mounted(), root_path=request.scope.get("root_path", "")))
