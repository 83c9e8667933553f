"""The open routes: liveness, the loop's health, and the OpenAPI document.

``HealthRoutes`` receives the loop, the clock, the LISTEN connection and the settings it
reports on, whether the loop task runs (``loop_alive``) and whether this process runs one at
all (``run_scheduler``), and the mounted routes (for ``/openapi.json``): nothing else of
the service.

The loop's health is told twice: ``GET /health/scheduler`` is open (load
balancers and uptime checks call it without a token), so it says whether this replica's
loop is healthy and why, in words an operator can act on (``state``: running, stale,
failing, stopped; ``reason``), with counters and times, and never error text: a database
error names the host, the user and the database. ``GET /admin/health/scheduler`` (admin)
adds ``last_error`` and the listener's own words. Both answer 503 when the loop is not
healthy, 200 again after a good poll. A running loop whose outbox has a delivery due and
unsent for longer than ``SCHEDULER_DELIVERY_STALE_SECONDS`` is ``degraded`` (HEALTH-4): still
200, since the outbox is every replica's (``operations.outbox_health``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from scheduler.config import Settings
from scheduler.core.clock import clock_details
from scheduler.core.loop import Scheduler
from scheduler.database.listener import Listener
from scheduler.operations.outbox_health import OutboxHealth
from scheduler.types import Clock, SchedulerMode
from scheduler.web.api.openapi import openapi_document
from scheduler.web.http.answers import (
    HealthOut,
    SchedulerHealthDetailOut,
    SchedulerHealthOut,
    respond,
)
from scheduler.web.http.auth import require
from scheduler.web.http.params import declares

if TYPE_CHECKING:
    from scheduler.nudging.facts import FactsContract

State = Literal["running", "degraded", "stale", "failing", "stopped"]
DETAILS = "GET /admin/health/scheduler (admin) has the error"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class HealthRoutes:
    """``/health``, ``/health/scheduler``, ``/admin/health/scheduler`` and ``/openapi.json``."""

    def __init__(self, *, scheduler: Scheduler, clock: Clock, listener: Listener, settings: Settings,
                 loop_alive: Callable[[], bool], mounted: Callable[[], Sequence[BaseRoute]],
                 run_scheduler: Callable[[], bool] = lambda: True,
                 facts_contract: FactsContract | None = None, outbox: OutboxHealth | None = None) -> None:
        self.scheduler = scheduler
        self.facts_contract = facts_contract  # what the document describes facts by (DEC-FACTS-CONTRACT)
        self.outbox = outbox
        self.clock = clock
        self.listener = listener
        self.settings = settings
        self.loop_alive = loop_alive
        self.mounted = mounted
        self.run_scheduler = run_scheduler

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/health/scheduler", self.scheduler_health, methods=["GET"]),
            Route("/admin/health/scheduler", self.scheduler_health_details, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"], include_in_schema=False),
        ]

    @declares()
    async def health(self, request: Request) -> Response:
        return respond(HealthOut(status="ok"))

    @declares()
    async def scheduler_health(self, request: Request) -> Response:
        """Is the loop healthy, and why (words, counters, times; no error text)."""
        snapshot = self.details(await self._overdue())
        return respond(SchedulerHealthOut.model_validate(public(snapshot)), _status(snapshot))

    @require("admin")
    @declares()
    async def scheduler_health_details(self, request: Request) -> Response:
        """The same, with ``last_error`` and the listener's reason in full."""
        snapshot = self.details(await self._overdue())
        return respond(SchedulerHealthDetailOut.model_validate(snapshot), _status(snapshot))

    async def _overdue(self) -> float | None:
        outbox = self.outbox
        return None if outbox is None else await run_in_threadpool(outbox.overdue_seconds)

    def details(self, overdue: float | None = None) -> dict[str, Any]:
        """Everything the loop reports, ``last_error`` included (the admin view); ``overdue``:
        how long the outbox's longest-due delivery has waited (None: not read)."""
        scheduler = self.scheduler
        snapshot: dict[str, Any] = scheduler.health.snapshot()
        snapshot["running"] = self.loop_alive()
        snapshot["stale"] = scheduler.is_stale(self.clock.now())
        snapshot["poll_seconds"] = scheduler.poll_seconds
        snapshot["mode"] = str(scheduler.mode)
        snapshot["wakeups"] = self.wakeups()
        snapshot["clock"] = clock_details(self.clock)
        snapshot["oldest_due_delivery_seconds"] = overdue
        snapshot["state"], snapshot["reason"] = self.judge(snapshot)
        snapshot["status"] = {"running": "healthy", "degraded": "degraded"}.get(snapshot["state"], "unhealthy")
        return snapshot

    def judge(self, snapshot: dict[str, Any]) -> tuple[State, str]:
        """The state an operator acts on, and why, in words without error text."""
        seconds = f"{snapshot['poll_seconds']:g} s"
        if not snapshot["running"]:
            if not self.run_scheduler():
                return "stopped", ("this process runs no polling loop "
                                   "(SCHEDULER_ENABLED=false or an embedding without one)")
            if snapshot["started_at"] is None:
                return "stopped", "the polling loop has not started yet"
            return "stopped", "the polling loop has exited: reminders wait until this process restarts (see its log)"
        failures = snapshot["consecutive_failures"]
        if failures:
            return "failing", (f"the last {failures} poll(s) failed, usually the database unreachable or timing out; "
                               f"the loop retries every {seconds} and turns healthy after a good poll; {DETAILS}")
        if snapshot["stale"]:
            return "stale", (f"no poll completed in three intervals ({seconds} each): the loop or the database "
                             "is stuck or very slow")
        overdue = snapshot.get("oldest_due_delivery_seconds")
        if self.outbox is not None and self.outbox.stale(overdue):
            return "degraded", (f"polling every {seconds}, but a delivery has been due and unsent for {overdue:.0f} s, "
                                f"longer than SCHEDULER_DELIVERY_STALE_SECONDS ({self.outbox.stale_seconds:g} s): "
                                "the delivery workers are stopped or behind, or a provider is down; see "
                                "GET /admin/deliveries and the console's Deliveries page")
        return "running", f"polling every {seconds} ({snapshot['mode']} mode)"

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

    @declares()
    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document; under a mount (or ``--root-path``) its ``servers`` entry
        names the prefix, so clients call the mounted URLs."""
        return JSONResponse(openapi_document(self.mounted(), root_path=request.scope.get("root_path", ""),
                                             facts_contract=self.facts_contract))


def public(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The open view: no error text anywhere (the listener's reason keeps its first words)."""
    shown = {k: v for k, v in snapshot.items() if k != "last_error"}
    reason = shown["wakeups"].get("reason")
    if reason:
        head, sep, _ = reason.partition(": ")  # "connection lost: OperationalError: ... host=..."
        shown["wakeups"] = {**shown["wakeups"], "reason": head + (f" ({DETAILS})" if sep else "")}
    return shown


def _status(snapshot: dict[str, Any]) -> int:
    return 200 if snapshot["state"] in ("running", "degraded") else 503
